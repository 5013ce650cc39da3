"""RolloutService over gRPC on the fake backend: verifier rewards and typed
infrastructure failures, cancellation that releases sandboxes, parking with
a snapshot and resuming from it, PullBatch/AckBatch redelivery, policy
versions, figures, and a restart that loses nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import pytest

from sandboxd import errors
from sandboxd.app import SERVICE_NAMES, build_app
from sandboxd.backends.fake import FakeBackend
from sandboxd.client import AsyncClient
from sandboxd.client.rollouts import RolloutClient, trajectory
from sandboxd.v1 import rollouts_pb2 as pb
from tests.unit.conftest import IMAGE, UNKNOWN_LEASE, UNKNOWN_SANDBOX, MakeApp, make_settings

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


# -- input checks ---------------------------------------------------------------


async def _code(call: Any) -> tuple[grpc.StatusCode, str]:
    """Status and details of a unary call or of a stream's first message."""
    try:
        if hasattr(call, "__aiter__"):
            async for _ in call:
                break
        else:
            await call
    except grpc.aio.AioRpcError as e:
        return e.code(), e.details() or ""
    return grpc.StatusCode.OK, ""


@pytest.mark.parametrize("count", [0, -1, -(2**31)])
async def test_request_slots_count_below_one_is_invalid(make_app: MakeApp, count: int) -> None:
    app = await make_app()
    async with AsyncClient(app.address) as client:
        r = RolloutClient(client)
        await r.configure("run", batch_groups=1, group_size=2)
        with pytest.raises(errors.InvalidArgument) as info:
            await r.request_slots("run", count)
        assert info.value.field == "count"
        with pytest.raises(errors.InvalidArgument) as info:
            await r.request_slots("unknown-run", count)  # the argument first, then the lookup
        assert info.value.field == "count"
        assert (await r.figures("run")).in_flight == 0


BAD_RUN_NAMES = ["", "nul\x00byte", "new\nline", "tab\t", "esc\x1b[31m", "del\x7f", "a/b", "r" * 129]


@pytest.mark.parametrize("name", BAD_RUN_NAMES, ids=repr)
async def test_bad_run_names_are_invalid_in_every_rpc(make_app: MakeApp, name: str) -> None:
    app = await make_app()
    async with AsyncClient(app.address) as client:
        stub = RolloutClient(client).stub
        calls = {
            "ConfigureRun": stub.ConfigureRun(
                pb.ConfigureRunRequest(run=name, config=pb.RunConfig(batch_groups=1))
            ),
            "RequestSlots": stub.RequestSlots(pb.RequestSlotsRequest(run=name, count=1)),
            "ReportProgress": stub.ReportProgress(pb.ReportProgressRequest(run=name, group_id="grp-1")),
            "SubmitGroup": stub.SubmitGroup(pb.SubmitGroupRequest(run=name, group_id="grp-1")),
            "PullBatch": stub.PullBatch(pb.PullBatchRequest(run=name, max_batches=1)),
            "AckBatch": stub.AckBatch(pb.AckBatchRequest(run=name, batch_id="bat-1")),
            "PublishPolicyVersion": stub.PublishPolicyVersion(
                pb.PublishPolicyVersionRequest(run=name, version=1)
            ),
            "WatchPolicyVersion": stub.WatchPolicyVersion(pb.WatchPolicyVersionRequest(run=name)),
            "GetFigures": stub.GetFigures(pb.GetFiguresRequest(run=name)),
        }
        assert set(calls) == {m.name for m in pb.DESCRIPTOR.services_by_name["RolloutService"].methods}
        for rpc, call in calls.items():
            code, details = await _code(call)
            assert code == grpc.StatusCode.INVALID_ARGUMENT, (rpc, code, details)
            assert details.startswith("run: "), (rpc, details)
    assert app.rollouts is not None and app.rollouts.runs == {}


@pytest.mark.parametrize("name", ["r", "run-1", "Run.Ü 2", "😀", "r" * 128])
async def test_good_run_names(make_app: MakeApp, name: str) -> None:
    app = await make_app()
    async with AsyncClient(app.address) as client:
        r = RolloutClient(client)
        await r.configure(name, batch_groups=1, group_size=2)
        assert len(await r.request_slots(name, 1)) == 1


async def test_nul_in_trajectory_and_prompt_ids_is_invalid(make_app: MakeApp) -> None:
    app = await make_app()
    async with AsyncClient(app.address) as client:
        r = RolloutClient(client)
        await r.configure("run", batch_groups=1, group_size=2)
        (slot,) = await r.request_slots("run", 1)
        with pytest.raises(errors.InvalidArgument) as info:
            await r.report_progress("run", slot.group_id, trajectories=[trajectory("t\x00")])
        assert info.value.field == "trajectories[0].trajectory_id"
        with pytest.raises(errors.InvalidArgument) as info:
            await r.submit("run", slot.group_id, [trajectory("a"), trajectory("b\x00")])
        assert info.value.field == "trajectories[1].trajectory_id"
        with pytest.raises(errors.InvalidArgument) as info:
            await r.submit("run", slot.group_id, pair("x"), prompt_id="p\x00")
        assert info.value.field == "prompt_id"
        # Nothing was taken: the group is still running and can be submitted.
        assert (await r.submit("run", slot.group_id, pair("x"))).outcome == pb.GROUP_OUTCOME_ADMITTED


async def test_nan_filter_mean_bounds_are_invalid(make_app: MakeApp) -> None:
    app = await make_app()
    async with AsyncClient(app.address) as client:
        r = RolloutClient(client)
        for name in ("filter_mean_min", "filter_mean_max"):
            with pytest.raises(errors.InvalidArgument) as info:
                await r.configure("run", batch_groups=1, **{name: float("nan")})
            assert info.value.field == f"config.{name}"


TWO_TENANTS = {"alice": {"token": "tok-alice"}, "bob": {"token": "tok-bob"}}


async def test_report_progress_takes_only_the_callers_leases_and_sandboxes(make_app: MakeApp) -> None:
    app = await make_app(tenants=TWO_TENANTS)
    async with (
        AsyncClient(app.address, token="tok-alice") as alice,
        AsyncClient(app.address, token="tok-bob") as bob,
    ):
        r = RolloutClient(alice)
        await alice.create_pool("p", IMAGE, max_size=4)
        await bob.create_pool("p", IMAGE, max_size=4)
        await r.configure("run", batch_groups=1, group_size=1, pool="p", sandboxes_per_group=1)
        (slot,) = await r.request_slots("run", 1)
        mine, other, foreign = await alice.lease("p"), await alice.lease("p"), await bob.lease("p")

        async def report(lease_ids: list[str], sandbox_id: str = "") -> pb.ReportProgressResponse:
            t = [trajectory("t", segments=[(0, 3)], sandbox_id=sandbox_id)] if sandbox_id else []
            return await r.report_progress("run", slot.group_id, lease_ids=lease_ids, trajectories=t)

        with pytest.raises(errors.NotFound, match=r"lease_ids\[0\]"):
            await report([UNKNOWN_LEASE])
        with pytest.raises(errors.NotFound, match=r"lease_ids\[1\]"):
            await report([mine.id, foreign.id])  # another tenant's lease: as if unknown
        with pytest.raises(errors.InvalidArgument) as info:
            await report(["not-a-lease"])
        assert info.value.field == "lease_ids[0]"
        with pytest.raises(errors.InvalidArgument) as info:
            await report([mine.id], foreign[0].id)  # bob's sandbox, not under alice's lease
        assert info.value.field == "trajectories[0].sandbox_id"
        with pytest.raises(errors.InvalidArgument) as info:
            await report([mine.id], other[0].id)  # alice's, but under a lease not reported
        assert info.value.field == "trajectories[0].sandbox_id"
        with pytest.raises(errors.InvalidArgument) as info:
            await report([mine.id], UNKNOWN_SANDBOX)
        assert info.value.field == "trajectories[0].sandbox_id"
        assert app.rollouts is not None
        group = app.rollouts.runs["alice/run"].queue.find(slot.group_id)
        assert group.lease_ids == [] and group.trajectories == []

        ok = await report([mine.id], mine[0].id)
        assert not ok.cancelled
        # Leases reported before stay acceptable, even once ended.
        await mine.release()
        assert not (await report([mine.id], mine[0].id)).cancelled
        assert not (await report([other.id], other[0].id)).cancelled
        assert group.lease_ids == [mine.id, other.id]
        # Bob's lease was never touched.
        assert app.control.leases.find(foreign.id) is not None
        await other.release()
        await foreign.release()
