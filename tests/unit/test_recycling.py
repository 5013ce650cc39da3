"""Recycling pools on the fake backend: a released sandbox is reset in place
and handed out again only when nothing of it is in doubt, never to another
tenant (nor another run, for same-run), never while an operation of it is in
flight; resets are counted as starts and measured beside creates."""

from __future__ import annotations

from typing import Any

import pytest

from sandboxd.backends.base import Limits
from sandboxd.backends.fake import FakeBackend
from sandboxd.core.lifecycle import SandboxRecord, State
from sandboxd.core.pools import PoolConfig, WarmPool
from sandboxd.core.pools.recycle import DEFAULT_MAX_USES, RunReserve, check_recycle
from sandboxd.core.tenancy import acting_as
from sandboxd.errors import FailedPrecondition, InvalidArgument
from tests.unit.conftest import IMAGE, Harness, wait_for

pytestmark = pytest.mark.timeout(30)


async def _pool(h: Harness, name: str = "p", **kw: Any) -> WarmPool:
    kw.setdefault("recycle", "same-tenant")
    pool = await h.control.create_pool(
        PoolConfig(name, IMAGE, kw.pop("min_ready", 1), kw.pop("max_size", 4), Limits(), **kw)
    )
    await wait_for(lambda: pool.ready >= pool.config.min_ready and pool.creating == 0, what="pool warm")
    return pool


async def _use_and_release(h: Harness, pool: WarmPool, labels: dict[str, str] | None = None) -> SandboxRecord:
    lease, records = await h.acquire(pool.config.name.rpartition("/")[2], labels=labels)
    rec = records[0]
    box = h.backend.sandboxes[rec.handle]
    # A tenant's leftovers: files in the workspace and /tmp, a session's state.
    box.files["/workspace/secret.txt"] = (b"prior tenant", 0o644)
    box.files["/tmp/cache.bin"] = (b"x" * 100, 0o600)
    box.dirs.add("/workspace/deep")
    _result, out, _ = await h.exec(rec.sandbox_id, "export TOKEN=abc; env", session="agent")
    assert b"TOKEN=abc" in out
    await h.control.release(lease.lease_id, [])
    return rec


def _settled(pool: WarmPool) -> bool:
    return pool.resetting == 0 and pool.destroying == 0


async def test_a_released_sandbox_comes_back_clean_and_is_handed_out_again(h: Harness) -> None:
    pool = await _pool(h, min_ready=0, max_size=1)
    rec = await _use_and_release(h, pool, labels={"rollout": "r1"})
    await wait_for(lambda: _settled(pool) and rec.state is State.READY, what="reset")
    # The one create the first acquire waited for; the reset replaced the rest.
    assert h.backend.resets == 1 and h.backend.creates == 1
    assert pool.recycled_total == 1 and rec.uses == 1
    box = h.backend.sandboxes[rec.handle]
    assert "/workspace/secret.txt" not in box.files and "/tmp/cache.bin" not in box.files
    assert "/workspace/deep" not in box.dirs
    assert not box.sessions
    # The previous lease's labels are not the next one's.
    assert "rollout" not in rec.labels
    _lease, again = await h.acquire("p")
    assert again == [rec]
    _result, out, _ = await h.exec(rec.sandbox_id, "env", session="agent")
    assert b"TOKEN" not in out


@pytest.mark.parametrize("hostile", ["leave_process", "tamper", "oom", "reset_fails"])
async def test_anything_in_doubt_destroys_the_sandbox(h: Harness, hostile: str) -> None:
    pool = await _pool(h)
    _lease, records = await h.acquire("p")
    rec = records[0]
    box = h.backend.sandboxes[rec.handle]
    box.files["/workspace/given.txt"] = (b"given", 0o644)
    if hostile == "leave_process":
        h.backend.leave_process(rec.handle)
    elif hostile == "tamper":
        h.backend.tamper(rec.handle, "/workspace")
    elif hostile == "oom":
        h.backend.oom(rec.handle)
    else:
        h.backend.reset_failures = 1
    await h.control.release(_lease.lease_id, [])
    await wait_for(lambda: rec.state is State.GONE and _settled(pool), what="destroyed")
    assert rec.handle not in h.backend.sandboxes
    assert pool.recycled_total == 0
    assert pool._recycler.destroyed == {"failed" if hostile == "reset_fails" else "check": 1}


async def test_max_uses_ends_a_sandbox(h: Harness) -> None:
    pool = await _pool(h, max_uses=2, min_ready=1, max_size=1)
    rec = await _use_and_release(h, pool)
    await wait_for(lambda: rec.state is State.READY and _settled(pool), what="first reset")
    again = await _use_and_release(h, pool)
    assert again is rec
    await wait_for(lambda: rec.state is State.GONE and _settled(pool), what="destroyed at max_uses")
    assert pool._recycler.destroyed == {"max uses": 1}
    await wait_for(lambda: pool.ready == 1, what="replaced")


async def test_never_reset_while_an_operation_of_it_is_in_flight(h: Harness) -> None:
    pool = await _pool(h)
    lease, records = await h.acquire("p")
    rec = records[0]
    # As a snapshot's capture or a fork's read holds it.
    with h.control.using(rec):
        await h.control.release(lease.lease_id, [])
    await wait_for(lambda: rec.state is State.GONE and _settled(pool), what="destroyed")
    assert h.backend.resets == 0 and pool._recycler.destroyed == {"in use": 1}


async def test_off_destroys_as_before(h: Harness) -> None:
    pool = await _pool(h, recycle="off")
    lease, records = await h.acquire("p")
    await h.control.release(lease.lease_id, [])
    await wait_for(lambda: records[0].state is State.GONE and _settled(pool), what="destroyed")
    assert h.backend.resets == 0 and pool.recycled_total == 0


async def test_same_run_goes_back_to_its_run_only(h: Harness) -> None:
    pool = await _pool(h, recycle="same-run", recycle_label="run", min_ready=1, max_size=4)
    rec = await _use_and_release(h, pool, labels={"run": "a"})
    await wait_for(lambda: rec.state is State.READY and _settled(pool), what="reset")
    # Kept for run a: not in the line any acquirer takes from.
    assert rec not in pool.ready_records()
    _lease_b, other = await h.acquire("p", labels={"run": "b"})
    assert rec not in other
    _lease_none, unlabelled = await h.acquire("p")
    assert rec not in unlabelled
    _lease_a, mine = await h.acquire("p", labels={"run": "a"})
    assert mine == [rec]


async def test_same_run_sandboxes_do_not_outlive_their_run(h: Harness) -> None:
    pool = await _pool(h, recycle="same-run", recycle_label="run", idle_seconds=5.0)
    rec = await _use_and_release(h, pool, labels={"run": "a"})
    await wait_for(lambda: rec.state is State.READY and _settled(pool), what="reset")
    assert pool.expire_reserved(h.clock.monotonic()) == 0
    assert pool.expire_reserved(h.clock.monotonic() + 6.0) == 1
    await wait_for(lambda: rec.state is State.GONE, what="destroyed")


async def test_another_tenant_never_gets_a_recycled_sandbox(h: Harness) -> None:
    with acting_as("alice"):
        alice = await _pool(h, min_ready=1, max_size=1)
        rec = await _use_and_release(h, alice)
        await wait_for(lambda: rec.state is State.READY and _settled(alice), what="reset")
    with acting_as("bob"):
        bob = await _pool(h, min_ready=0, max_size=2)
        _lease, got = await h.acquire("p", n=2)
        assert rec not in got and all(r.pool == bob.name for r in got)
    assert rec.state is State.READY and rec in alice.ready_records()


async def test_resets_count_as_starts_and_are_measured_beside_creates(make_control: Any) -> None:
    h = await make_control(backend=FakeBackend(start_delay=0.02))
    pool = await _pool(h, min_ready=1, max_size=1)
    before = pool._demand._startup.samples
    rec = await _use_and_release(h, pool)
    assert pool.signals(h.clock.monotonic()).creating == pool.creating + pool.resetting
    await wait_for(lambda: rec.state is State.READY and _settled(pool), what="reset")
    assert pool._demand._startup.samples == before + 1
    assert pool.create_p50_seconds > pool.reset_p50_seconds > 0


@pytest.mark.parametrize(
    ("kw", "error", "field"),
    [
        ({"recycle": "always"}, InvalidArgument, "spec.recycle"),
        ({"recycle": "same-run"}, InvalidArgument, "spec.recycle_label"),
        ({"recycle": "same-tenant", "recycle_label": "run"}, InvalidArgument, "spec.recycle_label"),
        ({"recycle": "off", "max_uses": 3}, InvalidArgument, "spec.max_uses"),
        ({"recycle": "same-tenant", "max_uses": -1}, InvalidArgument, "spec.max_uses"),
    ],
)
async def test_bad_settings_are_refused(h: Harness, kw: dict[str, Any], error: type, field: str) -> None:
    with pytest.raises(error) as e:
        await h.control.create_pool(PoolConfig("p", IMAGE, 0, 2, Limits(), **kw))
    assert isinstance(e.value, InvalidArgument) and e.value.field == field
    assert not h.control.pools


def test_a_backend_that_cannot_reset_refuses_recycling() -> None:
    # Any backend without the InPlaceReset port.
    with pytest.raises(FailedPrecondition, match="cannot reset sandboxes in place"):
        check_recycle(PoolConfig("p", IMAGE, 0, 2, Limits(), recycle="same-tenant"), object())
    check_recycle(PoolConfig("p", IMAGE, 0, 2, Limits()), object())


def test_default_max_uses_bounds_every_sandbox() -> None:
    assert 1 < DEFAULT_MAX_USES <= 1000
    reserve = RunReserve()
    assert len(reserve) == 0 and reserve.take("a", IMAGE, 1) == []
