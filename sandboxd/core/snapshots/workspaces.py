"""How the snapshot code reaches a sandbox's workspace: helper commands run
in it (or in one of its sessions), tar streams out of it, listings through
it, and the host-side view where the backend offers one."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import re
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from sandboxd.backends.base import (
    ROOT_USER,
    WORKSPACE,
    ExecOutcome,
    ExecResult,
    ExecSpec,
    HostWorkspaces,
    OutputChunk,
    RootUser,
    SandboxUsers,
)
from sandboxd.backends.hostfs import HostWorkspace
from sandboxd.backends.hostread import unreadable
from sandboxd.backends.snapshot_shell import (
    LIST_SCRIPT,
    RECORDS_SCRIPT,
    SESSION_STATE_SCRIPT,
    STATE_SCRIPT,
    SUBLIST_SCRIPT,
    TAR_SCRIPT,
    delta_script,
)
from sandboxd.core.lifecycle import SandboxRecord
from sandboxd.core.snapshots import owners
from sandboxd.core.snapshots.journal import Journal
from sandboxd.core.snapshots.listing import (
    KINDS,
    SANDBOX_OWNER,
    Baseline,
    Listed,
    Owner,
    parse_delta,
    parse_listing,
    parse_session_state,
    recorded,
)
from sandboxd.core.snapshots.manifest import ROOT_UID, Entry, shown
from sandboxd.core.snapshots.mapped import MAPS_TRAILER, split_maps
from sandboxd.core.snapshots.reading import Prefetch, once
from sandboxd.errors import BackendError, FailedPrecondition, NotFound, SandboxdError
from sandboxd.settings import SnapshotSettings

if TYPE_CHECKING:
    from sandboxd.core.control import ControlPlane

# Change sets up to this size are read through the session (no exec start).
SESSION_TAR_BYTES = 8 << 20


class Workspaces:
    """A sandbox's workspace as the snapshot code reads and writes it."""

    def __init__(self, control: ControlPlane, settings: SnapshotSettings) -> None:
        self._control = control
        self._settings = settings

    async def run(
        self, rec: SandboxRecord, script: str, *, session: str = "", stdin: bytes = b"", user: str = ""
    ) -> bytes:
        """The stdout of a helper command (in ``session`` if given; as
        ``user``, "" or ROOT_USER, one-shot); BackendError unless it exits 0."""
        spec = ExecSpec(
            shell=script,
            cwd="" if session else WORKSPACE,
            timeout=self._settings.exec_timeout_seconds,
            stdin=stdin,
            output_limit=self._control.settings.exec.max_output_bytes,
            session=session,
            user=user,
        )
        out: list[bytes] = []
        err: list[bytes] = []
        result: ExecResult | None = None
        async for event in self._control.exec(rec, spec):
            if isinstance(event, OutputChunk):
                (out if event.stream == 1 else err).append(event.data)
            else:
                result = event
        if result is None or result.outcome is not ExecOutcome.EXITED or result.exit_code != 0:
            what = "no result" if result is None else f"{result.outcome.name} {result.exit_code}"
            detail = b"".join(err).decode(errors="replace").strip()[:500] or (result.detail if result else "")
            raise BackendError(f"snapshot helper command failed in {rec.sandbox_id} ({what}): {detail}")
        return b"".join(out)

    def owner(self, rec: SandboxRecord) -> Owner:
        """The (uid, gid) the sandbox's user has (a snapshot records it as SANDBOX_UID)."""
        backend = self._control.backend
        if isinstance(backend, SandboxUsers):
            try:
                return backend.sandbox_user(rec.handle)
            except NotFound as e:
                raise FailedPrecondition(f"sandbox {rec.sandbox_id} is gone: {e}") from e
        return SANDBOX_OWNER

    async def host_view(self, rec: SandboxRecord) -> HostWorkspace | None:
        """The workspace as the host sees it, where the backend offers that (the caller closes it)."""
        backend = self._control.backend
        if not isinstance(backend, HostWorkspaces):
            return None
        try:
            return await backend.host_workspace(rec.handle)
        except SandboxdError:
            return None

    async def session_state(self, rec: SandboxRecord, session: str) -> tuple[str, dict[str, str]]:
        """(cwd, exported environment) of ``session``; empty without one."""
        if not session:
            return "", {}
        cwd, env, _ = parse_session_state(await self.run(rec, SESSION_STATE_SCRIPT, session=session))
        return cwd, env

    async def list_in_place(
        self, view: HostWorkspace, journal: Journal | None = None, sandbox: Owner = SANDBOX_OWNER
    ) -> tuple[float, list[Listed]]:
        """(listing time, entries): the workspace walked from the host (and
        ``journal`` set to watch every directory as it is walked); owners as
        ``recorded`` maps them for ``sandbox``."""
        when, records = await asyncio.to_thread(view.walk, journal.watch if journal else None)
        return when, [recorded(Listed(*r), sandbox) for r in records]

    async def list_through(
        self, rec: SandboxRecord, baseline: Baseline | None, session: str, mapped: set[str] | None = None
    ) -> tuple[str, dict[str, str], float, list[Listed], dict[str, Entry], Prefetch | None]:
        """The same through commands in the sandbox: a delta listing against
        ``baseline`` where it has one; the first snapshot of a large workspace
        starts its tar stream (returned) while the listing runs. ``mapped``
        gets the files the sandbox user's processes have mapped shared and
        writable (sandboxd.core.snapshots.mapped); those, and the baseline's,
        are listed whatever their ctime says."""
        prefetch: Prefetch | None = None
        if baseline is None and await self.large(rec):
            prefetch = Prefetch(self.get_tar(rec, (".",)))
        try:
            delta = baseline is not None and baseline.entries is not None
            script = STATE_SCRIPT if session else LIST_SCRIPT
            if delta:
                assert baseline is not None
                script = delta_script(baseline.since, session=bool(session))
            cwd, env = "", dict[str, str]()
            raw, found = split_maps(await self.run(rec, script + MAPS_TRAILER, session=session))
            if mapped is not None:
                mapped |= found
            if session:
                cwd, env, raw = parse_session_state(raw)
            carried: dict[str, Entry] = {}
            denied: list[str] = []
            if delta:
                assert baseline is not None
                recheck = found | (baseline.mapped if baseline.mapped is not None else frozenset())
                when, listing, carried = await self._merge_delta(rec, baseline, raw, denied, recheck)
            else:
                when, listing = parse_listing(raw, self.owner(rec), denied)
            if denied:
                listing += await self._list_denied(rec, denied)
            # Refused before anything is read, as the in-place path refuses it.
            owners.refuse_unreadable(
                [
                    *carried.values(),
                    *(
                        Entry(i.path, KINDS[i.kind], i.mode & 0o1777, uid=i.uid, gid=i.gid)
                        for i in listing
                        if i.kind in KINDS
                    ),
                ]
            )
            if prefetch is not None and (denied or any(i.uid == ROOT_UID for i in listing)):
                # A tar of everything as the sandbox user would meet root's closed directories.
                await prefetch.close()
                prefetch = None
        except BaseException:
            if prefetch is not None:
                await prefetch.close()
            raise
        return cwd, env, when, listing, carried, prefetch

    async def _list_denied(self, rec: SandboxRecord, denied: list[str]) -> list[Listed]:
        """What lies below ``denied`` (directories the sandbox user may not
        list), listed by root, and below what root may not list by the
        sandbox user again, until neither gets further: a directory that
        both are denied stays unlisted (refused later, named, as the in-place
        path refuses it: its owner could not list it)."""
        sandbox = self.owner(rec)
        root = isinstance(self._control.backend, RootUser)
        tried: dict[str, set[str]] = {"": set(denied), ROOT_USER: set()}
        out: list[Listed] = []
        todo, user = denied, ROOT_USER
        while todo and (root or user != ROOT_USER):
            stdin = b"".join(b"./" + d.encode("utf-8", "surrogateescape") + b"\0" for d in todo)
            more: list[str] = []
            raw = await self.run(rec, SUBLIST_SCRIPT, stdin=stdin, user=user)
            _, found = parse_listing(raw, sandbox, more)
            out += found
            tried[user].update(todo)
            user = "" if user == ROOT_USER else ROOT_USER
            todo = [d for d in more if d not in tried[user]]
        return out

    async def _merge_delta(
        self,
        rec: SandboxRecord,
        baseline: Baseline,
        raw: bytes,
        denied: list[str],
        recheck: frozenset[str] = frozenset(),
    ) -> tuple[float, list[Listed], dict[str, Entry]]:
        """(listing time, entries to look at, entries carried over unchanged)
        from a delta listing: what exists is what it names; what changed
        comes with a record; a named path that is new but has no record (it
        lies in a directory moved in), or in ``recheck`` (a write through a
        mapping moves no ctime), is listed on its own."""
        assert baseline.entries is not None
        sandbox = self.owner(rec)
        when, changed, names = parse_delta(raw, sandbox, denied)
        present = set(names)
        listing = [c for c in changed if c.path in present]
        seen = {c.path for c in listing}
        carried = {
            p: e for p, e in baseline.entries.items() if p in present and p not in seen and p not in recheck
        }
        unknown = [n for n in names if n not in seen and n not in carried]
        if unknown:
            stdin = b"".join(n.encode("utf-8", "surrogateescape") + b"\x00" for n in unknown)
            _, more = parse_listing(await self.run(rec, RECORDS_SCRIPT, stdin=stdin), sandbox)
            listing += more
        return when, listing, carried

    async def content_streams(
        self, rec: SandboxRecord, need: dict[str, Listed], session: str, prefetch: Prefetch | None
    ) -> list[AsyncIterator[bytes]]:
        """Tar streams holding the files of ``need``, each read by its owner:
        the sandbox user's through ``prefetch`` where there is one, else
        through ``session`` when small, else by a tar command of its own;
        root's by root (FailedPrecondition on a backend without it). Names
        travel on stdin, as bytes (an argument must be text)."""
        if prefetch is not None:
            return [prefetch.chunks()]
        rooted = {p: i for p, i in need.items() if i.uid == ROOT_UID}
        own = {p: i for p, i in need.items() if i.uid != ROOT_UID}
        streams: list[AsyncIterator[bytes]] = []
        if own and session and sum(i.size + 1024 for i in own.values()) <= SESSION_TAR_BYTES:
            streams.append(once(await self.run(rec, TAR_SCRIPT, session=session, stdin=_names(own))))
        elif own:
            streams.append(self.tar_named(rec, own))
        if rooted:
            if not isinstance(self._control.backend, RootUser):
                raise FailedPrecondition(
                    f"{WORKSPACE}/{shown(min(rooted))[1:-1]} is root's, and this backend cannot read as "
                    "root in the sandbox"
                )
            streams.append(self.tar_named(rec, rooted, ROOT_USER))
        return streams

    async def tar_named(
        self, rec: SandboxRecord, files: dict[str, Listed], user: str = ""
    ) -> AsyncIterator[bytes]:
        """A tar of ``files`` (relative paths) read by one command as
        ``user`` ("" or ROOT_USER), streamed as it runs; FailedPrecondition
        if one vanished on the way (the workspace changed while it was read)."""
        # Room for every file at its listed size, its headers, and growth meanwhile.
        budget = 2 * sum(i.size + 1536 for i in files.values()) + (1 << 20)
        spec = ExecSpec(
            shell=TAR_SCRIPT,
            cwd=WORKSPACE,
            timeout=self._settings.exec_timeout_seconds,
            stdin=_names(files),
            output_limit=budget,
            user=user,
        )
        err = bytearray()
        result: ExecResult | None = None
        async for event in self._control.exec(rec, spec):
            if isinstance(event, OutputChunk):
                if event.stream == 1:
                    yield event.data
                elif len(err) < 8192:
                    err += event.data
            else:
                result = event
        if result is not None and result.outcome is ExecOutcome.EXITED and result.exit_code == 0:
            return
        detail = err.decode(errors="replace").strip()[:500] or (result.detail if result else "no result")
        _raise_leased(detail)
        if "No such file or directory" in detail:
            raise FailedPrecondition(
                f"the workspace of {rec.sandbox_id} changed while it was being snapshotted ({detail}); retry"
            )
        raise BackendError(f"reading files of {rec.sandbox_id} failed: {detail}")

    async def large(self, rec: SandboxRecord) -> bool:
        """Whether the workspace holds more than a session read carries
        (a host-side reading; False where the backend cannot tell)."""
        try:
            usage = await self._control.backend.usage(rec.handle)
        except SandboxdError:
            return False
        return usage.disk_bytes > SESSION_TAR_BYTES

    async def get_tar(
        self, rec: SandboxRecord, paths: tuple[str, ...], user: str = ""
    ) -> AsyncIterator[bytes]:
        """A tar stream of ``paths`` of the workspace (read as ``user``: ""
        or ROOT_USER); FailedPrecondition if one vanished on the way (the
        workspace changed while it was read)."""
        backend = self._control.backend
        if user:
            assert isinstance(backend, RootUser)
            stream = backend.get_tar_as(rec.handle, WORKSPACE, paths, user)
        else:
            stream = backend.get_tar(rec.handle, WORKSPACE, paths)
        try:
            async for chunk in stream:
                yield chunk
        except (NotFound, BackendError) as e:
            _raise_leased(str(e))
            # tar names a listed file that vanished before it got there.
            if isinstance(e, BackendError) and "No such file or directory" not in str(e):
                raise
            raise FailedPrecondition(
                f"the workspace of {rec.sandbox_id} changed while it was being snapshotted ({e}); retry"
            ) from e
        finally:
            with contextlib.suppress(Exception):
                await stream.aclose()  # type: ignore[attr-defined]


def _names(files: dict[str, Listed]) -> bytes:
    """The names of ``files``, sorted, NUL-terminated, as bytes."""
    return b"".join(p.encode("utf-8", "surrogateescape") + b"\0" for p in sorted(files))


# tar opens files without blocking: one under a write lease answers EAGAIN,
# as it does to the in-place reader, and is refused in the same words.
_LEASED = re.compile(r"tar: (.+?): Cannot open: Resource temporarily unavailable")


def _raise_leased(detail: str) -> None:
    """Raises the in-place path's refusal for a file tar could not open because of a lease."""
    found = _LEASED.search(detail)
    if found is not None:
        raise unreadable(found.group(1).removeprefix("./"), OSError(errno.EAGAIN, "leased"))
