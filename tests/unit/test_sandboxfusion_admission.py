"""Admission of ``/run_code`` programs to the host's CPUs: RunSlots on its own,
and end to end on the fake backend (a queued request's wait is not part of its
time limits; a wait past the request's deadline is 504 with Retry-After, and
gives its sandbox back untouched)."""

from __future__ import annotations

import asyncio

import pytest

from sandboxd import errors
from sandboxd.adapters.sandboxfusion import SLOTS, WARM
from sandboxd.adapters.sandboxfusion_admission import RunSlots
from tests.unit.conftest import MakeApp, wait_for
from tests.unit.test_sandboxfusion_fake import IMAGE, JudgeBackend, _serve

pytestmark = pytest.mark.timeout(30)


def _far() -> float:
    return asyncio.get_running_loop().time() + 60


async def test_slots_admit_up_to_the_limit_then_in_arrival_order() -> None:
    slots = RunSlots(2)
    order: list[int] = []
    release = asyncio.Event()

    async def holder(n: int) -> None:
        async with slots.hold(_far()):
            order.append(n)
            await release.wait()

    first = [asyncio.ensure_future(holder(n)) for n in (0, 1)]
    await wait_for(lambda: slots.running == 2, what="two holders")
    queued: list[asyncio.Future[None]] = []
    for n in (2, 3, 4):
        queued.append(asyncio.ensure_future(holder(n)))
        await wait_for(lambda: slots.queued == len(queued), what=f"holder {n} queued")
    assert order == [0, 1] and slots.running == 2
    release.set()
    await asyncio.gather(*first, *queued)
    assert order == [0, 1, 2, 3, 4]
    assert (slots.running, slots.queued) == (0, 0)
    assert slots.stats.admitted == 5 and slots.stats.waited == 3 and slots.stats.refused == 0


async def test_a_deadline_in_the_queue_is_resource_exhausted_with_a_retry_hint() -> None:
    slots = RunSlots(1)
    release = asyncio.Event()

    async def holder() -> None:
        async with slots.hold(_far()):
            await release.wait()

    held = asyncio.ensure_future(holder())
    await wait_for(lambda: slots.running == 1, what="the holder")
    loop = asyncio.get_running_loop()
    with pytest.raises(errors.ResourceExhausted) as refused:
        async with slots.hold(loop.time() + 0.05):
            raise AssertionError("admitted past a full slot")
    assert refused.value.retry_after is not None and refused.value.retry_after >= 1
    assert "1 programs run at once" in refused.value.message and "allows 1" in refused.value.message
    # The refused waiter holds nothing: the slot goes to the next in line.
    assert (slots.running, slots.queued, slots.stats.refused) == (1, 0, 1)
    release.set()
    await held
    async with slots.hold(loop.time()) as waited:
        assert waited == 0.0 and slots.running == 1
    assert slots.running == 0


async def test_a_waiter_cancelled_in_the_queue_passes_its_grant_on() -> None:
    slots = RunSlots(1)
    release = asyncio.Event()
    got: list[str] = []

    async def holder(name: str) -> None:
        async with slots.hold(_far()):
            got.append(name)
            await release.wait()

    first = asyncio.ensure_future(holder("first"))
    await wait_for(lambda: slots.running == 1, what="the first holder")
    gone = asyncio.ensure_future(holder("gone"))
    await wait_for(lambda: slots.queued == 1, what="the second queued")
    last = asyncio.ensure_future(holder("last"))
    await wait_for(lambda: slots.queued == 2, what="the third queued")
    gone.cancel()
    release.set()
    await first
    await last
    assert got == ["first", "last"] and slots.running == 0
    assert gone.cancelled()


async def test_no_limit_is_found_once_from_the_host() -> None:
    asked = 0

    async def resolve() -> int:
        nonlocal asked
        asked += 1
        return 3

    slots = RunSlots(0, resolve)
    assert slots.limit == 0
    await asyncio.gather(*(_hold_once(slots) for _ in range(4)))
    assert (slots.limit, asked) == (3, 1)
    with pytest.raises(ValueError, match="needs resolve"):
        RunSlots(0)
    unlimited = RunSlots(-1)
    async with unlimited.hold(_far()), unlimited.hold(_far()), unlimited.hold(_far()):
        assert unlimited.running == 3


async def _hold_once(slots: RunSlots) -> None:
    async with slots.hold(_far()):
        await asyncio.sleep(0)


async def test_a_queued_requests_wait_is_not_part_of_its_run_timeout(make_app: MakeApp) -> None:
    backend = JudgeBackend(tools={"bash"})
    async with _serve(make_app, backend, acquire_timeout=20.0, max_running=1) as served:
        await served.client.create_pool("judge", IMAGE, min_ready=2, max_size=4)
        first = asyncio.ensure_future(served.run({"code": "sleep 1", "language": "bash", "run_timeout": 10}))
        await asyncio.wait_for(backend.user_started.wait(), 10)
        # Admitted only once the first program ends, a second later: its 0.5 s limit
        # starts then, so the echo is in time.
        status, second = await served.run({"code": "echo hi", "language": "bash", "run_timeout": 0.5})
        assert status == 200 and second["status"] == "Success", second
        assert second["run_result"]["stdout"] == "hi\n"
        _, answered = await first
        assert answered["status"] == "Success", answered
        slots = served.app[SLOTS]
        assert slots.limit == 1 and slots.stats.waited == 1
        assert slots.stats.wait_seconds >= 0.5, slots.stats
        async with served.http.get(f"{served.url}/sandboxd/stats") as r:
            stats = await r.json()
        assert stats["admission"]["limit"] == 1 and stats["admission"]["waited"] == 1, stats


async def test_a_wait_for_a_run_slot_past_the_deadline_is_504_and_keeps_the_sandbox(
    make_app: MakeApp,
) -> None:
    backend = JudgeBackend(tools={"bash"})
    async with _serve(make_app, backend, acquire_timeout=0.5, max_running=1) as served:
        await served.client.create_pool("judge", IMAGE, min_ready=2, max_size=4)
        warm = served.app[WARM]
        holding = asyncio.ensure_future(
            served.run({"code": "sleep 30", "language": "bash", "run_timeout": 60})
        )
        await asyncio.wait_for(backend.user_started.wait(), 10)
        async with served.http.post(
            f"{served.url}/run_code", json={"code": "echo hi", "language": "bash"}
        ) as r:
            status, answer, retry = r.status, await r.json(), r.headers.get("Retry-After")
        assert status == 504 and "no run slot within 0.5s" in answer["detail"], answer
        assert retry is not None and int(retry) >= 1, retry
        # Nothing of it ran, and its sandbox went back as it was (not destroyed).
        assert len(backend.commands) == 1, backend.commands
        assert warm.destroyed == 0 and len(warm.in_use()) == 1
        assert served.app[SLOTS].stats.refused == 1
        # The holder ends (its sandbox lost): the next request gets the slot.
        sandbox_id = warm.in_use()[0]
        backend.kill(next(h for h, b in backend.sandboxes.items() if b.spec.sandbox_id == sandbox_id))
        _, lost = await asyncio.wait_for(holding, 20)
        assert lost["status"] == "SandboxError", lost
        _, ok = await served.run({"code": "echo ok", "language": "bash"})
        assert ok["status"] == "Success", ok
