"""RolloutService over gRPC on the fake backend: verifier rewards and typed
infrastructure failures, cancellation that releases sandboxes, parking with
a snapshot and resuming from it, PullBatch/AckBatch redelivery, policy
versions, figures, and a restart that loses nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from sandboxd import errors
from sandboxd.app import SERVICE_NAMES, build_app
from sandboxd.backends.fake import FakeBackend
from sandboxd.client import AsyncClient
from sandboxd.client.rollouts import RolloutClient, trajectory
from sandboxd.v1 import rollouts_pb2 as pb
from tests.unit.conftest import IMAGE, MakeApp, make_settings

pytestmark = pytest.mark.timeout(30)


def pair(prefix: str, version: int = 0) -> list[pb.Trajectory]:
    return [
        trajectory(f"{prefix}a", reward=1.0, segments=[(version, 5)]),
        trajectory(f"{prefix}b", reward=0.0, segments=[(version, 5)]),
    ]


async def test_service_is_registered() -> None:
    assert "sandboxd.v1.RolloutService" in SERVICE_NAMES


async def test_verifier_rewards_infra_failures_batches_and_figures(make_app: MakeApp) -> None:
    app = await make_app()
    async with AsyncClient(app.address) as client:
        r = RolloutClient(client)
        await client.create_pool("p", IMAGE, max_size=4)
        await r.configure("run", batch_groups=1, group_size=3, max_staleness=0)
        (slot,) = await r.request_slots("run", 5)
        with pytest.raises(errors.ResourceExhausted) as e:
            await r.request_slots("run")
        assert e.value.retry_after is not None
        async with client.acquire("p") as sb:
            ok = 'echo \'{"reward": 0.75, "components": {"tests": 0.75}}\''
            group = await r.submit("run", slot.group_id, [
                trajectory("good", verifier=ok, sandbox_id=sb.id, segments=[(0, 4)]),
                trajectory("zero", verifier="echo 0", sandbox_id=sb.id, segments=[(0, 4)]),
                trajectory("broken", verifier="exit 3", sandbox_id=sb.id, segments=[(0, 4)]),
                trajectory("gone", verifier="echo 1", sandbox_id="sb-" + "0" * 12),
            ], prompt_id="p7")  # fmt: skip
        by_id = {t.trajectory_id: t for t in group.trajectories}
        assert by_id["good"].reward == 0.75 and by_id["good"].components["tests"] == 0.75
        assert by_id["zero"].reward == 0.0 and not by_id["zero"].masked
        assert by_id["broken"].masked and by_id["broken"].failure == pb.INFRA_FAILURE_VERIFIER
        assert by_id["gone"].masked and by_id["gone"].failure == pb.INFRA_FAILURE_SANDBOX_LOST
        assert group.outcome == pb.GROUP_OUTCOME_ADMITTED and group.prompt_id == "p7"
        assert by_id["good"].advantage > 0 > by_id["zero"].advantage
        batches = r.pull("run")
        batch = await anext(batches)
        assert [g.group_id for g in batch.groups] == [slot.group_id] and batch.delivery == 1
        await batches.aclose()
        # the stream closed unacknowledged: delivered again
        async for again in r.pull("run", max_batches=1):
            assert again.batch_id == batch.batch_id and again.delivery == 2
        await r.ack("run", batch.batch_id)
        assert await r.publish("run", 1) == 1
        versions = r.watch_version("run")
        assert await anext(versions) == 1
        await versions.aclose()
        f = await r.figures("run")
        assert f.infra_failures_masked == 2 and f.filtered["infra_failure"] == 2
        assert f.consumed_groups == 1 and f.policy_version == 1 and f.queue_depth == 0
        assert f.staleness_trajectory.max == 0
        with pytest.raises(errors.NotFound):
            await r.figures("nope")


async def test_stragglers_are_cancelled_and_their_sandboxes_released(make_app: MakeApp) -> None:
    app = await make_app()
    async with AsyncClient(app.address) as client:
        r = RolloutClient(client)
        await client.create_pool("p", IMAGE, max_size=8)
        await r.configure(
            "run", batch_groups=2, group_size=2, over_sample=0.5, pool="p", sandboxes_per_group=1
        )
        slots = await r.request_slots("run", 3)
        assert len(slots) == 3
        leases = [await client.lease("p") for _ in slots]
        for s, lease in zip(slots, leases, strict=True):
            await r.report_progress("run", s.group_id, lease_ids=[lease.id])
        await r.submit("run", slots[0].group_id, pair("x"))
        await r.submit("run", slots[1].group_id, pair("y"))
        straggler = await r.report_progress("run", slots[2].group_id)
        assert straggler.cancelled and straggler.outcome == pb.GROUP_OUTCOME_CANCELLED
        assert app.control.leases.find(leases[2].id) is None  # released by the queue
        assert app.control.leases.find(leases[0].id) is not None
        with pytest.raises(errors.FailedPrecondition):
            await r.submit("run", slots[2].group_id, pair("z"))
        for lease in leases[:2]:
            await lease.release()
        assert (await r.figures("run")).filtered["cancelled"] == 1


async def test_parked_rollout_resumes_from_its_snapshot(make_app: MakeApp) -> None:
    app = await make_app()
    async with AsyncClient(app.address) as client:
        r = RolloutClient(client)
        await client.create_pool("p", IMAGE, max_size=8)
        await r.configure("run", batch_groups=1, group_size=1, over_sample=1.0, partial_rollouts=True,
                          max_staleness=1)  # fmt: skip
        first, slow = await r.request_slots("run", 2)
        lease = await client.lease("p")
        sb = lease[0]
        await sb.write_files({"state.txt": "turn 3\n"})
        await r.report_progress("run", slow.group_id, lease_ids=[lease.id], trajectories=[
            trajectory("t", payload=b"partial tokens", segments=[(0, 12)], sandbox_id=sb.id)
        ])  # fmt: skip
        await r.submit("run", first.group_id, [trajectory("a", reward=1.0), trajectory("b")])
        assert app.control.leases.find(lease.id) is None  # snapshotted, then released
        (resumed,) = await r.request_slots("run", 1)  # parked work before new prompts
        (t,) = resumed.resume
        assert t.payload == b"partial tokens" and t.snapshot_id and t.env_policy_version == 0
        restored = await client.restore(t.snapshot_id)
        box = restored[0]
        assert (await box.read_file("state.txt")) == b"turn 3\n"
        await box.release()
        assert (await r.figures("run")).parked == 0


async def test_restart_loses_no_queued_group_or_unacked_batch(tmp_path: Path) -> None:
    settings = make_settings(state_dir=str(tmp_path))
    backend = FakeBackend()
    app = build_app(settings, backend=backend)
    await app.start()
    try:
        async with AsyncClient(app.address) as client:
            r = RolloutClient(client)
            await r.configure("run", batch_groups=1, group_size=2, max_staleness=2)
            slots = await r.request_slots("run", 3)
            for s in slots[:2]:
                await r.submit("run", s.group_id, pair(s.group_id))
            async for batch in r.pull("run", max_batches=1):
                delivered = batch.batch_id
    finally:
        await app.stop(grace=0.2)
    app = build_app(settings, backend=backend)
    await app.start()
    try:
        async with AsyncClient(app.address) as client:
            r = RolloutClient(client)
            ids = []
            async for batch in r.pull("run", max_batches=2):
                ids.append((batch.batch_id, [g.group_id for g in batch.groups]))
                await r.ack("run", batch.batch_id)
            assert ids[0][0] == delivered  # the unacknowledged batch first
            assert ids[1][1] == [slots[1].group_id]
            # the running group survived too
            await r.submit("run", slots[2].group_id, pair("z"))
            f = await r.figures("run")
            assert f.accepted_total == 3 and f.consumed_groups == 2 and f.queue_depth == 1
    finally:
        await app.stop(grace=0.2)
    await asyncio.sleep(0)
