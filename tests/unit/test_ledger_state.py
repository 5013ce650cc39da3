"""LedgerStateStore: leases and pools kept by a backend that is a Ledger, with
heartbeat writes coalesced (the recorded expiry is an upper bound)."""

from __future__ import annotations

import asyncio

import pytest

from sandboxd.backends.base import LeaseMark, Ledger, Limits
from sandboxd.backends.fake import FakeBackend
from sandboxd.clock import SystemClock
from sandboxd.core.control import ControlPlane
from sandboxd.core.leases import Lease
from sandboxd.core.ledger_state import LedgerStateStore
from sandboxd.core.lifecycle import State
from sandboxd.core.pools import PoolConfig
from sandboxd.errors import TransientBackendError
from tests.unit.conftest import Harness, make_settings, wait_for

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
    store = LedgerStateStore(ledger, slack=0.5)
    handles = ["pod-a", "pod-b"]
    await store.save_lease(lease(1000.0), handles)
    await store.flush()
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
    store = LedgerStateStore(ledger, slack=0.5)
    await store.save_lease(lease(1000.0), ["pod-a"])
    await store.flush()
    ledger.fail = True
    with pytest.raises(TransientBackendError):
        await store.save_lease(lease(1020.0), ["pod-a"])
    ledger.fail = False
    await store.save_lease(lease(1020.0), ["pod-a"])
    assert ledger.marks["pod-a"].expires_wall == 1035.0


async def test_a_new_lease_is_written_behind_its_answer_and_a_heartbeat_retries_it() -> None:
    ledger = MemoryLedger()
    gate = asyncio.Event()
    real = ledger.mark_leased

    async def slow(handle: str, mark: LeaseMark) -> None:
        await gate.wait()
        await real(handle, mark)

    ledger.mark_leased = slow  # type: ignore[method-assign]
    store = LedgerStateStore(ledger, slack=0.5)
    await store.save_lease(lease(1000.0), ["pod-a"])  # answers with the write still out
    assert ledger.writes == 0
    gate.set()
    await store.flush()
    assert ledger.marks["pod-a"].expires_wall == 1015.0
    # A write behind that fails is logged, and the next heartbeat makes it.
    ledger.mark_leased = real  # type: ignore[method-assign]
    ledger.fail = True
    second = Lease("ls-2", "p", ["c"], 30.0, 1000.0, 1000.0, {})
    await store.save_lease(second, ["pod-c"])
    await store.flush()
    assert "pod-c" not in ledger.marks
    ledger.fail = False
    await store.save_lease(second, ["pod-c"])
    assert ledger.marks["pod-c"].lease_id == "ls-2"


async def test_a_new_replica_loads_leases_and_pools_without_rewriting() -> None:
    ledger = MemoryLedger()
    first = LedgerStateStore(ledger)
    config = PoolConfig("t/p", "img", 1, 4, Limits(memory_bytes=1 << 26))
    await first.save_pool(config)
    await first.save_lease(lease(1000.0), ["pod-a", "pod-b"])
    await first.flush()
    writes = ledger.writes
    second = LedgerStateStore(ledger)
    assert await second.load_pools() == [config]
    (loaded,) = await second.load_leases()
    assert loaded == ("ls-1", "p", ["a", "b"], 30.0, 1015.0, {"run": "r"}, [])
    # Adoption saves the lease back as found: nothing to write.
    await second.save_lease(lease(1015.0), ["pod-a", "pod-b"])
    assert ledger.writes == writes
    await second.delete_pool("t/p")
    assert await second.load_pools() == []


class LedgerFake(FakeBackend):
    """The fake engine keeping pools and leases itself, as the Kubernetes
    backend does on the API server (marks live and die with sandboxes)."""

    def __init__(self) -> None:
        super().__init__()
        self.ledger = MemoryLedger()

    async def load_pool_specs(self) -> dict[str, str]:
        return await self.ledger.load_pool_specs()

    async def save_pool_spec(self, key: str, spec: str) -> None:
        await self.ledger.save_pool_spec(key, spec)

    async def delete_pool_spec(self, key: str) -> None:
        await self.ledger.delete_pool_spec(key)

    async def mark_leased(self, handle: str, mark: LeaseMark) -> None:
        await self.ledger.mark_leased(handle, mark)

    async def lease_marks(self) -> list[tuple[str, str, LeaseMark]]:
        return [
            (box.spec.sandbox_id, h, self.ledger.marks[h])
            for h, box in self.sandboxes.items()
            if h in self.ledger.marks
        ]


async def test_a_replica_with_no_disk_of_its_own_adopts_from_the_backend(no_task_leaks: None) -> None:
    backend = LedgerFake()
    assert isinstance(backend, Ledger)
    settings = make_settings()

    async def start() -> Harness:
        control = ControlPlane(settings, backend, LedgerStateStore(backend), SystemClock())
        await control.start()
        return Harness(control, backend, control.clock, settings)

    first = await start()
    second: Harness | None = None
    try:
        pool = await first.warm_pool(min_ready=1, max_size=4)
        lease, records = await first.acquire(n=2, labels={"run": "r1"}, ttl=600.0)
        await wait_for(lambda: pool.ready == 1 and pool.creating == 0, what="refilled")
        warm = {r.handle for r in pool.records.values() if r.state is State.READY}
        await first.crash()
        second = await start()  # same backend, nothing else shared
        adopted = second.control.get_lease(lease.lease_id)
        assert sorted(adopted.sandbox_ids) == sorted(r.sandbox_id for r in records)
        assert adopted.labels == {"run": "r1"}
        assert second.control.get_pool("p").config.min_ready == 1
        assert not warm & set(backend.sandboxes)
        writes = backend.ledger.writes
        await second.control.heartbeat(lease.lease_id, 0.0)  # nothing due: no write
        assert backend.ledger.writes == writes
    finally:
        if second is not None:
            await second.stop()
        await first.stop()
