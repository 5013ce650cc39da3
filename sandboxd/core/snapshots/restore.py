"""Restore and fork: a snapshot put into n fresh warm sandboxes.

The manifest is resolved and checked (paths, kinds, modes, symlink targets)
and sized against the target pool's limits; blobs are read and verified
against their digests and a tar is built, all *before* any sandbox is
touched. Then n warm sandboxes are leased under one lease, and in each one
command of the session extracts the tar (handed over as a file where the
backend can, so a fork of n does not push it n times through the engine),
re-applies modes a non-root extraction loses and sets cwd and environment.
Any failure releases (destroys) every sandbox of the lease. An archive too
large to build in memory is written to a file (the staging directory, or a
temporary one) and streamed from it in pieces.

Entries keep their recorded owners: a snapshot with root's files (a grader)
is restored in rounds by the sandbox's user and its root, each creating what
it owns (sandboxd.core.snapshots.owners), on a backend that runs commands as
root; anywhere else it is refused, as giving them to the sandbox user would
hand the policy the grader.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

from sandboxd.backends.base import ROOT_USER, WORKSPACE, RootUser, StagedTars
from sandboxd.backends.snapshot_shell import owned_round_script, restore_script
from sandboxd.core import validation as v
from sandboxd.core.leases import Lease
from sandboxd.core.lifecycle import SandboxRecord
from sandboxd.core.snapshots import manifest as mf
from sandboxd.core.snapshots import owners, sizes
from sandboxd.core.snapshots.baselines import Baselines
from sandboxd.core.snapshots.catalog import SnapshotCatalog
from sandboxd.core.snapshots.gc import Pins
from sandboxd.core.snapshots.info import SnapshotInfo
from sandboxd.core.snapshots.journal import Journal
from sandboxd.core.snapshots.lineage import lineage_labels
from sandboxd.core.snapshots.listing import DELTA_SLACK, Baseline
from sandboxd.core.snapshots.manifest import DIR, FILE, Entry, UnsafeSnapshot
from sandboxd.core.snapshots.packs import blob_key, tenant_namespace
from sandboxd.core.snapshots.sizes import human
from sandboxd.core.snapshots.tars import Tars
from sandboxd.core.snapshots.workspaces import Workspaces
from sandboxd.errors import BackendError, FailedPrecondition, InvalidArgument, NotFound, SandboxdError

if TYPE_CHECKING:
    from sandboxd.core.control import ControlPlane
    from sandboxd.core.pools import WarmPool


def restore_target(
    control: ControlPlane,
    info: SnapshotInfo,
    n: int,
    pool: str,
    labels: dict[str, str] | None,
    by_image: bool = False,
) -> tuple[int, dict[str, str], WarmPool]:
    """A restore's checked inputs, for file and live snapshots alike: the
    count (0 = 1), the labels, and the target pool (the snapshot's by
    default), which must run the snapshot's image, or, ``by_image`` (a
    restore that leases by image), serve it among its images."""
    n = n or 1
    if n < 1:
        raise InvalidArgument("n", f"must be >= 1, got {n}")
    checked = v.labels("labels", labels or {})
    target = control.get_pool(pool or info.pool, "pool")
    if target.config.image != info.image and not (by_image and target.config.serves(info.image)):
        raise FailedPrecondition(
            f"snapshot {info.id} was taken on image {info.image!r}; pool {pool or info.pool!r} runs "
            f"{target.config.image!r}"
        )
    return n, checked, target


# Archives above this are handed to a backend that can take files as a file;
# smaller ones already travel cheaply through a sandbox shell's stdin.
_STAGE_MIN_BYTES = 64 << 10


class Restore:
    """Restores snapshots into freshly leased sandboxes, all or none."""

    def __init__(
        self,
        control: ControlPlane,
        catalog: SnapshotCatalog,
        tars: Tars,
        workspaces: Workspaces,
        baselines: Baselines,
        pins: Pins,
    ) -> None:
        self._control = control
        self._catalog = catalog
        self._tars = tars
        self._workspaces = workspaces
        self._baselines = baselines
        self._pins = pins

    async def restore(
        self,
        info: SnapshotInfo,
        *,
        n: int = 1,
        pool: str = "",
        labels: dict[str, str] | None = None,
        ttl: float = 0.0,
        timeout: float = 0.0,
        call_remaining: float | None = None,
        network: tuple[str, ...] = (),
        request_id: str = "",
    ) -> tuple[Lease, list[SandboxRecord], SnapshotInfo]:
        """Leases ``n`` sandboxes of ``pool`` (the snapshot's by default),
        under ``network`` rules narrower than the pool's when given, and
        restores ``info`` into each; on any failure none stays leased."""
        n, labels, target = restore_target(self._control, info, n, pool, labels, by_image=True)
        # A snapshot of a per-task image's sandbox restores into one of that image.
        image = "" if info.image == target.config.image else info.image
        try:
            resolved = await self._catalog.entries(info.id)
        except UnsafeSnapshot as e:
            raise UnsafeSnapshot(f"snapshot {info.id} is unsafe and was not restored: {e}") from e
        if resolved is None:
            raise NotFound(f"snapshot {info.id!r} not found (deleted, expired or never taken)")
        entries = _checked(info, sorted(resolved.values(), key=lambda e: e.path))
        inodes, size = mf.footprint(entries)
        limits = target.config.limits
        if limits.max_files and inodes > limits.max_files:
            raise FailedPrecondition(
                f"snapshot {info.id} has {inodes - 1} entries; pool {target.config.name!r} sandboxes hold "
                f"at most {limits.max_files - 1}"
            )
        if limits.disk_bytes and size > limits.disk_bytes:
            largest = max((e for e in entries if e.kind == FILE), key=lambda e: e.size, default=None)
            which = f" (largest: {largest.path!r}, {largest.size} bytes)" if largest is not None else ""
            raise FailedPrecondition(
                f"snapshot {info.id} needs {size} bytes ({human(size)}) of workspace, its files written "
                f"whole{which}; sandboxes of pool {target.config.name!r} have {limits.disk_bytes} bytes "
                f"({human(limits.disk_bytes)})"
            )
        owned = owners.needs_rounds(entries)
        if owned and not isinstance(self._control.backend, RootUser):
            root = next(e for e in entries if owners.actor_of(e) == owners.ROOT)
            raise FailedPrecondition(
                f"snapshot {info.id} holds entries owned by root ({mf.shown(root.path)} among them); this "
                "backend cannot run a restore as root, and giving them to the sandbox user would let it "
                "change them"
            )
        ns = tenant_namespace(info.tenant)
        pinned = await self._pins.pin(blob_key(ns, e.digest) for e in entries if e.kind == FILE and e.size)
        staged = None if owned else self._stage_path(size)
        spooled: Path | None = None
        rounds: list[tuple[str, bytes, bool]] | None = None
        if staged is None and not owned and self._tars.streamed(entries):
            # Too large to build in memory, and no staging directory: a file
            # of our own, streamed to each target.
            spooled = Path(tempfile.gettempdir()) / f"sandboxd-restore-{secrets.token_hex(8)}.tar"
        try:
            if not await self._catalog.exists(info.id):
                raise NotFound(f"snapshot {info.id!r} not found (deleted while restoring)")
            tar: bytes | None = None
            if owned:
                rounds = await self._rounds(info, entries, ns)
            else:
                tar = await self._tars.tar(info, entries, ns, to=staged or spooled)
            if tar is not None and staged is not None:
                await asyncio.to_thread(_write_file, staged, tar)
            lineage = lineage_labels(info)
            # Refills of the warm buffer this acquire drains wait until the
            # archive is extracted: on a small host they would take its CPU.
            # Until they answer, a snapshot of the targets is refused (it would see a workspace half written).
            with self._control.reconciler.urgent(), self._baselines.restoring(info.id) as restoring:
                lease, records = await self._control.acquire(
                    pool or info.pool,
                    n,
                    0,
                    {**labels, **lineage},
                    ttl,
                    timeout,
                    call_remaining,
                    request_id=request_id,
                    image=image,
                    network=network,
                )
                restoring.update(r.sandbox_id for r in records)
                try:
                    # Shared by every target: its baseline's entries and the mode fix-ups.
                    by_path = {e.path: e for e in entries}
                    fixups = b"".join(
                        f"{e.mode:o}\0".encode() + e.path.encode("utf-8", "surrogateescape") + b"\0"
                        for e in entries
                        if mf.needs_fixup(e)
                    )
                    await asyncio.gather(
                        *(
                            self._restore_into(rec, info, tar, staged, spooled, by_path, fixups)
                            if rounds is None
                            else self._restore_rounds(rec, info, rounds, by_path)
                            for rec in records
                        )
                    )
                except BaseException as e:
                    await asyncio.shield(self._control.release(lease.lease_id, []))
                    if isinstance(e, SandboxdError) and not isinstance(e, FailedPrecondition | NotFound):
                        raise FailedPrecondition(
                            f"restore of {info.id} failed and its sandboxes were destroyed: {e}"
                        ) from e
                    raise
        finally:
            self._pins.unpin(pinned)
            for path in (staged, spooled):
                if path is not None:
                    await asyncio.to_thread(_remove_file, path)
        return lease, records, info

    async def _rounds(
        self, info: SnapshotInfo, entries: list[Entry], ns: str
    ) -> list[tuple[str, bytes, bool]]:
        """(actor, stdin of owned_round_script, whether it extracts) for each round of a restore
        with several owners: every tar built (and verified) before any
        sandbox is touched."""
        contents = await self._tars.contents(info, entries, ns)
        return [
            (
                step.actor,
                owners.modes_payload(step.modes)
                + (mf.build_tar(step.create, contents) if step.create else b""),
                bool(step.create),
            )
            for step in await asyncio.to_thread(owners.plan, entries)
        ]

    async def _restore_rounds(
        self,
        rec: SandboxRecord,
        info: SnapshotInfo,
        rounds: list[tuple[str, bytes, bool]],
        by_path: dict[str, Entry],
    ) -> None:
        """Restores into ``rec`` round by round, each as its actor, then sets
        the session up as _restore_into does."""
        top_mode = ""
        with self._control.using(rec):
            for i, (actor, payload, extract) in enumerate(rounds):
                out = await self._workspaces.run(
                    rec,
                    owned_round_script(first=i == 0, extract=extract),
                    stdin=payload,
                    user=ROOT_USER if actor == owners.ROOT else "",
                )
                if i == 0:
                    top_mode = out.decode(errors="replace").strip()
        if not top_mode.isdigit():
            raise BackendError(f"restore of {rec.sandbox_id}: malformed workspace mode {top_mode[:20]!r}")
        script = restore_script(
            fixups=False,
            cwd=info.cwd if info.session else "",
            env=info.env if info.session else None,
            top_mode=top_mode,
        )
        out = await self._workspaces.run(rec, script, session=info.session)
        await self._set_baseline(rec, info, out, by_path)

    def _stage_path(self, size: int) -> Path | None:
        """Where to write the archive of a restore of ``size`` bytes for a
        backend that takes archives as files (None: stream it instead;
        small ones travel cheaply through a sandbox shell's stdin anyway)."""
        backend = self._control.backend
        where = backend.staging_dir() if isinstance(backend, StagedTars) else None
        if where is None or size < _STAGE_MIN_BYTES:
            return None
        where.mkdir(parents=True, exist_ok=True)
        return where / f"{secrets.token_hex(8)}.tar"

    async def _restore_into(
        self,
        rec: SandboxRecord,
        info: SnapshotInfo,
        tar: bytes | None,
        staged: Path | None,
        spooled: Path | None,
        by_path: dict[str, Entry],
        fixups: bytes,
    ) -> None:
        """``tar``: the archive in memory, or None: in file ``staged`` (handed
        over where the backend can) or ``spooled``. ``fixups``: (mode, path)
        pairs a non-root extraction gets wrong."""

        async def one() -> AsyncIterator[bytes]:
            if tar is not None:
                for i in range(0, len(tar), 1 << 20):
                    yield tar[i : i + (1 << 20)]
                return
            path = staged or spooled
            assert path is not None
            async for piece in _file_chunks(path):
                yield piece

        backend = self._control.backend
        archive = ""
        with self._control.using(rec):
            if staged is not None and isinstance(backend, StagedTars):
                archive = await backend.stage_tar(rec.handle, staged) or ""
            if not archive:
                await backend.put_tar(rec.handle, WORKSPACE, one())
        # Extraction, modes, cwd and environment in one command of the
        # restored session: one round trip, and no second shell to start.
        script = restore_script(
            fixups=bool(fixups),
            cwd=info.cwd if info.session else "",
            env=info.env if info.session else None,
            archive=archive,
        )
        try:
            out = await self._workspaces.run(rec, script, session=info.session, stdin=fixups)
        finally:
            if archive:
                assert isinstance(backend, StagedTars)
                await backend.unstage_tar(rec.handle, archive)
        await self._set_baseline(rec, info, out, by_path)

    async def _set_baseline(
        self, rec: SandboxRecord, info: SnapshotInfo, out: bytes, by_path: dict[str, Entry]
    ) -> None:
        """The restored sandbox's baseline, from the cutoff its restore printed."""
        try:
            cutoff = float(out.rstrip(b"\x00"))
        except ValueError as e:
            raise BackendError(f"restore of {rec.sandbox_id}: malformed cutoff {out[:80]!r}") from e
        self._baselines.set(
            rec.sandbox_id,
            Baseline(
                info.id,
                list(info.chain),
                cutoff=cutoff,
                entries=by_path,
                since=cutoff - DELTA_SLACK,
                journal=await self._watch_restored(rec, by_path),
            ),
        )

    async def _watch_restored(self, rec: SandboxRecord, by_path: dict[str, Entry]) -> Journal | None:
        """A journal on a restored workspace, watching every directory the
        restore wrote (nothing has run in the sandbox since)."""
        view = await self._workspaces.host_view(rec)
        if view is None:
            return None
        try:
            journal = self._baselines.new_journal(None)
            if journal is None:
                return None
            dirs = ["", *(p for p, e in by_path.items() if e.kind == DIR)]
            if not await asyncio.to_thread(view.each_dir, dirs, journal.watch) or journal.broken:
                journal.close()
                return None
            return journal
        finally:
            await asyncio.to_thread(view.close)


def _checked(info: SnapshotInfo, entries: list[Entry]) -> list[Entry]:
    try:
        mf.validate(entries)
    except UnsafeSnapshot as e:
        raise UnsafeSnapshot(f"snapshot {info.id} is unsafe and was not restored: {e}") from e
    return entries


def _write_file(path: Path, data: bytes) -> Path | None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.fchmod(fd, 0o644)  # read by the sandbox user, whatever our umask
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
    return path


async def _file_chunks(path: Path) -> AsyncIterator[bytes]:
    """The file at ``path`` in pieces of at most sizes.CHUNK_BYTES, each read in
    a worker thread (pread: every target of a fork reads on its own)."""
    fd = await asyncio.to_thread(os.open, path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        offset = 0
        while piece := await asyncio.to_thread(os.pread, fd, sizes.CHUNK_BYTES, offset):
            offset += len(piece)
            yield piece
    finally:
        os.close(fd)


def _remove_file(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
