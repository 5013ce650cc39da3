"""Async client of the rollout queue (RolloutService).

async with AsyncClient(address) as client:
    rollouts = RolloutClient(client)
    await rollouts.configure("run1", batch_groups=4, group_size=8, max_staleness=1)
    slots = await rollouts.request_slots("run1", 2)        # RESOURCE_EXHAUSTED -> retry_after
    await rollouts.submit("run1", slots[0].group_id, [trajectory(...), ...])
    async for batch in rollouts.pull("run1"):               # trainer
        ...
        await rollouts.ack("run1", batch.batch_id)
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from sandboxd import errors
from sandboxd.client.aio import AsyncClient
from sandboxd.client.rpc import rpc_errors
from sandboxd.v1 import rollouts_pb2 as pb
from sandboxd.v1 import rollouts_pb2_grpc

__all__ = ["RolloutClient", "trajectory"]


def trajectory(
    trajectory_id: str,
    *,
    payload: bytes = b"",
    segments: Sequence[tuple[int, int]] = (),
    reward: float = 0.0,
    components: Mapping[str, float] | None = None,
    steps: Sequence[tuple[int, float, Mapping[str, float]]] = (),
    verifier: str = "",
    sandbox_id: str = "",
    verifier_timeout: float = 0.0,
    failure: int = 0,
    failure_detail: str = "",
    env_policy_version: int = 0,
) -> pb.Trajectory:
    """A Trajectory message: ``segments`` are (policy version, tokens) pairs;
    ``verifier`` is a shell command run in ``sandbox_id`` that prints the reward."""
    t = pb.Trajectory(
        trajectory_id=trajectory_id,
        payload=payload,
        segments=[pb.Segment(policy_version=v, tokens=n) for v, n in segments],
        reward=reward,
        components=dict(components or {}),
        steps=[pb.StepReward(step=i, reward=r, components=dict(c)) for i, r, c in steps],
        failure=failure,  # type: ignore[arg-type]
        failure_detail=failure_detail,
        env_policy_version=env_policy_version,
        sandbox_id=sandbox_id,
    )
    if verifier:
        t.verifier.CopyFrom(
            pb.Verifier(sandbox_id=sandbox_id, command=verifier, timeout_seconds=verifier_timeout)
        )
    return t


class RolloutClient:
    """RolloutService over an AsyncClient's channel and credentials; errors arrive as sandboxd.errors."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client
        self.stub = rollouts_pb2_grpc.RolloutServiceStub(client.channel)
        self._metadata = client.metadata

    async def configure(self, run: str, **config: Any) -> pb.ConfigureRunResponse:
        """Fields of RunConfig by name (batch_groups, group_size, max_staleness, ...);
        enums as their numbers or names (filter_mode="FILTER_MODE_DROP_AND_BACKFILL")."""
        with rpc_errors():
            response: pb.ConfigureRunResponse = await self.stub.ConfigureRun(
                pb.ConfigureRunRequest(run=run, config=pb.RunConfig(**config)), metadata=self._metadata
            )
        return response

    async def request_slots(self, run: str, count: int = 1, images: Sequence[str] = ()) -> list[pb.Slot]:
        """Up to ``count`` slots; raises ResourceExhausted (with retry_after) when none.
        ``images``: the images of the new slots' tasks, in order (each slot's
        ``image`` says which it got); the queue announces them to the pool."""
        with rpc_errors():
            response: pb.RequestSlotsResponse = await self.stub.RequestSlots(
                pb.RequestSlotsRequest(run=run, count=count, images=list(images)), metadata=self._metadata
            )
        return list(response.slots)

    async def wait_slots(self, run: str, count: int = 1, *, timeout: float | None = None) -> list[pb.Slot]:
        """Like request_slots, waiting out RESOURCE_EXHAUSTED as the server advises."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            try:
                return await self.request_slots(run, count)
            except errors.ResourceExhausted as e:
                pause = e.retry_after or 0.5
                if deadline is not None and loop.time() + pause > deadline:
                    raise
                await asyncio.sleep(pause)

    async def report_progress(
        self,
        run: str,
        group_id: str,
        *,
        lease_ids: Sequence[str] = (),
        trajectories: Sequence[pb.Trajectory] = (),
    ) -> pb.ReportProgressResponse:
        """Reports a running group's leases and trajectories so far; the answer says if it was cancelled."""
        with rpc_errors():
            response: pb.ReportProgressResponse = await self.stub.ReportProgress(
                pb.ReportProgressRequest(
                    run=run, group_id=group_id, lease_ids=list(lease_ids), trajectories=list(trajectories)
                ),
                metadata=self._metadata,
            )
        return response

    async def submit(
        self, run: str, group_id: str, trajectories: Sequence[pb.Trajectory], *, prompt_id: str = ""
    ) -> pb.ScoredGroup:
        """Submits a finished group and returns it scored; FailedPrecondition if submitted or cancelled."""
        with rpc_errors():
            response: pb.SubmitGroupResponse = await self.stub.SubmitGroup(
                pb.SubmitGroupRequest(
                    run=run, group_id=group_id, prompt_id=prompt_id, trajectories=list(trajectories)
                ),
                metadata=self._metadata,
            )
        return response.group

    async def pull(self, run: str, *, max_batches: int = 0) -> AsyncIterator[pb.Batch]:
        """Batches, oldest first, as they come; one not acked in time is delivered again.
        Leaving the loop ends the call."""
        call = self.stub.PullBatch(
            pb.PullBatchRequest(run=run, max_batches=max_batches), metadata=self._metadata
        )
        try:
            with rpc_errors():
                async for response in call:
                    yield response.batch
        finally:
            call.cancel()

    async def ack(self, run: str, batch_id: str) -> None:
        """Marks a batch trained on, gone for good; acking it again is harmless."""
        with rpc_errors():
            await self.stub.AckBatch(pb.AckBatchRequest(run=run, batch_id=batch_id), metadata=self._metadata)

    async def publish(self, run: str, version: int) -> int:
        """Publishes the trainer's policy version, as returned; FailedPrecondition below the current one."""
        with rpc_errors():
            response: pb.PublishPolicyVersionResponse = await self.stub.PublishPolicyVersion(
                pb.PublishPolicyVersionRequest(run=run, version=version), metadata=self._metadata
            )
        return response.version

    async def watch_version(self, run: str) -> AsyncIterator[int]:
        """The run's policy version at once, then on every change; leaving the loop ends the call."""
        call = self.stub.WatchPolicyVersion(pb.WatchPolicyVersionRequest(run=run), metadata=self._metadata)
        try:
            with rpc_errors():
                async for response in call:
                    yield response.version
        finally:
            call.cancel()

    async def figures(self, run: str) -> pb.Figures:
        """The run's throughput-matching figures now (rates, idle ratios,
        staleness), its rollouts' stage distributions (``lifecycle``) and its
        dollars at the server's prices (``cost``)."""
        with rpc_errors():
            response: pb.GetFiguresResponse = await self.stub.GetFigures(
                pb.GetFiguresRequest(run=run), metadata=self._metadata
            )
        return response.figures
