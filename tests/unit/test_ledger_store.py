"""LedgerStore: leases and pools kept by a backend that is a Ledger, with
heartbeat writes coalesced (the recorded expiry is an upper bound)."""

from __future__ import annotations

import pytest

from sandboxd.backends.base import LeaseMark, Ledger, Limits
from sandboxd.core.leases import Lease
from sandboxd.core.ledger_store import LedgerStore
from sandboxd.core.pools import PoolConfig
from sandboxd.errors import TransientBackendError

pytestmark = pytest.mark.timeout(30)


class MemoryLedger:
    """A Ledger in memory, counting writes."""

    def __init__(self) -> None:
        self.pools: dict[str, str] = {}
        self.marks: dict[str, LeaseMark] = {}
        self.writes = 0
        self.fail = False

    async def load_pool_specs(self) -> dict[str, str]:
        return dict(self.pools)

    async def save_pool_spec(self, key: str, spec: str) -> None:
        self.pools[key] = spec

    async def delete_pool_spec(self, key: str) -> None:
        self.pools.pop(key, None)

    async def mark_leased(self, handle: str, mark: LeaseMark) -> None:
        if self.fail:
            raise TransientBackendError("API server unreachable")
        self.writes += 1
        self.marks[handle] = mark

    async def lease_marks(self) -> list[tuple[str, str, LeaseMark]]:
        return [(h.removeprefix("pod-"), h, m) for h, m in self.marks.items()]


def lease(expires_wall: float, ttl: float = 30.0, ids: tuple[str, ...] = ("a", "b")) -> Lease:
    return Lease("ls-1", "p", list(ids), ttl, expires_wall, expires_wall, {"run": "r"})


async def test_heartbeats_write_only_when_the_expiry_passes_the_recorded_one() -> None:
    ledger = MemoryLedger()
    assert isinstance(ledger, Ledger)
    store = LedgerStore(ledger, slack=0.5)
    handles = ["pod-a", "pod-b"]
    await store.save_lease(lease(1000.0), handles)
    assert ledger.writes == 2 and ledger.marks["pod-a"].expires_wall == 1015.0
    # Heartbeats every TTL/3 (10 s): the second one passes 1015.
    await store.save_lease(lease(1010.0), handles)
    assert ledger.writes == 2
    await store.save_lease(lease(1020.0), handles)
    assert ledger.writes == 4 and ledger.marks["pod-b"].expires_wall == 1035.0
    # A new TTL is written at once.
    await store.save_lease(lease(1021.0, ttl=60.0), handles)
    assert ledger.writes == 6 and ledger.marks["pod-a"].ttl == 60.0


async def test_a_failed_write_is_reported_and_retried_by_the_next_heartbeat() -> None:
    ledger = MemoryLedger()
    store = LedgerStore(ledger, slack=0.5)
    await store.save_lease(lease(1000.0), ["pod-a"])
    ledger.fail = True
    with pytest.raises(TransientBackendError):
        await store.save_lease(lease(1020.0), ["pod-a"])
    ledger.fail = False
    await store.save_lease(lease(1020.0), ["pod-a"])
    assert ledger.marks["pod-a"].expires_wall == 1035.0


async def test_a_new_replica_loads_leases_and_pools_without_rewriting() -> None:
    ledger = MemoryLedger()
    first = LedgerStore(ledger)
    config = PoolConfig("t/p", "img", 1, 4, Limits(memory_bytes=1 << 26))
    await first.save_pool(config)
    await first.save_lease(lease(1000.0), ["pod-a", "pod-b"])
    writes = ledger.writes
    second = LedgerStore(ledger)
    assert await second.load_pools() == [config]
    (loaded,) = await second.load_leases()
    assert loaded == ("ls-1", "p", ["a", "b"], 30.0, 1015.0, {"run": "r"})
    # Adoption saves the lease back as found: nothing to write.
    await second.save_lease(lease(1015.0), ["pod-a", "pod-b"])
    assert ledger.writes == writes
    await second.delete_pool("t/p")
    assert await second.load_pools() == []
