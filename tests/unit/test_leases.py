"""Leases: release, heartbeat, expiry (FakeClock), restart adoption."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from sandboxd.backends.fake import FakeBackend
from sandboxd.core.lifecycle import State
from sandboxd.errors import InvalidArgument, NotFound
from tests.unit.conftest import UNKNOWN_LEASE, UNKNOWN_SANDBOX, Harness, MakeControl, wait_for

pytestmark = pytest.mark.timeout(30)


async def test_release_is_idempotent(h: Harness) -> None:
    pool = await h.warm_pool(min_ready=1, max_size=4)
    lease, records = await h.acquire()
    assert await h.control.release(lease.lease_id, []) == [records[0].sandbox_id]
    assert await h.control.release(lease.lease_id, []) == []
    assert await h.control.release(lease.lease_id, [records[0].sandbox_id]) == []
    await wait_for(lambda: pool.count(State.RELEASING) == 0, what="destroyed")
    assert h.backend.destroys == 1


async def test_release_part_of_a_group(h: Harness) -> None:
    await h.warm_pool(min_ready=3, max_size=4)
    lease, records = await h.acquire(n=3)
    first, *rest = (r.sandbox_id for r in records)
    assert await h.control.release(lease.lease_id, [first]) == [first]
    assert sorted(h.control.get_lease(lease.lease_id).sandbox_ids) == sorted(rest)
    assert all(r.state is State.LEASED for r in records[1:])
    # Releasing the last ones ends the lease.
    assert sorted(await h.control.release(lease.lease_id, rest)) == sorted(rest)
    with pytest.raises(NotFound):
        h.control.get_lease(lease.lease_id)


async def test_unknown_lease_is_not_found(h: Harness) -> None:
    with pytest.raises(NotFound, match=UNKNOWN_LEASE):
        await h.control.release(UNKNOWN_LEASE, [])
    with pytest.raises(NotFound, match=UNKNOWN_LEASE):
        await h.control.heartbeat(UNKNOWN_LEASE, 0)


async def test_malformed_lease_id_is_invalid_not_missing(h: Harness) -> None:
    with pytest.raises(InvalidArgument) as info:
        await h.control.release("not-a-lease", [])
    assert info.value.field == "lease_id"


async def test_unknown_sandbox_is_not_found(h: Harness) -> None:
    with pytest.raises(NotFound, match=UNKNOWN_SANDBOX):
        h.control.get_sandbox(UNKNOWN_SANDBOX)


async def test_sandbox_not_in_the_lease_is_not_found(h: Harness) -> None:
    await h.warm_pool(min_ready=2, max_size=4)
    lease_a, (a,) = await h.acquire()
    lease_b, (b,) = await h.acquire()
    with pytest.raises(NotFound, match=r"sandbox_ids\[1\]") as info:
        await h.control.release(lease_a.lease_id, [a.sandbox_id, b.sandbox_id])
    assert lease_b.lease_id not in str(info.value)
    # Nothing was released by the failed call.
    assert a.state is State.LEASED and b.state is State.LEASED
    assert h.control.get_lease(lease_a.lease_id).sandbox_ids == [a.sandbox_id]


async def test_heartbeat_extends_the_lease(fh: Harness) -> None:
    await fh.pool(min_ready=0, max_size=2)
    lease, (rec,) = await fh.acquire(ttl=10.0)
    first_expiry = lease.expires_at
    fh.fake_clock.advance(8.0)
    beat = await fh.control.heartbeat(lease.lease_id, 0.0)
    assert beat.expires_at == pytest.approx(first_expiry + 8.0)
    fh.fake_clock.advance(8.0)  # 16 s after acquire: expired without the heartbeat
    assert await fh.control.reap_expired() == 0
    assert rec.state is State.LEASED
    # A heartbeat may also change the TTL.
    await fh.control.heartbeat(lease.lease_id, 30.0)
    fh.fake_clock.advance(29.0)
    assert await fh.control.reap_expired() == 0
    fh.fake_clock.advance(2.0)
    assert await fh.control.reap_expired() == 1


async def test_lease_expiry_reclaims_the_sandboxes(fh: Harness) -> None:
    pool = await fh.warm_pool(min_ready=1, max_size=4)
    lease, records = await fh.acquire(n=2, ttl=10.0)
    fh.fake_clock.advance(9.9)
    assert await fh.control.reap_expired() == 0
    fh.fake_clock.advance(0.2)
    assert await fh.control.reap_expired() == 1
    with pytest.raises(NotFound):
        await fh.control.heartbeat(lease.lease_id, 0.0)
    # Released with the reason, then destroyed; releasing again is a no-op.
    assert all(r.failure_reason == "lease expired" for r in records)
    await wait_for(lambda: all(r.state is State.GONE for r in records), what="destroyed")
    assert not {r.handle for r in records} & set(fh.backend.sandboxes)
    assert await fh.control.release(lease.lease_id, []) == []
    await wait_for(lambda: pool.ready == 1 and pool.count(State.LEASED) == 0, what="pool steady")


async def test_lease_with_exec_in_flight_is_not_reaped_until_it_finishes(fh: Harness) -> None:
    await fh.pool(min_ready=0, max_size=2)
    _lease, (rec,) = await fh.acquire(ttl=5.0)
    gate = asyncio.Event()
    original = fh.backend._builtin

    # A command that runs until the test opens the gate (no timing involved).
    async def gated(
        box: Any, shell: Any, words: list[str], env: dict[str, str], stdin: bytes, emit: Any
    ) -> int:
        if words[0] == "wait-for-gate":
            await gate.wait()
            return 0
        return await original(box, shell, words, env, stdin, emit)

    fh.backend._builtin = gated  # type: ignore[method-assign]
    running = asyncio.create_task(fh.exec(rec.sandbox_id, "wait-for-gate", timeout=20.0))
    try:
        await wait_for(lambda: fh.control._busy.get(rec.sandbox_id) == 1, what="exec started")
        fh.fake_clock.advance(60.0)
        assert await fh.control.reap_expired() == 0
        assert rec.state is State.LEASED
    finally:
        gate.set()
        result, _, _ = await running
    assert result.exit_code == 0
    assert await fh.control.reap_expired() == 1
    assert rec.state in (State.RELEASING, State.GONE)


async def test_lifetime_caps_heartbeats(fh: Harness) -> None:
    from sandboxd.backends.base import Limits

    await fh.pool(min_ready=0, max_size=2, limits=Limits(lifetime_seconds=20))
    lease, _ = await fh.acquire(ttl=15.0)
    fh.fake_clock.advance(10.0)
    beat = await fh.control.heartbeat(lease.lease_id, 15.0)
    # Asked for 15 s more, but the lifetime ends 20 s after the acquire.
    assert beat.expires_at == pytest.approx(fh.clock.monotonic() + 10.0)
    fh.fake_clock.advance(10.0)
    assert await fh.control.reap_expired() == 1


async def test_restart_adopts_leased_and_destroys_unleased(make_control: MakeControl, tmp_path: Path) -> None:
    backend = FakeBackend()
    store = tmp_path / "state.sqlite3"
    first = await make_control(backend=backend, store_path=store)
    pool = await first.warm_pool(min_ready=2, max_size=6)
    lease, records = await first.acquire(n=2, labels={"run": "r1"}, ttl=600.0)
    await wait_for(lambda: pool.ready == 2 and pool.creating == 0, what="refilled")
    leased = {r.sandbox_id: r.handle for r in records}
    warm = {r.handle for r in pool.records.values() if r.state is State.READY}
    assert len(warm) == 2
    await first.exec(records[0].sandbox_id, "true")
    await first.crash()
    assert set(backend.sandboxes) == set(leased.values()) | warm

    second = await make_control(backend=backend, store_path=store)
    adopted = second.control.get_lease(lease.lease_id)
    assert sorted(adopted.sandbox_ids) == sorted(leased)
    assert adopted.labels == {"run": "r1"}
    for sid, handle in leased.items():
        rec = second.control.get_sandbox(sid)
        assert rec.state is State.LEASED
        assert rec.lease_id == lease.lease_id
        assert rec.handle == handle
        assert rec.labels["run"] == "r1"
        assert handle in backend.sandboxes
    # The warm ones of the crashed run are gone (their cleanliness is unknown).
    assert not warm & set(backend.sandboxes)
    # The adopted sandboxes work and release normally; the pool rewarms.
    _result, out, _ = await second.exec(records[0].sandbox_id, "echo still-here")
    assert out == b"still-here\n"
    new_pool = second.control.get_pool("p")
    await wait_for(lambda: new_pool.ready == 2, what="rewarmed")
    assert sorted(await second.control.release(lease.lease_id, [])) == sorted(leased)
    await wait_for(lambda: not set(leased.values()) & set(backend.sandboxes), what="adopted destroyed")


async def test_restart_drops_expired_leases(make_control: MakeControl, tmp_path: Path) -> None:
    from sandboxd.clock import FakeClock

    backend = FakeBackend()
    store = tmp_path / "state.sqlite3"
    clock = FakeClock()
    first = await make_control(
        backend=backend, clock=clock, store_path=store, leases__reap_interval_seconds=3600.0
    )
    await first.pool(min_ready=0, max_size=2)
    lease, (rec,) = await first.acquire(ttl=10.0)
    await first.crash()
    clock.advance(11.0)  # it expired while no server was running
    second = await make_control(
        backend=backend, clock=clock, store_path=store, leases__reap_interval_seconds=3600.0
    )
    with pytest.raises(NotFound):
        second.control.get_lease(lease.lease_id)
    assert rec.handle not in backend.sandboxes
    assert await second.control.store.load_leases() == []


async def test_orphans_are_swept_after_two_sightings(h: Harness) -> None:
    """A sandbox on the backend that no pool knows is removed, but only when
    seen twice, so a create in flight is never mistaken for one."""
    from sandboxd.backends.base import Limits, SandboxSpec

    handle = await h.backend.create(SandboxSpec("sb-0123456789ab", "ghost", "img", Limits()))
    assert await h.control.sweep_orphans() == 0
    assert handle in h.backend.sandboxes
    assert await h.control.sweep_orphans() == 1
    assert handle not in h.backend.sandboxes
