"""An Acquire cancelled by its client at any moment leaves no lease behind:
not while it waits, not while the server grants it, not while the answer is
on its way back. Only the client knows whether it got the answer, so both
ends take part: the server releases a lease whose call ended cancelled, and
the client releases one whose answer arrived after it gave up."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Coroutine
from typing import Any

import grpc
import pytest

from sandboxd.client import AsyncClient, Lease
from sandboxd.v1 import sandboxes_pb2
from tests.unit.cancel_moments import cancel_at, round_trip
from tests.unit.conftest import IMAGE, MakeApp, wait_for
from tests.unit.test_grpc import raw_code

pytestmark = pytest.mark.timeout(60)


async def test_a_cancelled_acquire_leaves_no_lease(make_app: MakeApp) -> None:
    app = await make_app()
    rng = random.Random(7)
    async with AsyncClient(app.address) as client:
        await client.create_pool("p", IMAGE, min_ready=4, max_size=8)
        await wait_for(lambda: app.control.get_pool("p").ready >= 4, what="the pool warm")

        def acquire() -> Coroutine[Any, Any, Lease]:
            return client.lease("p", lease_ttl=300, timeout=5)

        trip = await round_trip(acquire, lambda lease: lease.release())
        answered = 0
        for _ in range(300):
            task = asyncio.create_task(acquire())
            # Somewhere between before the call leaves and after its answer came.
            await asyncio.sleep(cancel_at(rng, trip))
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                lease = await task
                answered += 1
                await lease.release()
        assert 0 < answered < 300, "the cancellations fell on both sides of the answer"
        await wait_for(lambda: len(app.control.leases) == 0, timeout=10, what="every lease released")


async def test_request_id_repeats_answer_the_same_lease(make_app: MakeApp) -> None:
    app = await make_app()
    async with AsyncClient(app.address) as client:
        await client.create_pool("p", IMAGE, min_ready=1, max_size=4)
        await client.create_pool("q", IMAGE, max_size=1)
        stub = client.sandboxes
        ask = sandboxes_pb2.AcquireRequest(pool="p", request_id="job-7.try_1", timeout_seconds=5)
        first = await stub.Acquire(ask)
        again = await stub.Acquire(ask)
        assert again.lease.id == first.lease.id
        assert [s.id for s in again.sandboxes] == [s.id for s in first.sandboxes]
        assert len(app.control.leases) == 1

        other_pool = sandboxes_pb2.AcquireRequest(pool="q", request_id="job-7.try_1", timeout_seconds=5)
        code, details = await raw_code(stub.Acquire(other_pool))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "request_id" in details

        released = await stub.Release(sandboxes_pb2.ReleaseRequest(request_id="job-7.try_1"))
        assert list(released.released) == [s.id for s in first.sandboxes]
        assert app.control.leases.find(first.lease.id) is None
        # Nothing granted (any more): an empty answer, not NOT_FOUND.
        assert (
            list((await stub.Release(sandboxes_pb2.ReleaseRequest(request_id="job-7.try_1"))).released) == []
        )
        # Released, the id is free again: a new acquire gets a new lease.
        fresh = await stub.Acquire(ask)
        assert fresh.lease.id != first.lease.id
        await client.release(fresh.lease.id)


@pytest.mark.parametrize(
    "release",
    [
        sandboxes_pb2.ReleaseRequest(request_id="bad id!"),
        sandboxes_pb2.ReleaseRequest(request_id="x" * 65),
        sandboxes_pb2.ReleaseRequest(request_id="job-1", lease_id="ls-0123456789abcdef01234567"),
        sandboxes_pb2.ReleaseRequest(request_id="job-1", sandbox_ids=["sb-0123456789ab"]),
    ],
)
async def test_malformed_request_ids_are_invalid(make_app: MakeApp, release: Any) -> None:
    app = await make_app()
    async with AsyncClient(app.address) as client:
        code, details = await raw_code(client.sandboxes.Release(release))
        assert code == grpc.StatusCode.INVALID_ARGUMENT, details
        bad = sandboxes_pb2.AcquireRequest(pool="p", request_id="bad id!")
        code, details = await raw_code(client.sandboxes.Acquire(bad))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "request_id" in details, details
