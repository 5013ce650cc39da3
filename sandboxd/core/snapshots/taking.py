"""What taking a file snapshot (sandboxd.core.snapshots.capture) and taking a
live one (sandboxd.core.snapshots.live) have in common: the request checked
the same way (a leased sandbox no restore is writing into, the session,
labels, TTL and turn, the tenant's quota), one snapshot of a sandbox at a
time, the snapshot described the same way (SnapshotInfo, its chain ending
with itself), and what a failed one stored dropped at once."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sandboxd.core import validation as v
from sandboxd.core.lifecycle import SandboxRecord
from sandboxd.core.snapshots.baselines import Baselines
from sandboxd.core.snapshots.catalog import SnapshotCatalog
from sandboxd.core.snapshots.gc import Pins, discard
from sandboxd.core.snapshots.info import ChainRef, SnapshotInfo
from sandboxd.core.snapshots.lineage import new_snapshot_id
from sandboxd.core.snapshots.packs import PackedBlobs
from sandboxd.core.tenancy import split_pool_key
from sandboxd.errors import InvalidArgument, ResourceExhausted
from sandboxd.settings import SnapshotSettings

if TYPE_CHECKING:
    from sandboxd.core.control import ControlPlane

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SnapshotRequest:
    """A snapshot's own arguments, checked (``requested``)."""

    session: str
    labels: dict[str, str]
    policy_version: int | None
    turn: int
    ttl: float
    """Seconds; the server's default where none was asked for."""


def requested(
    control: ControlPlane,
    baselines: Baselines,
    settings: SnapshotSettings,
    sandbox_id: str,
    *,
    session: str,
    labels: dict[str, str] | None,
    policy_version: int | None,
    turn: int,
    ttl: float,
) -> tuple[SandboxRecord, SnapshotRequest]:
    """The current tenant's leased sandbox ``sandbox_id`` and the snapshot's
    arguments, checked: NotFound, FailedPrecondition (not leased, or a
    restore into it still in progress) or InvalidArgument otherwise."""
    rec = control.leased(sandbox_id)
    baselines.refuse_restoring(rec)
    session = v.session_name("session", session)
    checked_labels = v.labels("labels", labels or {})
    ttl = v.non_negative("ttl_seconds", ttl, settings.max_ttl_seconds)
    ttl = ttl or settings.default_ttl_seconds
    if turn < 0:
        raise InvalidArgument("turn", f"must be >= 0, got {turn}")
    return rec, SnapshotRequest(session, checked_labels, policy_version, turn, ttl)


def tenant_quota(settings: SnapshotSettings, tenant: str) -> int:
    """Bytes of snapshots ``tenant`` may store (0 = no limit)."""
    return settings.tenant_quota_bytes.get(tenant, settings.quota_bytes)


async def within_quota(catalog: SnapshotCatalog, settings: SnapshotSettings, tenant: str) -> int:
    """The tenant's quota (tenant_quota); ResourceExhausted if it is used up
    already. The insert checks it again, with the snapshot's own bytes."""
    quota = tenant_quota(settings, tenant)
    if quota and await catalog.usage(tenant) >= quota:
        raise ResourceExhausted(
            f"snapshot quota of tenant {tenant!r} ({quota} bytes) is used up; "
            "delete snapshots or let them expire"
        )
    return quota


class SandboxLocks:
    """One lock per sandbox: a snapshot of a sandbox waits for the one before."""

    def __init__(self) -> None:
        self._locks: dict[str, asyncio.Lock] = {}

    def of(self, sandbox_id: str) -> asyncio.Lock:
        """The sandbox's lock (made on first use)."""
        return self._locks.setdefault(sandbox_id, asyncio.Lock())

    def prune(self, keep: Callable[[str], bool]) -> None:
        """Forgets the locks nobody holds of sandboxes ``keep`` lets go."""
        for sid in [s for s, lock in self._locks.items() if not lock.locked() and not keep(s)]:
            del self._locks[sid]


def describe(
    rec: SandboxRecord,
    request: SnapshotRequest,
    *,
    tenant: str,
    now: float,
    parent: tuple[str, list[ChainRef]],
    cwd: str,
    env: dict[str, str],
    size_bytes: int,
    stored_bytes: int,
    entry_count: int,
    digest: str,
    live: bool = False,
    not_carried: list[str] | None = None,
) -> SnapshotInfo:
    """A new snapshot of ``rec`` taken ``now``, with a fresh id; ``parent``
    is (parent id, the parent's chain), which the new chain extends."""
    parent_id, chain = parent
    info = SnapshotInfo(
        id=new_snapshot_id(),
        tenant=tenant,
        pool=split_pool_key(rec.pool)[1],
        image=rec.image,
        labels=request.labels,
        policy_version=request.policy_version,
        turn=request.turn,
        parent_id=parent_id,
        session=request.session,
        cwd=cwd,
        env=env,
        size_bytes=size_bytes,
        stored_bytes=stored_bytes,
        entry_count=entry_count,
        digest=digest,
        created_at=now,
        expires_at=now + request.ttl,
        live=live,
        memory_limit_bytes=rec.limits.memory_bytes if live else 0,
        not_carried=not_carried or [],
    )
    info.chain = [*chain, info.ref()]
    return info


async def unpin_stored(
    catalog: SnapshotCatalog,
    blobs: PackedBlobs,
    pins: Pins,
    tenant: str,
    pinned: list[str],
    *,
    failed: bool,
    what: str,
) -> None:
    """Lets go of the blobs a snapshot stored (``pinned``); where it
    ``failed`` (or was refused), deletes at once those nothing else needs,
    rather than at the next collection. ``what`` names it in the log."""
    pins.unpin(pinned)
    if failed and pinned:
        try:
            await discard(catalog, blobs, pins, tenant, pinned)
        except Exception:  # the collector takes what is left
            log.exception("%s: dropping what it stored failed", what)
