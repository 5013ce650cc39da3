"""Capture: a leased sandbox's workspace and session state become a snapshot.

Where the control plane sees a workspace from the host
(sandboxd.backends.hostfs) a first snapshot lists, reads and hashes it in
one pass (sandboxd.core.snapshots.reading); later ones look only at the
paths the workspace's change journal recorded since
(sandboxd.core.snapshots.journal), or walk it when the journal cannot vouch
for that. Elsewhere one listing command (``find -printf``) runs in the
sandbox, against a baseline as a delta (full records only of entries whose
ctime passed the baseline's time, bare names of the rest), and contents come
out through the backend's ``get_tar`` (sandboxd.core.snapshots.workspaces).
Either way files whose (size, mtime, ctime) equal the baseline's
(sandboxd.core.snapshots.listing) keep their known digest and are not read
again; new contents become per-file blobs (sandboxd.core.snapshots.contents),
so unchanged files are stored once. The session's cwd and exported
environment come from a command run in that session. A snapshot on a
baseline from snapshot P records P as its parent, inherits P's chain, and is
recorded as a delta on P's manifest (sandboxd.core.snapshots.catalog).

Files are counted at their apparent sizes against the sandbox's workspace
limit and the tenant's quota before they are read
(sandboxd.core.snapshots.sizes), large ones are streamed, and a capture that
fails deletes at once what it stored that nothing else needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from sandboxd.core.lifecycle import SandboxRecord
from sandboxd.core.snapshots import manifest as mf
from sandboxd.core.snapshots import owners
from sandboxd.core.snapshots.baselines import Baselines
from sandboxd.core.snapshots.catalog import MAX_DEPTH, BaseGone, SnapshotCatalog
from sandboxd.core.snapshots.contents import Contents
from sandboxd.core.snapshots.gc import Pins
from sandboxd.core.snapshots.info import SnapshotInfo
from sandboxd.core.snapshots.journal import Changes, Journal
from sandboxd.core.snapshots.lineage import LABEL_SNAPSHOT, parent_of
from sandboxd.core.snapshots.listing import DELTA_SLACK, RACY_SECONDS, Baseline, Listed
from sandboxd.core.snapshots.manifest import FILE, Entry
from sandboxd.core.snapshots.packs import blob_key, tenant_namespace
from sandboxd.core.snapshots.reading import Prefetch, Rewalk, Scan
from sandboxd.core.snapshots.sizes import PAGE_BYTES, SizeCheck
from sandboxd.core.snapshots.taking import (
    SandboxLocks,
    SnapshotRequest,
    describe,
    requested,
    unpin_stored,
    within_quota,
)
from sandboxd.core.snapshots.workspaces import Workspaces
from sandboxd.core.tenancy import current_tenant
from sandboxd.settings import SnapshotSettings

if TYPE_CHECKING:
    from sandboxd.core.control import ControlPlane

log = logging.getLogger(__name__)


class Capture:
    """Takes snapshots of leased sandboxes, one at a time per sandbox."""

    def __init__(
        self,
        control: ControlPlane,
        catalog: SnapshotCatalog,
        contents: Contents,
        workspaces: Workspaces,
        baselines: Baselines,
        pins: Pins,
        settings: SnapshotSettings,
        now: Callable[[], float],
    ) -> None:
        self._control = control
        self._catalog = catalog
        self._contents = contents
        self._workspaces = workspaces
        self._baselines = baselines
        self._pins = pins
        self._settings = settings
        self._now = now
        self._locks = SandboxLocks()

    def _prune(self) -> None:
        self._baselines.prune(self._control.is_live)
        self._locks.prune(lambda sid: sid in self._baselines)

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
        """Snapshots the current tenant's leased sandbox ``sandbox_id``
        (and ``session``'s cwd and environment, if named)."""
        rec, request = requested(
            self._control, self._baselines, self._settings, sandbox_id,
            session=session, labels=labels, policy_version=policy_version, turn=turn, ttl=ttl,
        )  # fmt: skip
        tenant = current_tenant()
        quota = await within_quota(self._catalog, self._settings, tenant)
        self._prune()
        # One snapshot of a sandbox at a time: each builds on the baseline the
        # previous one leaves (and takes what its journal recorded since).
        async with self._locks.of(rec.sandbox_id):
            return await self._snapshot_locked(rec, request, tenant, quota)

    async def _snapshot_locked(
        self, rec: SandboxRecord, request: SnapshotRequest, tenant: str, quota: int
    ) -> SnapshotInfo:
        started = time.monotonic()
        sandbox_id = rec.sandbox_id
        ns = tenant_namespace(tenant)
        pinned: list[str] = []
        prefetch: Prefetch | None = None
        baseline = self._baselines.get(rec.sandbox_id)
        # The snapshot this one may be recorded as a delta on stays (hidden
        # at worst) until it is recorded.
        base_pin = await self._pins.pin_snapshot(baseline.snapshot_id if baseline is not None else "")
        journal: Journal | None = None
        delta: tuple[list[Entry], list[str]] | None = None
        cutoff = 0.0
        check = SizeCheck(sandbox_id, rec.limits.disk_bytes, quota, tenant)
        failed = False
        try:
            with self._control.using(rec):
                view = await self._workspaces.host_view(rec)
                scan: Scan | None = None
                # In place, the session's state is asked for beside the capture.
                state = (
                    asyncio.ensure_future(self._workspaces.session_state(rec, request.session))
                    if view is not None
                    else None
                )
                try:
                    carried: dict[str, Entry] = {}
                    listing: list[Listed] = []
                    changes = _journal_changes(baseline) if view is not None else None
                    captured = None
                    # Files mapped shared and writable are looked at after the
                    # capture's clock is read and before anything is: one mapped
                    # later stamps a ctime past that clock (never trusted).
                    started_at = time.time()
                    mapped = await asyncio.to_thread(view.mapped) if view is not None else frozenset()
                    recheck = _rechecked(baseline, mapped)
                    compared = baseline
                    if view is not None and changes is not None and recheck is not None:
                        # A journal says what changed since the baseline: look at that only.
                        assert baseline is not None and baseline.journal is not None
                        journal, cutoff = baseline.journal, baseline.cutoff
                        try:
                            captured = await self._contents.from_journal(
                                ns, view, baseline, _with_recheck(changes, recheck, baseline.linked), pinned,
                                check, self._workspaces.owner(rec), started=started_at,
                            )  # fmt: skip
                        except Rewalk:
                            journal, cutoff = None, 0.0
                            baseline.journal.close()
                    elif changes is not None:
                        # Which files were mapped is unknown: every one is read again, after a walk.
                        assert baseline is not None and baseline.journal is not None
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
                            journal = self._baselines.new_journal(baseline)
                        if view is not None and baseline is None:
                            # Everything will be read: list and read in one pass.
                            scan = Scan(
                                view,
                                journal.watch if journal is not None else None,
                                check,
                                self._workspaces.owner(rec),
                                when=started_at,
                            )
                            when = scan.when
                        elif view is not None:
                            _, listing = await self._workspaces.list_in_place(
                                view, journal, self._workspaces.owner(rec)
                            )
                            when = started_at
                            compared = _distrusting(baseline, recheck, listing)
                        else:
                            seen_mapped: set[str] = set()
                            cwd, env, when, listing, carried, prefetch = await self._workspaces.list_through(
                                rec, baseline, request.session, seen_mapped
                            )
                            mapped = frozenset(seen_mapped)
                            compared = _distrusting(baseline, _rechecked(baseline, mapped), listing)
                        by_path, stored, stamps = await self._contents.read(
                            rec, ns, when, listing, compared, pinned, request.session, prefetch, carried,
                            view, scan, check,
                        )  # fmt: skip
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
            # What its owner could not read in the sandbox is refused, read in place or not.
            owners.refuse_unreadable(by_path.values())
            size_bytes = sum(e.size for e in by_path.values() if e.kind == FILE)
            if check.disk_bytes and size_bytes + PAGE_BYTES * len(by_path) > check.disk_bytes:
                # It may not fit: what was read (not listed) is counted exactly.
                check.workspace(by_path.values())
            parent = await parent_of(self._catalog, rec, baseline)
            info = describe(
                rec, request, tenant=tenant, now=self._now(), parent=parent, cwd=cwd, env=env,
                size_bytes=size_bytes, stored_bytes=stored, entry_count=len(by_path),
                digest=mf.digest_of(by_path.values()),
            )  # fmt: skip
            await self._record(info, by_path, quota, baseline, delta)
        except BaseException:
            failed = True
            if journal is not None:
                # A new journal is dropped; a taken one has lost what it
                # recorded: closed, it makes the next snapshot walk.
                journal.close()
            raise
        finally:
            if prefetch is not None:
                await prefetch.close()
            # A refused snapshot leaves nothing stored.
            await unpin_stored(
                self._catalog, self._contents.blobs, self._pins, tenant, pinned,
                failed=failed, what=f"snapshot of {sandbox_id}",
            )  # fmt: skip
            self._pins.unpin_snapshot(base_pin)
        self._baselines.set(
            rec.sandbox_id,
            Baseline(
                info.id,
                info.chain,
                stamps,
                cutoff=cutoff,
                entries=by_path,
                since=when - RACY_SECONDS - DELTA_SLACK,
                journal=journal,
                linked=linked,
                mapped=mapped,
            ),
        )
        rec.labels[LABEL_SNAPSHOT] = info.id
        log.info(
            "snapshot %s of %s: %d entries, %d bytes, %d new (parent %s) in %.1f ms",
            info.id, sandbox_id, info.entry_count, info.size_bytes, stored, info.parent_id or "-",
            (time.monotonic() - started) * 1000,
        )  # fmt: skip
        return info

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


def _rechecked(baseline: Baseline | None, mapped: frozenset[str] | None) -> frozenset[str] | None:
    """Files to read whatever their stamps say: mapped shared and writable
    now or at the baseline's capture (None: any file may be)."""
    if mapped is None or (baseline is not None and baseline.mapped is None):
        return None
    return mapped | baseline.mapped if baseline is not None and baseline.mapped else mapped


def _with_recheck(changes: Changes, recheck: frozenset[str], linked: frozenset[str]) -> Changes:
    """``changes`` with ``recheck`` read again; a file with several names
    changes under all of them, so all are then read again."""
    if not recheck:
        return changes
    if recheck & linked:
        recheck |= linked
    return Changes(changes.touched | recheck, changes.written | recheck, changes.fresh)


def _distrusting(
    baseline: Baseline | None, recheck: frozenset[str] | None, listing: list[Listed]
) -> Baseline | None:
    """``baseline`` as a walked capture compares against it: no stamp of a
    file in ``recheck`` (None: of any file) vouches for its content. A
    restore's cutoff still does: nothing was mapped before it, and the first
    write through a mapping made since moved the file's ctime past it."""
    if baseline is None or recheck == frozenset():
        return baseline
    if recheck is None:
        return dataclasses.replace(baseline, files={})
    several = {i.path for i in listing if i.links > 1}
    if recheck & several:
        recheck |= several
    return dataclasses.replace(baseline, files={p: v for p, v in baseline.files.items() if p not in recheck})


def _journal_changes(baseline: Baseline | None) -> Changes | None:
    """What the baseline's journal recorded since, if it can vouch for that."""
    if baseline is None or baseline.entries is None or baseline.journal is None:
        return None
    return baseline.journal.take()
