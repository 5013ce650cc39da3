"""The control plane's durable state kept by a Ledger backend (Kubernetes:
pool specs in a ConfigMap, each lease on its Pods), so a replica with an
empty disk (a standby that became leader) adopts what the previous leader
leased.

Heartbeats are coalesced: the expiry recorded on a sandbox is the lease's
real expiry plus ``slack`` x its TTL, and it is rewritten only when a
heartbeat moves the real expiry past the recorded one. The record is thus
always an upper bound (a replica taking over never reclaims a lease its
client kept alive), at the cost of keeping an abandoned lease's sandboxes up
to ``slack`` x TTL longer after a failover; with heartbeats every TTL/3 and
slack 0.5, one heartbeat in two writes nothing.

Releases write nothing: a released sandbox is destroyed, and a sandbox that
outlives its release (a destroy cut short) carries a lease that expires by
itself and is then reclaimed.

A new lease is written *behind* its Acquire: the answer does not wait for the
merge patches (one per Pod, each an API server round trip that at hundreds
of claims a second queued Acquires behind one another); they go out at once,
retried, and a heartbeat writes whatever did not make it. A replica that
takes over within that moment finds those Pods without a lease and deletes
them, as it does warm ones: the client gets NOT_FOUND, as for a lease that
expired. Nothing is orphaned and no sandbox is handed out twice.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from sandboxd.backends.base import LeaseMark, Ledger
from sandboxd.core.leases import Lease
from sandboxd.core.pools import PoolConfig
from sandboxd.core.state import PersistedLease, pool_from_json, pool_to_json
from sandboxd.errors import SandboxLost

log = logging.getLogger(__name__)

Written = dict[str, tuple[float, float, dict[str, str], tuple[str, ...]]]
"""handle -> (recorded expiry, ttl, labels) as last written."""


class LedgerStateStore:
    """The StateStore kept on a Ledger backend, heartbeats coalesced."""

    def __init__(self, ledger: Ledger, *, slack: float = 0.5, write_behind: bool = True) -> None:
        self._ledger = ledger
        self._slack = slack
        self._write_behind = write_behind
        self._written: dict[str, Written] = {}
        self._behind: set[asyncio.Task[None]] = set()

    async def open(self) -> None:
        """Nothing to open: the backend itself holds the state."""

    async def close(self) -> None:
        """Waits for the records of new leases still going out."""
        await self.flush()

    async def flush(self) -> None:
        """Waits for the writes of new leases still going out."""
        while self._behind:
            await asyncio.gather(*self._behind, return_exceptions=True)

    async def save_pool(self, config: PoolConfig) -> None:
        """Writes the spec to the backend (Kubernetes: a ConfigMap key); durable on return."""
        await self._ledger.save_pool_spec(config.name, pool_to_json(config))

    async def delete_pool(self, name: str) -> None:
        """Removes the spec from the backend; one already gone is no error."""
        await self._ledger.delete_pool_spec(name)

    async def load_pools(self) -> list[PoolConfig]:
        """Every pool spec the backend holds for this instance, whichever replica wrote it."""
        return [pool_from_json(spec) for spec in (await self._ledger.load_pool_specs()).values()]

    async def save_lease(self, lease: Lease, handles: Sequence[str] = ()) -> None:
        """Marks only the sandboxes whose record falls short of the lease; a new lease's marks go
        out behind the call (unless write-behind is off), a heartbeat's before it returns."""
        new = lease.lease_id not in self._written
        before = self._written.get(lease.lease_id, {})
        written = {h: before[h] for h in handles if h in before}
        self._written[lease.lease_id] = written
        due = [
            h
            for h in handles
            if h not in written
            or lease.expires_wall > written[h][0]
            or (lease.ttl, lease.labels, lease.network) != written[h][1:]
        ]
        if not due:
            return
        mark = LeaseMark(
            lease.lease_id,
            lease.pool,
            lease.ttl,
            lease.expires_wall + self._slack * lease.ttl,
            dict(lease.labels),
            lease.network,
        )
        if new and self._write_behind:
            task = asyncio.create_task(self._write(written, due, mark, behind=True))
            self._behind.add(task)
            task.add_done_callback(self._behind.discard)
            return
        await self._write(written, due, mark, behind=False)

    async def _write(self, written: Written, due: list[str], mark: LeaseMark, *, behind: bool) -> None:
        results = await asyncio.gather(
            *(self._ledger.mark_leased(h, mark) for h in due), return_exceptions=True
        )
        for h, result in zip(due, results, strict=True):
            if not isinstance(result, BaseException):
                written[h] = (mark.expires_wall, mark.ttl, dict(mark.labels), tuple(mark.network))
        for result in results:
            if isinstance(result, BaseException):
                if not behind:
                    raise result
                if isinstance(result, SandboxLost):
                    # Released (and deleted) before its record went out: nothing to keep.
                    log.debug("lease %s: %s", mark.lease_id, result)
                else:
                    # The next heartbeat writes it; until then a takeover would reclaim it.
                    log.warning("lease %s not recorded yet: %s", mark.lease_id, result)

    async def delete_lease(self, lease_id: str) -> None:
        """Writes nothing (a released sandbox is destroyed); only forgets what was recorded."""
        self._written.pop(lease_id, None)

    async def load_leases(self) -> list[PersistedLease]:
        """Leases as recorded on the sandboxes; one lease's sandboxes may
        carry different expiries (a heartbeat's writes cut short): the
        latest counts."""
        grouped: dict[str, tuple[LeaseMark, list[str]]] = {}
        self._written.clear()
        for sandbox_id, handle, mark in sorted(await self._ledger.lease_marks(), key=lambda m: m[0]):
            # What is on the backend counts as written: adopting the lease
            # does not push its expiry out again.
            self._written.setdefault(mark.lease_id, {})[handle] = (
                mark.expires_wall,
                mark.ttl,
                dict(mark.labels),
                tuple(mark.network),
            )
            have = grouped.get(mark.lease_id)
            if have is None or mark.expires_wall > have[0].expires_wall:
                grouped[mark.lease_id] = (mark, have[1] if have else [])
            grouped[mark.lease_id][1].append(sandbox_id)
        return [
            (m.lease_id, m.pool, ids, m.ttl, m.expires_wall, dict(m.labels), list(m.network))
            for m, ids in grouped.values()
        ]
