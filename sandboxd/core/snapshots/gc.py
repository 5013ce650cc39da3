"""Garbage collection of snapshots: mark and sweep under one lock.

Expired snapshots are dropped (hidden while a delta needs them), the mark set
is every key a remaining snapshot references plus every key *pinned* by a
snapshot or restore in flight, and unmarked store keys are deleted. Capture
pins a blob under the same lock before it checks whether the store holds it,
so the sweep can never delete a blob a new snapshot is about to rely on.
A capture that fails sweeps what it pinned at once (``discard``), by the
same rule.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from sandboxd.core.snapshots.catalog import SnapshotCatalog
from sandboxd.core.snapshots.packs import PackedBlobs
from sandboxd.core.snapshots.tars import Tars

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GcResult:
    """What one collection round did."""

    expired_snapshots: int
    deleted_blobs: int
    kept_blobs: int


class Pins:
    """Blob keys and snapshots that operations in flight rely on; the
    collector spares both. Pinning waits for a sweep in progress, so none
    runs between a pin and the store lookup it guards."""

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        """Held by a collection round from its mark to its sweep."""
        self._keys: Counter[str] = Counter()
        # Snapshots an operation in flight builds on: deleted, they are hidden
        # rather than purged (their manifest and blobs are still needed).
        self._snapshots: Counter[str] = Counter()

    async def pin(self, keys: Iterable[str]) -> list[str]:
        """Pins ``keys`` (once more each); returns them, for ``unpin``."""
        pinned = list(keys)
        async with self.lock:
            self._keys.update(pinned)
        return pinned

    def unpin(self, keys: Iterable[str]) -> None:
        """Drops one pin of each of ``keys``."""
        self._keys.subtract(keys)
        for key in [k for k, n in self._keys.items() if n <= 0]:
            del self._keys[key]

    def holds(self, key: str) -> bool:
        """Whether ``key`` is pinned."""
        return self._keys.get(key, 0) > 0

    def count(self) -> int:
        """Pins held on blob keys, all together (0 when nothing is in flight)."""
        return sum(self._keys.values())

    async def pin_snapshot(self, snapshot_id: str) -> str:
        """Keeps snapshot ``snapshot_id`` (hidden at worst) until unpinned; "" pins nothing."""
        if snapshot_id:
            async with self.lock:
                self._snapshots[snapshot_id] += 1
        return snapshot_id

    def unpin_snapshot(self, snapshot_id: str) -> None:
        """Drops one pin of a snapshot pinned by ``pin_snapshot``."""
        if snapshot_id:
            self._snapshots[snapshot_id] -= 1
            if self._snapshots[snapshot_id] <= 0:
                del self._snapshots[snapshot_id]

    def kept_snapshots(self) -> frozenset[str]:
        """The snapshots a delete or expiry must hide rather than purge."""
        return frozenset(self._snapshots)


async def discard(
    catalog: SnapshotCatalog, blobs: PackedBlobs, pins: Pins, tenant: str, keys: Iterable[str]
) -> int:
    """Deletes those of ``keys`` (of ``tenant``'s namespace, just unpinned
    by a capture that failed) that no snapshot references and nothing pins:
    what the next collection would delete, so that a refused snapshot leaves
    nothing behind. Returns how many."""
    wanted = sorted(set(keys))
    if not wanted:
        return 0
    async with pins.lock:
        free = [k for k in wanted if not pins.holds(k)]
        referenced = await catalog.referenced(tenant, free) if free else set()
        doomed = [k for k in free if k not in referenced]
        await blobs.delete_many(doomed)
    if doomed:
        log.info("snapshot: %d blobs of a failed capture deleted", len(doomed))
    return len(doomed)


async def collect(
    catalog: SnapshotCatalog, blobs: PackedBlobs, pins: Pins, tars: Tars, now: Callable[[], float]
) -> GcResult:
    """Drops expired snapshots, then deletes every stored blob that no
    snapshot references and no operation in flight has pinned."""
    keys = await blobs.list_keys()
    async with pins.lock:
        kept = pins.kept_snapshots()
        expired = await catalog.delete_expired(now(), kept)
        for sid in expired:
            tars.forget(sid)
        await catalog.sweep_hidden(kept)
        live = await catalog.live_keys()
        doomed = [k for k in keys if k not in live and not pins.holds(k)]
        await blobs.delete_many(doomed)
        await blobs.sweep_packs()
    if expired or doomed:
        log.info("snapshot GC: %d expired snapshots, %d blobs deleted", len(expired), len(doomed))
    return GcResult(len(expired), len(doomed), len(keys) - len(doomed))
