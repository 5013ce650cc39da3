"""A Restore (a restore or fork into a new lease) cancelled by its client at
any moment leaves no lease behind, as a cancelled Acquire does: each Restore
carries a request id, and a client that gives up on one releases by that id
what the server may have granted as it gave up."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Coroutine
from typing import Any

import grpc
import pytest

from sandboxd.client import AsyncClient, Lease
from sandboxd.v1 import sandboxes_pb2, snapshots_pb2
from tests.unit.cancel_moments import cancel_at, round_trip
from tests.unit.conftest import IMAGE, MakeApp
from tests.unit.test_grpc import raw_code

pytestmark = pytest.mark.timeout(60)


async def _source(client: AsyncClient) -> tuple[Lease, str]:
    await client.create_pool("p", IMAGE, min_ready=4, max_size=8)
    source = await client.lease("p", lease_ttl=300, timeout=10)
    await source[0].write_file("kept.txt", b"state")
    return source, (await source[0].snapshot()).id


async def test_a_cancelled_restore_leaves_no_lease(make_app: MakeApp) -> None:
    app = await make_app()
    rng = random.Random(11)
    async with AsyncClient(app.address) as client:
        source, snapshot_id = await _source(client)

        def restore() -> Coroutine[Any, Any, Lease]:
            return client.restore(snapshot_id, lease_ttl=300, timeout=5)

        trip = await round_trip(restore, lambda lease: lease.release())
        answered = 0
        for _ in range(300):
            task = asyncio.create_task(restore())
            # Somewhere between before the call leaves and after its answer came.
            await asyncio.sleep(cancel_at(rng, trip))
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                restored = await task
                answered += 1
                await restored.release()
        await client.wait_background()
        assert 0 < answered < 300, "the cancellations fell on both sides of the answer"
        assert [lease.lease_id for lease in app.control.leases.all()] == [source.id]
        await source.release()


async def test_release_by_request_id_frees_a_restores_lease(make_app: MakeApp) -> None:
    app = await make_app()
    async with AsyncClient(app.address) as client:
        source, snapshot_id = await _source(client)
        ask = snapshots_pb2.RestoreRequest(
            snapshot_id=snapshot_id, request_id="fork-7.try_1", timeout_seconds=5
        )
        first = await client.snapshots.Restore(ask)
        # The same id again while its lease is in force: refused, nothing restored over it.
        code, details = await raw_code(client.snapshots.Restore(ask))
        assert code == grpc.StatusCode.ALREADY_EXISTS and first.lease.id in details, details
        released = await client.sandboxes.Release(sandboxes_pb2.ReleaseRequest(request_id="fork-7.try_1"))
        assert list(released.released) == [s.id for s in first.sandboxes]
        assert [lease.lease_id for lease in app.control.leases.all()] == [source.id]
        bad = snapshots_pb2.RestoreRequest(snapshot_id=snapshot_id, request_id="bad id!")
        code, details = await raw_code(client.snapshots.Restore(bad))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "request_id" in details, details
        await source.release()
