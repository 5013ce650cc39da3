"""Environment snapshots: capture, restore, fork, lineage, retention and GC.

Capture. Where the control plane sees a workspace from the host
(sandboxd.backends.hostfs) a first snapshot lists, reads and hashes it in
one pass (sandboxd.core.capture); later ones look only at the paths the
workspace's change journal recorded since (sandboxd.backends.hostwatch),
or walk it when the journal cannot vouch for that. Elsewhere one listing
command (``find -printf``) runs in the sandbox, against a baseline as a
delta (full records only of entries whose ctime passed the baseline's time,
bare names of the rest), and contents come out through the backend's
``get_tar``. Either way files whose (size, mtime, ctime) equal the
baseline's (sandboxd.core.listing) keep their known digest and are not read
again; new contents become per-file blobs keyed by their sha256 under a
per-tenant namespace, written a batch at a time as one pack
(sandboxd.core.packs), so unchanged files are stored once. The session's cwd
and exported environment come from a command run in that session. A snapshot
on a baseline from snapshot P records P as its parent, inherits P's chain,
and is recorded as a delta on P's manifest (sandboxd.core.snapshot_catalog).

Restore. The manifest is resolved and checked (paths, kinds, modes, symlink
targets) and sized against the target pool's limits; blobs are read and
verified against their digests and a tar is built, all *before* any sandbox
is touched. Then n warm sandboxes are leased under one lease, and in each one
command of the session extracts the tar (handed over as a file where the
backend can, so a fork of n does not push it n times through the engine),
re-applies modes a non-root extraction loses and sets cwd and environment.
Any failure releases (destroys) every sandbox of the lease.

GC. Mark and sweep under one lock: expired snapshots are dropped (hidden
while a delta needs them), the mark set is every key a remaining snapshot
references plus every key *pinned* by a snapshot or restore in flight, and
unmarked store keys are deleted. Capture pins a blob under the same lock
before it checks whether the store holds it, so the sweep can never delete a
blob a new snapshot is about to rely on.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import os
import secrets
import tempfile
import time
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from pathlib import Path

from sandboxd.backends.base import (
    WORKSPACE,
    ExecOutcome,
    ExecResult,
    ExecSpec,
    HostWorkspaces,
    OutputChunk,
    StagedTars,
)
from sandboxd.backends.hostfs import HostWorkspace
from sandboxd.backends.hostwatch import Changes, Journal, Watcher
from sandboxd.backends.snapshot_shell import (
    LIST_SCRIPT,
    RECORDS_SCRIPT,
    SESSION_STATE_SCRIPT,
    STATE_SCRIPT,
    TAR_SCRIPT,
    delta_script,
    restore_script,
)
from sandboxd.clock import Clock
from sandboxd.core import manifest as mf
from sandboxd.core import validation as v
from sandboxd.core.capture import (
    BATCH_BYTES,
    BATCH_FILES,
    Changed,
    Prefetch,
    Rewalk,
    Scan,
    batches,
    once,
    read_hashed,
    sha256_all,
    stat_touched,
)
from sandboxd.core.control import ControlPlane
from sandboxd.core.leases import Lease
from sandboxd.core.lifecycle import SandboxRecord
from sandboxd.core.listing import (
    Baseline,
    Listed,
    Stamp,
    as_listed,
    not_a_file,
    parse_delta,
    parse_listing,
    parse_session_state,
)
from sandboxd.core.manifest import DIR, FILE, Entry, UnsafeSnapshot
from sandboxd.core.packs import PackedBlobs
from sandboxd.core.snapshot_catalog import MAX_DEPTH, BaseGone, ChainRef, SnapshotCatalog, SnapshotInfo
from sandboxd.core.tarstream import HARDLINK, read_members
from sandboxd.core.tenancy import current_tenant, split_pool_key
from sandboxd.errors import (
    BackendError,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    SandboxdError,
)
from sandboxd.settings import Settings, SnapshotSettings
from sandboxd.stores.base import BlobStore
from sandboxd.stores.local import LocalBlobStore
from sandboxd.stores.s3 import S3BlobStore, S3Config

log = logging.getLogger(__name__)

LABEL_SNAPSHOT = "sandboxd.snapshot"
LABEL_POLICY = "sandboxd.snapshot.policy_version"
LABEL_TURN = "sandboxd.snapshot.turn"

# A file whose ctime is this close to the listing may still change within the
# same kernel timestamp tick (ctime comes from the coarse clock, at most one
# tick, 1-10 ms, behind); it is not trusted as unchanged next time.
_RACY_SECONDS = 0.05
# How far before its reference time a delta listing starts (tick jitter).
_DELTA_SLACK = 0.01
# Largest total length of explicit paths handed to get_tar; above it the
# whole workspace is streamed and unchanged files are skipped on the way.
_MAX_PATH_ARGS = 256 << 10
# Change sets up to this size are read through the session (no exec start).
_SESSION_TAR_BYTES = 8 << 20
_TAR_CACHE_BYTES = 256 << 20
# A journal that recorded more paths than this, and more than half the
# workspace, is answered by a walk instead (cheaper per entry).
_REWALK_TOUCHED = 1000
# Archives above this are handed to a backend that can take files as a file;
# smaller ones already travel cheaply through a sandbox shell's stdin.
_STAGE_MIN_BYTES = 64 << 10


@dataclass(frozen=True)
class GcResult:
    expired_snapshots: int
    deleted_blobs: int
    kept_blobs: int


def new_snapshot_id() -> str:
    return "sn-" + secrets.token_hex(12)


@functools.lru_cache(maxsize=1024)
def tenant_namespace(tenant: str) -> str:
    return hashlib.sha256(tenant.encode()).hexdigest()[:16]


def blob_key(namespace: str, digest: str) -> str:
    return f"{namespace}/{digest[:2]}/{digest}"


class SnapshotManager:
    def __init__(
        self,
        control: ControlPlane,
        catalog: SnapshotCatalog,
        blobs: BlobStore,
        settings: SnapshotSettings,
        clock: Clock,
    ) -> None:
        self._control = control
        self._catalog = catalog
        self.blobs = PackedBlobs(blobs, catalog)
        self.settings = settings
        self._clock = clock
        self._gc_lock = asyncio.Lock()
        self._pins: Counter[str] = Counter()
        # Snapshots an operation in flight builds on: deleted, they are hidden
        # rather than purged (their manifest and blobs are still needed).
        self._snapshot_pins: Counter[str] = Counter()
        self._watcher = Watcher()
        self._watching = False
        self._snapshot_locks: dict[str, asyncio.Lock] = {}
        self._baselines: dict[str, Baseline] = {}
        self._tars: OrderedDict[str, bytes] = OrderedDict()
        self._gc_task: asyncio.Task[None] | None = None

    # -- start and stop -------------------------------------------------------

    async def start(self) -> None:
        await self._catalog.open()
        if self.settings.gc_interval_seconds > 0:
            self._gc_task = asyncio.create_task(self._gc_loop(), name="snapshot-gc")

    async def stop(self) -> None:
        if self._watching:
            asyncio.get_running_loop().remove_reader(self._watcher.fd)
            self._watching = False
        self._watcher.close()
        if self._gc_task is not None:
            self._gc_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._gc_task
        await self._catalog.close()
        await self.blobs.close()

    async def _gc_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.gc_interval_seconds)
            try:
                await self.gc()
            except Exception:  # keep collecting whatever one round hit
                log.exception("snapshot GC round failed")

    # -- pins -----------------------------------------------------------------

    async def _pin(self, keys: Iterable[str]) -> list[str]:
        pinned = list(keys)
        async with self._gc_lock:
            self._pins.update(pinned)
        return pinned

    def _unpin(self, keys: Iterable[str]) -> None:
        self._pins.subtract(keys)
        for key in [k for k, n in self._pins.items() if n <= 0]:
            del self._pins[key]

    # -- in-sandbox commands --------------------------------------------------

    async def _run(self, rec: SandboxRecord, script: str, *, session: str = "", stdin: bytes = b"") -> bytes:
        spec = ExecSpec(
            shell=script,
            cwd="" if session else WORKSPACE,
            timeout=self.settings.exec_timeout_seconds,
            stdin=stdin,
            output_limit=self._control.settings.exec.max_output_bytes,
            session=session,
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

    # -- snapshot -------------------------------------------------------------

    def _quota(self, tenant: str) -> int:
        return self.settings.tenant_quota_bytes.get(tenant, self.settings.quota_bytes)

    def _prune_baselines(self) -> None:
        if len(self._baselines) > 64:
            for sid in [s for s in self._baselines if not self._control.is_live(s)]:
                journal = self._baselines.pop(sid).journal
                if journal is not None:
                    journal.close()
        for sid in [
            s for s, lock in self._snapshot_locks.items() if not lock.locked() and s not in self._baselines
        ]:
            del self._snapshot_locks[sid]

    async def snapshot(
        self,
        sandbox_id: str,
        *,
        session: str = "",
        labels: dict[str, str] | None = None,
        policy_version: int | None = None,
        turn: int = 0,
        ttl: float = 0.0,
    ) -> SnapshotInfo:
        rec = self._control.leased(sandbox_id)
        session = v.session_name("session", session)
        labels = v.labels("labels", labels or {})
        ttl = v.non_negative("ttl_seconds", ttl, self.settings.max_ttl_seconds)
        ttl = ttl or self.settings.default_ttl_seconds
        if turn < 0:
            raise InvalidArgument("turn", f"must be >= 0, got {turn}")
        tenant = current_tenant()
        quota = self._quota(tenant)
        if quota and await self._catalog.usage(tenant) >= quota:
            raise ResourceExhausted(
                f"snapshot quota of tenant {tenant!r} ({quota} bytes) is used up; "
                "delete snapshots or let them expire"
            )
        self._prune_baselines()
        # One snapshot of a sandbox at a time: each builds on the baseline the
        # previous one leaves (and takes what its journal recorded since).
        async with self._snapshot_locks.setdefault(rec.sandbox_id, asyncio.Lock()):
            return await self._snapshot_locked(rec, session, labels, policy_version, turn, ttl, tenant, quota)

    async def _snapshot_locked(
        self,
        rec: SandboxRecord,
        session: str,
        labels: dict[str, str],
        policy_version: int | None,
        turn: int,
        ttl: float,
        tenant: str,
        quota: int,
    ) -> SnapshotInfo:
        started = time.monotonic()
        sandbox_id = rec.sandbox_id
        ns = tenant_namespace(tenant)
        pinned: list[str] = []
        prefetch: Prefetch | None = None
        baseline = self._baselines.get(rec.sandbox_id)
        # The snapshot this one may be recorded as a delta on stays (hidden
        # at worst) until it is recorded.
        base_pin = await self._pin_snapshot(baseline.snapshot_id if baseline is not None else "")
        journal: Journal | None = None
        delta: tuple[list[Entry], list[str]] | None = None
        cutoff = 0.0
        try:
            with self._control.using(rec):
                view = await self._host_view(rec)
                scan: Scan | None = None
                # In place, the session's state is asked for beside the capture.
                state = asyncio.ensure_future(self._session_state(rec, session)) if view is not None else None
                try:
                    carried: dict[str, Entry] = {}
                    listing: list[Listed] = []
                    changes = self._changes(baseline) if view is not None else None
                    captured = None
                    if view is not None and changes is not None:
                        # A journal says what changed since the baseline: look at that only.
                        assert baseline is not None and baseline.journal is not None
                        journal, cutoff = baseline.journal, baseline.cutoff
                        try:
                            captured = await self._capture_changes(ns, view, baseline, changes, pinned)
                        except Rewalk:
                            journal, cutoff = None, 0.0
                            baseline.journal.close()
                    if captured is not None:
                        when, by_path, stored, stamps = (
                            captured.when,
                            captured.entries,
                            captured.stored,
                            captured.stamps,
                        )
                        delta, linked = (captured.put, captured.deleted), captured.linked
                    else:
                        if view is not None:
                            journal = self._new_journal(baseline)
                        if view is not None and baseline is None:
                            # Everything will be read: list and read in one pass.
                            scan = Scan(view, journal.watch if journal is not None else None)
                            when = scan.when
                        elif view is not None:
                            when, listing = await self._list_in_place(view, journal)
                        else:
                            cwd, env, when, listing, carried, prefetch = await self._list_through(
                                rec, baseline, session
                            )
                        by_path, stored, stamps = await self._capture(
                            rec, ns, when, listing, baseline, pinned, session, prefetch, carried, view, scan
                        )
                        several = (
                            scan.linked if scan is not None else (i.path for i in listing if i.links > 1)
                        )
                        linked = frozenset(p for p in several if p in by_path)
                    if state is not None:
                        cwd, env = await state
                finally:
                    if state is not None and not state.done():
                        state.cancel()
                        await asyncio.gather(state, return_exceptions=True)
                    if scan is not None:
                        await scan.close()
                    if view is not None:
                        await asyncio.to_thread(view.close)
            parent_id, chain = await self._lineage(rec, baseline)
            now = self._clock.time()
            info = SnapshotInfo(
                id=new_snapshot_id(),
                tenant=tenant,
                pool=split_pool_key(rec.pool)[1],
                image=rec.image,
                labels=labels,
                policy_version=policy_version,
                turn=turn,
                parent_id=parent_id,
                session=session,
                cwd=cwd,
                env=env,
                size_bytes=sum(e.size for e in by_path.values() if e.kind == FILE),
                stored_bytes=stored,
                entry_count=len(by_path),
                digest=mf.digest_of(by_path.values()),
                created_at=now,
                expires_at=now + ttl,
            )
            info.chain = [*chain, info.ref()]
            await self._record(info, by_path, quota, baseline, delta)
        except BaseException:
            if journal is not None:
                # A new journal is dropped; a taken one has lost what it
                # recorded: closed, it makes the next snapshot walk.
                journal.close()
            raise
        finally:
            if prefetch is not None:
                await prefetch.close()
            self._unpin(pinned)
            self._unpin_snapshot(base_pin)
        self._baselines[rec.sandbox_id] = Baseline(
            info.id,
            info.chain,
            stamps,
            cutoff=cutoff,
            entries=by_path,
            since=when - _RACY_SECONDS - _DELTA_SLACK,
            journal=journal,
            linked=linked,
        )
        rec.labels[LABEL_SNAPSHOT] = info.id
        log.info(
            "snapshot %s of %s: %d entries, %d bytes, %d new (parent %s) in %.1f ms",
            info.id, sandbox_id, info.entry_count, info.size_bytes, stored, parent_id or "-",
            (time.monotonic() - started) * 1000,
        )  # fmt: skip
        return info

    async def _host_view(self, rec: SandboxRecord) -> HostWorkspace | None:
        backend = self._control.backend
        if not isinstance(backend, HostWorkspaces):
            return None
        try:
            return await backend.host_workspace(rec.handle)
        except SandboxdError:
            return None

    async def _session_state(self, rec: SandboxRecord, session: str) -> tuple[str, dict[str, str]]:
        if not session:
            return "", {}
        cwd, env, _ = parse_session_state(await self._run(rec, SESSION_STATE_SCRIPT, session=session))
        return cwd, env

    def _new_journal(self, baseline: Baseline | None) -> Journal | None:
        """A fresh journal (the old one of this sandbox, if any, is dropped:
        whatever it missed, a walk is about to see)."""
        if baseline is not None and baseline.journal is not None:
            baseline.journal.close()
        if not self._watcher.available:
            return None
        fd = self._watcher.fd
        if fd < 0:
            return None
        if not self._watching:
            asyncio.get_running_loop().add_reader(fd, self._watcher.drain)
            self._watching = True
        return self._watcher.journal()

    @staticmethod
    def _changes(baseline: Baseline | None) -> Changes | None:
        if baseline is None or baseline.entries is None or baseline.journal is None:
            return None
        return baseline.journal.take()

    async def _capture_changes(
        self, ns: str, view: HostWorkspace, baseline: Baseline, changes: Changes, pinned: list[str]
    ) -> Changed:
        """The snapshot from what a journal recorded: only the touched paths
        (and files with several names) are looked at, directories made since
        whole, and only those that changed are read. Everything else is the
        baseline's, carried. Rewalk if a file got another name."""
        assert baseline.entries is not None and baseline.journal is not None
        if await self._catalog.depth(baseline.snapshot_id) is None:
            # The baseline's snapshot is gone, and with it perhaps the blobs of
            # what would be carried: a walk finds which to read again.
            raise Rewalk
        if len(changes.touched) > max(_REWALK_TOUCHED, len(baseline.entries) // 2):
            raise Rewalk  # most of it changed: one walk costs less than a look per path
        base = baseline.entries
        when = time.time()
        stats = await asyncio.to_thread(
            stat_touched, view, changes, base, baseline.journal.watch, baseline.linked
        )
        linked = {p for p, r in stats.items() if r is not None and r[0] == "f" and r[7] > 1}
        if not linked <= baseline.linked:
            # A file got another name: which other paths share it, only a walk tells.
            raise Rewalk
        linked |= {p for p in baseline.linked if p not in stats}
        entries = dict(base)
        stamps = dict(baseline.files)
        put: dict[str, Entry] = {}
        deleted: set[str] = set()
        need: dict[str, Listed] = {}

        def drop(path: str) -> None:
            if entries.pop(path, None) is not None:
                deleted.add(path)
            put.pop(path, None)
            stamps.pop(path, None)

        for path, record in stats.items():
            if record is None:
                drop(path)
                continue
            item = Listed(*record)
            if item.kind == "f":
                known = None if path in changes.written else baseline.digest_of(item)
                if known is None:
                    need[path] = item
                    continue
                entry = baseline.unchanged(item, known) or Entry(
                    path, FILE, item.mode & 0o1777, item.size, known, mtime=float(item.mtime)
                )
                if float(item.ctime) < when - _RACY_SECONDS:
                    stamps[path] = (item.stamp, known)
                if base.get(path) != entry:
                    entries[path] = put[path] = entry
                continue
            described = not_a_file(item, baseline.unchanged(item))
            if described is None:
                drop(path)  # not something a snapshot carries (a FIFO, a socket)
                continue
            stamps.pop(path, None)
            if base.get(path) != described:
                entries[path] = put[path] = described
        stored = 0
        for run in batches(sorted(need), need):
            got = await asyncio.to_thread(read_hashed, view, [(n, need[n].size) for n in run])
            blobs: dict[str, bytes] = {}
            read = set()
            for name, content, digest in got:
                read.add(name)
                item = need[name]
                entry = Entry(name, FILE, item.mode & 0o1777, len(content), digest, mtime=float(item.mtime))
                entries[name] = put[name] = entry
                if len(content) == item.size and float(item.ctime) < when - _RACY_SECONDS:
                    stamps[name] = (item.stamp, digest)
                else:
                    stamps.pop(name, None)
                if content:
                    blobs.setdefault(blob_key(ns, digest), content)
            for name in run:
                if name not in read:
                    drop(name)  # gone since it was looked at
            pinned.extend(await self._pin(blobs))
            stored += await self.blobs.put_absent(blobs)
        for path in list(put):
            if base.get(path) == put[path]:
                del put[path]
        return Changed(when, entries, stored, stamps, list(put.values()), sorted(deleted), frozenset(linked))

    async def _list_in_place(
        self, view: HostWorkspace, journal: Journal | None = None
    ) -> tuple[float, list[Listed]]:
        """(listing time, entries): the workspace walked from the host (and
        ``journal`` set to watch every directory as it is walked)."""
        when, records = await asyncio.to_thread(view.walk, journal.watch if journal else None)
        return when, [Listed(*r) for r in records]

    async def _list_through(
        self, rec: SandboxRecord, baseline: Baseline | None, session: str
    ) -> tuple[str, dict[str, str], float, list[Listed], dict[str, Entry], Prefetch | None]:
        """The same through commands in the sandbox: a delta listing against
        ``baseline`` where it has one; the first snapshot of a large workspace
        starts its tar stream (returned) while the listing runs."""
        prefetch: Prefetch | None = None
        if baseline is None and await self._large(rec):
            prefetch = Prefetch(self._get_tar(rec, (".",)))
        try:
            delta = baseline is not None and baseline.entries is not None
            script = STATE_SCRIPT if session else LIST_SCRIPT
            if delta:
                assert baseline is not None
                script = delta_script(baseline.since, session=bool(session))
            cwd, env = "", dict[str, str]()
            if session:
                cwd, env, raw = parse_session_state(await self._run(rec, script, session=session))
            else:
                raw = await self._run(rec, script)
            carried: dict[str, Entry] = {}
            if delta:
                assert baseline is not None
                when, listing, carried = await self._merge_delta(rec, baseline, raw)
            else:
                when, listing = parse_listing(raw)
        except BaseException:
            if prefetch is not None:
                await prefetch.close()
            raise
        return cwd, env, when, listing, carried, prefetch

    async def _record(
        self,
        info: SnapshotInfo,
        by_path: dict[str, Entry],
        quota: int,
        baseline: Baseline | None,
        delta: tuple[list[Entry], list[str]] | None = None,
    ) -> None:
        """Records the snapshot: as a delta on its baseline's snapshot where
        that is still in the catalog and its chain is not too long (writes
        what changed, not the workspace), complete otherwise. ``delta``:
        (entries put, paths deleted) when the capture knows them."""
        if baseline is not None and baseline.entries is not None:
            depth = await self._catalog.depth(baseline.snapshot_id)
            if depth is not None and depth < MAX_DEPTH:
                put, deleted = delta if delta is not None else mf.diff(baseline.entries, by_path)
                ns = tenant_namespace(info.tenant)
                added = {blob_key(ns, e.digest): e.size for e in put if e.kind == FILE and e.size}
                with contextlib.suppress(BaseGone):
                    manifest = mf.encode_delta(put, deleted)
                    await self._catalog.insert(info, manifest, added, quota, base=baseline.snapshot_id)
                    return
        ordered = sorted(by_path.values(), key=lambda e: e.path)
        ns = tenant_namespace(info.tenant)
        refs = {blob_key(ns, e.digest): e.size for e in ordered if e.kind == FILE and e.size}
        await self._catalog.insert(info, mf.encode(ordered), refs, quota)

    async def _pin_snapshot(self, snapshot_id: str) -> str:
        if snapshot_id:
            async with self._gc_lock:
                self._snapshot_pins[snapshot_id] += 1
        return snapshot_id

    def _unpin_snapshot(self, snapshot_id: str) -> None:
        if snapshot_id:
            self._snapshot_pins[snapshot_id] -= 1
            if self._snapshot_pins[snapshot_id] <= 0:
                del self._snapshot_pins[snapshot_id]

    def _kept_snapshots(self) -> frozenset[str]:
        return frozenset(self._snapshot_pins)

    async def _merge_delta(
        self, rec: SandboxRecord, baseline: Baseline, raw: bytes
    ) -> tuple[float, list[Listed], dict[str, Entry]]:
        """(listing time, entries to look at, entries carried over unchanged)
        from a delta listing: what exists is what it names; what changed
        comes with a record; a named path that is new but has no record (it
        lies in a directory moved in) is listed on its own."""
        assert baseline.entries is not None
        when, changed, names = parse_delta(raw)
        present = set(names)
        listing = [c for c in changed if c.path in present]
        seen = {c.path for c in listing}
        carried = {p: e for p, e in baseline.entries.items() if p in present and p not in seen}
        unknown = [n for n in names if n not in seen and n not in carried]
        if unknown:
            stdin = b"".join(n.encode("utf-8", "surrogateescape") + b"\x00" for n in unknown)
            _, more = parse_listing(await self._run(rec, RECORDS_SCRIPT, stdin=stdin))
            listing += more
        return when, listing, carried

    async def _large(self, rec: SandboxRecord) -> bool:
        """Whether the workspace holds more than a session read carries
        (a host-side reading; False where the backend cannot tell)."""
        try:
            usage = await self._control.backend.usage(rec.handle)
        except SandboxdError:
            return False
        return usage.disk_bytes > _SESSION_TAR_BYTES

    async def _lineage(self, rec: SandboxRecord, baseline: Baseline | None) -> tuple[str, list[ChainRef]]:
        if baseline is not None:
            return baseline.snapshot_id, list(baseline.chain)
        parent_id = rec.labels.get(LABEL_SNAPSHOT, "")
        if not parent_id:
            return "", []
        parent = await self._catalog.get(parent_id)
        return parent_id, list(parent.chain) if parent is not None else []

    async def _capture(
        self,
        rec: SandboxRecord,
        ns: str,
        when: float,
        listing: list[Listed],
        baseline: Baseline | None,
        pinned: list[str],
        session: str,
        prefetch: Prefetch | None = None,
        carried: dict[str, Entry] | None = None,
        view: HostWorkspace | None = None,
        scan: Scan | None = None,
    ) -> tuple[dict[str, Entry], int, dict[str, tuple[Stamp, str]]]:
        """(entries by path, bytes newly stored, new baseline files).
        ``carried``: entries a delta listing showed unchanged; ``view``: read
        the files ``listing`` shows changed in place rather than as a tar
        from the sandbox; ``scan``: a host-side scan that lists and reads
        everything (``listing`` is then empty)."""
        entries: dict[str, Entry] = dict(carried or {})
        need: dict[str, Listed] = {}
        reused: dict[str, Listed] = {}
        kept = {p for p, e in entries.items() if e.kind == FILE}

        def classify(items: list[Listed]) -> None:
            for item in items:
                if item.kind == "f":
                    known = baseline.digest_of(item) if baseline is not None else None
                    if known is not None:
                        assert baseline is not None
                        reused[item.path] = item
                        entries[item.path] = baseline.unchanged(item, known) or Entry(
                            item.path, FILE, item.mode & 0o1777, item.size, known, mtime=float(item.mtime)
                        )
                    else:
                        need[item.path] = item
                elif (
                    described := not_a_file(item, baseline.unchanged(item) if baseline is not None else None)
                ) is not None:
                    entries[item.path] = described
                else:
                    log.info("snapshot of %s skips %s (type %s)", rec.sandbox_id, item.path, item.kind)

        classify(listing)
        kept.update(reused)
        # While the baseline's snapshot has a row (pinned by the caller, so it
        # keeps it), what it references is kept and so is all that is kept here.
        if kept and baseline is not None and await self._catalog.depth(baseline.snapshot_id) is None:
            keys = {blob_key(ns, entries[p].digest) for p in kept if entries[p].size}
            pinned += await self._pin(keys)
            # The parent is gone, so GC may have taken its blobs: re-read those.
            gone = await self.blobs.missing(sorted(keys))
            for p in list(kept):
                if entries[p].size and blob_key(ns, entries[p].digest) in gone:
                    need[p] = reused.pop(p) if p in reused else as_listed(entries[p])
                    kept.discard(p)
                    del entries[p]
        stored = 0
        stamps: dict[str, tuple[Stamp, str]] = {}
        digests: dict[str, str] = {}
        links: list[tuple[str, str, Listed]] = []
        writers: set[asyncio.Task[int]] = set()
        slots = asyncio.Semaphore(2)
        batch: list[tuple[str, Listed, bytes]] = []
        batch_bytes = 0

        async def write(files: list[tuple[str, Listed, bytes]], hashed: list[str] | None = None) -> int:
            try:
                if hashed is None:
                    # sha256 releases the GIL: hashing overlaps with reading the stream.
                    hashed = await asyncio.to_thread(sha256_all, [content for _, _, content in files])
                blobs: dict[str, bytes] = {}
                for (name, item, content), digest in zip(files, hashed, strict=True):
                    digests[name] = digest
                    entries[name] = Entry(
                        name, FILE, item.mode & 0o1777, len(content), digest, mtime=float(item.mtime)
                    )
                    if len(content) == item.size and float(item.ctime) < when - _RACY_SECONDS:
                        stamps[name] = (item.stamp, digest)
                    if content:
                        blobs.setdefault(blob_key(ns, digest), content)
                pinned.extend(await self._pin(blobs))
                return await self.blobs.put_absent(blobs)
            finally:
                slots.release()

        async def flush() -> None:
            nonlocal batch, batch_bytes
            if batch:
                await slots.acquire()
                writers.add(asyncio.create_task(write(batch)))
                batch, batch_bytes = [], 0

        try:
            if scan is not None:
                async for scanned in scan.batches():
                    await slots.acquire()
                    read = [(item.path, item, content) for item, content, _ in scanned]
                    writers.add(task := asyncio.create_task(write(read, [d for _, _, d in scanned])))
                    task.add_done_callback(scan.stored)
                classify(await scan.others())
            elif need and view is not None:
                # One reader thread: per-file work is short calls that drop
                # the GIL, and two such threads measured slower than one.
                for run in batches(sorted(need), need):
                    got = await asyncio.to_thread(read_hashed, view, [(n, need[n].size) for n in run])
                    await slots.acquire()
                    files = [(name, need[name], content) for name, content, _ in got]
                    writers.add(asyncio.create_task(write(files, [digest for _, _, digest in got])))
            elif need:
                names = sorted(need)
                paths = tuple(names) if sum(len(p) + 1 for p in names) <= _MAX_PATH_ARGS else (".",)
                stream: AsyncIterator[bytes]
                if prefetch is not None:
                    stream = prefetch.chunks()
                elif session and sum(i.size + 1024 for i in need.values()) <= _SESSION_TAR_BYTES:
                    stdin = b"".join(p.encode("utf-8", "surrogateescape") + b"\x00" for p in names)
                    stream = once(await self._run(rec, TAR_SCRIPT, session=session, stdin=stdin))
                else:
                    stream = self._get_tar(rec, paths)
                async for member, content in read_members(stream):
                    wanted = need.get(member.name)
                    if wanted is None:
                        continue
                    if member.type == HARDLINK:
                        links.append((member.name, member.linkname, wanted))
                    elif member.is_file:
                        batch.append((member.name, wanted, content))
                        batch_bytes += len(content)
                        if batch_bytes >= BATCH_BYTES or len(batch) >= BATCH_FILES:
                            await flush()
                await flush()
            for size in await asyncio.gather(*writers):
                stored += size
        except BaseException:
            for task in writers:
                task.cancel()
            await asyncio.gather(*writers, return_exceptions=True)
            raise
        for name, target, item in links:
            # A hard link's content is its target's; one whose target was not captured is left out.
            digest = digests.get(target, "")
            if digest:
                size = entries[target].size
                entries[name] = Entry(name, FILE, item.mode & 0o1777, size, digest, mtime=float(item.mtime))
                if size == item.size and float(item.ctime) < when - _RACY_SECONDS:
                    stamps[name] = (item.stamp, digest)
        for p, item in reused.items():
            # Unchanged against a trusted stamp: as trustworthy as before.
            stamps[p] = (item.stamp, entries[p].digest)
        return entries, stored, stamps

    async def _get_tar(self, rec: SandboxRecord, paths: tuple[str, ...]) -> AsyncIterator[bytes]:
        stream = self._control.backend.get_tar(rec.handle, WORKSPACE, paths)
        try:
            async for chunk in stream:
                yield chunk
        except (NotFound, BackendError) as e:
            # tar names a listed file that vanished before it got there.
            if isinstance(e, BackendError) and "No such file or directory" not in str(e):
                raise
            raise FailedPrecondition(
                f"the workspace of {rec.sandbox_id} changed while it was being snapshotted ({e}); retry"
            ) from e
        finally:
            with contextlib.suppress(Exception):
                await stream.aclose()  # type: ignore[attr-defined]

    # -- lookups --------------------------------------------------------------

    async def get(self, snapshot_id: str) -> SnapshotInfo:
        v.object_id("snapshot_id", snapshot_id, "snapshot")
        info = await self._catalog.get(snapshot_id)
        if info is None or info.tenant != current_tenant() or info.expires_at <= self._clock.time():
            raise NotFound(f"snapshot {snapshot_id!r} not found (deleted, expired or never taken)")
        return info

    async def list_snapshots(
        self, labels: dict[str, str] | None = None, pool: str = "", parent_id: str = ""
    ) -> list[SnapshotInfo]:
        wanted = v.labels("labels", labels or {})
        out = []
        for info in await self._catalog.list_infos(current_tenant(), self._clock.time()):
            if pool and info.pool != pool:
                continue
            if parent_id and info.parent_id != parent_id:
                continue
            if any(info.labels.get(k) != val for k, val in wanted.items()):
                continue
            out.append(info)
        return out

    async def delete(self, snapshot_id: str) -> None:
        info = await self.get(snapshot_id)
        await self._catalog.delete(info.id, self._kept_snapshots())
        self._tars.pop(info.id, None)

    async def usage(self) -> int:
        return await self._catalog.usage(current_tenant())

    # -- restore --------------------------------------------------------------

    async def restore(
        self,
        snapshot_id: str,
        *,
        n: int = 1,
        pool: str = "",
        labels: dict[str, str] | None = None,
        ttl: float = 0.0,
        timeout: float = 0.0,
        call_remaining: float | None = None,
    ) -> tuple[Lease, list[SandboxRecord], SnapshotInfo]:
        info = await self.get(snapshot_id)
        n = n or 1
        if n < 1:
            raise InvalidArgument("n", f"must be >= 1, got {n}")
        labels = v.labels("labels", labels or {})
        target = self._control.get_pool(pool or info.pool, "pool")
        if target.config.image != info.image:
            raise FailedPrecondition(
                f"snapshot {info.id} was taken on image {info.image!r}; pool {pool or info.pool!r} runs "
                f"{target.config.image!r}"
            )
        try:
            resolved = await self._catalog.entries(info.id)
        except UnsafeSnapshot as e:
            raise UnsafeSnapshot(f"snapshot {info.id} is unsafe and was not restored: {e}") from e
        if resolved is None:
            raise NotFound(f"snapshot {snapshot_id!r} not found (deleted, expired or never taken)")
        entries = self._checked(info, sorted(resolved.values(), key=lambda e: e.path))
        inodes, size = mf.footprint(entries)
        limits = target.config.limits
        if limits.max_files and inodes > limits.max_files:
            raise FailedPrecondition(
                f"snapshot {info.id} has {inodes - 1} entries; pool {target.config.name!r} sandboxes hold "
                f"at most {limits.max_files - 1}"
            )
        if limits.disk_bytes and size > limits.disk_bytes:
            raise FailedPrecondition(
                f"snapshot {info.id} needs {size} bytes of workspace; pool sandboxes have {limits.disk_bytes}"
            )
        ns = tenant_namespace(info.tenant)
        pinned = await self._pin(blob_key(ns, e.digest) for e in entries if e.kind == FILE and e.size)
        staged = self._stage_path(size)
        try:
            if not await self._catalog.exists(info.id):
                raise NotFound(f"snapshot {snapshot_id!r} not found (deleted while restoring)")
            tar = await self._tar(info, entries, ns, to=staged)
            if tar is not None and staged is not None:
                await asyncio.to_thread(_write_file, staged, tar)
            lineage = lineage_labels(info)
            # Refills of the warm buffer this acquire drains wait until the
            # archive is extracted: on a small host they would take its CPU.
            with self._control.reconciler.urgent():
                lease, records = await self._control.acquire(
                    pool or info.pool, n, 0, {**labels, **lineage}, ttl, timeout, call_remaining
                )
                try:
                    # Shared by every target: its baseline's entries and the mode fix-ups.
                    by_path = {e.path: e for e in entries}
                    fixups = b"".join(
                        f"{e.mode:o}\0".encode() + e.path.encode("utf-8", "surrogateescape") + b"\0"
                        for e in entries
                        if mf.needs_fixup(e)
                    )
                    await asyncio.gather(
                        *(self._restore_into(rec, info, tar, staged, by_path, fixups) for rec in records)
                    )
                except BaseException as e:
                    await asyncio.shield(self._control.release(lease.lease_id, []))
                    if isinstance(e, SandboxdError) and not isinstance(e, FailedPrecondition | NotFound):
                        raise FailedPrecondition(
                            f"restore of {info.id} failed and its sandboxes were destroyed: {e}"
                        ) from e
                    raise
        finally:
            self._unpin(pinned)
            if staged is not None:
                await asyncio.to_thread(_remove_file, staged)
        return lease, records, info

    def _checked(self, info: SnapshotInfo, entries: list[Entry]) -> list[Entry]:
        try:
            mf.validate(entries)
        except UnsafeSnapshot as e:
            raise UnsafeSnapshot(f"snapshot {info.id} is unsafe and was not restored: {e}") from e
        return entries

    async def _tar(
        self, info: SnapshotInfo, entries: list[Entry], ns: str, to: Path | None = None
    ) -> bytes | None:
        """The snapshot's tar, built from its verified blobs: the cached bytes
        if there are some, else written to ``to`` when it is given (None is
        returned), else built (and cached) in memory."""
        cached = self._tars.get(info.id)
        if cached is not None:
            self._tars.move_to_end(info.id)
            return cached
        digests = sorted({e.digest for e in entries if e.kind == FILE and e.size})
        try:
            blobs = await self.blobs.get_many([blob_key(ns, d) for d in digests])
        except NotFound as e:
            raise UnsafeSnapshot(f"snapshot {info.id} is corrupt: {e}") from e
        contents = {d: blobs[blob_key(ns, d)] for d in digests}
        sizes = {e.digest: e.size for e in entries if e.kind == FILE}
        wrong = [d for d in digests if len(contents[d]) != sizes[d]]
        if wrong:
            raise UnsafeSnapshot(f"snapshot {info.id} is corrupt: size of blob {wrong[0]} differs")
        # Verified while the tar is built (sha256 releases the GIL); a bad blob discards it.
        building = (
            asyncio.to_thread(mf.write_tar, to, entries, contents)
            if to is not None
            else asyncio.to_thread(mf.build_tar, entries, contents)
        )
        bad, tar = await asyncio.gather(asyncio.to_thread(_mismatches, contents), building)
        if bad:
            raise UnsafeSnapshot(
                f"snapshot {info.id} is corrupt: blob {bad[0]} does not match its digest "
                f"({len(bad)} bad blob(s)); nothing was restored"
            )
        if tar is not None and len(tar) <= _TAR_CACHE_BYTES // 2:
            self._tars[info.id] = tar
            while sum(len(t) for t in self._tars.values()) > _TAR_CACHE_BYTES:
                self._tars.popitem(last=False)
        return tar

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
        by_path: dict[str, Entry],
        fixups: bytes,
    ) -> None:
        """``fixups``: (mode, path) pairs a non-root extraction gets wrong."""

        async def one() -> AsyncIterator[bytes]:
            data = tar if tar is not None else await asyncio.to_thread(_read_file, staged)
            for i in range(0, len(data), 1 << 20):
                yield data[i : i + (1 << 20)]

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
            out = await self._run(rec, script, session=info.session, stdin=fixups)
        finally:
            if archive:
                assert isinstance(backend, StagedTars)
                await backend.unstage_tar(rec.handle, archive)
        try:
            cutoff = float(out.rstrip(b"\x00"))
        except ValueError as e:
            raise BackendError(f"restore of {rec.sandbox_id}: malformed cutoff {out[:80]!r}") from e
        self._baselines[rec.sandbox_id] = Baseline(
            info.id,
            list(info.chain),
            cutoff=cutoff,
            entries=by_path,
            since=cutoff - _DELTA_SLACK,
            journal=await self._watch_restored(rec, by_path),
        )

    async def _watch_restored(self, rec: SandboxRecord, by_path: dict[str, Entry]) -> Journal | None:
        """A journal on a restored workspace, watching every directory the
        restore wrote (nothing has run in the sandbox since)."""
        view = await self._host_view(rec)
        if view is None:
            return None
        try:
            journal = self._new_journal(None)
            if journal is None:
                return None
            dirs = ["", *(p for p, e in by_path.items() if e.kind == DIR)]
            if not await asyncio.to_thread(view.each_dir, dirs, journal.watch) or journal.broken:
                journal.close()
                return None
            return journal
        finally:
            await asyncio.to_thread(view.close)

    # -- garbage collection ---------------------------------------------------

    async def gc(self) -> GcResult:
        """Drops expired snapshots, then deletes every stored blob that no
        snapshot references and no operation in flight has pinned."""
        keys = await self.blobs.list_keys()
        async with self._gc_lock:
            kept = self._kept_snapshots()
            expired = await self._catalog.delete_expired(self._clock.time(), kept)
            for sid in expired:
                self._tars.pop(sid, None)
            await self._catalog.sweep_hidden(kept)
            live = await self._catalog.live_keys()
            doomed = [k for k in keys if k not in live and self._pins.get(k, 0) <= 0]
            await self.blobs.delete_many(doomed)
            await self.blobs.sweep_packs()
        if expired or doomed:
            log.info("snapshot GC: %d expired snapshots, %d blobs deleted", len(expired), len(doomed))
        return GcResult(len(expired), len(doomed), len(keys) - len(doomed))

    # -- helpers for tests and tools ------------------------------------------

    def pinned(self) -> int:
        return sum(self._pins.values())

    def baseline_of(self, sandbox_id: str) -> Baseline | None:
        return self._baselines.get(sandbox_id)

    def forget_tar_cache(self) -> None:
        self._tars.clear()


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


def _read_file(path: Path | None) -> bytes:
    assert path is not None
    return path.read_bytes()


def _remove_file(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def _mismatches(contents: dict[str, bytes]) -> list[str]:
    return [d for d, data in contents.items() if hashlib.sha256(data).hexdigest() != d]


def lineage_labels(info: SnapshotInfo) -> dict[str, str]:
    """Labels a sandbox restored from ``info`` carries."""
    out = {LABEL_SNAPSHOT: info.id, LABEL_TURN: str(info.turn)}
    if info.policy_version is not None:
        out[LABEL_POLICY] = str(info.policy_version)
    return out


def make_snapshot_manager(
    settings: Settings, control: ControlPlane, clock: Clock, *, persist: bool = True
) -> SnapshotManager:
    """The snapshot manager for a server: catalog under state_dir (in memory
    when not persisting), blobs in S3 when [snapshots.s3] names an endpoint,
    else in a local directory (state_dir/blobs by default; a throw-away
    temporary directory when not persisting and none is set)."""
    cfg = settings.snapshots
    catalog = SnapshotCatalog(
        settings.state_dir / f"{settings.instance_id}-snapshots.sqlite3" if persist else None
    )
    blobs: BlobStore
    if cfg.s3.endpoint:
        blobs = S3BlobStore(
            S3Config(
                endpoint=cfg.s3.endpoint,
                bucket=cfg.s3.bucket,
                access_key=cfg.s3.access_key,
                secret_key=cfg.s3.secret_key,
                region=cfg.s3.region,
                prefix=cfg.s3.prefix,
                concurrency=cfg.s3.concurrency,
            )
        )
    elif cfg.blob_dir is not None:
        blobs = LocalBlobStore(Path(cfg.blob_dir).expanduser())
    elif persist:
        blobs = LocalBlobStore(settings.state_dir / "blobs")
    else:
        blobs = LocalBlobStore(Path(tempfile.mkdtemp(prefix="sandboxd-blobs-")), remove_on_close=True)
    return SnapshotManager(control, catalog, blobs, cfg, clock)
