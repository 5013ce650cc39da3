"""RolloutService: decode, call the rollout manager, encode."""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator
from typing import Any, TypeVar

from sandboxd.backends.network.meter import ModelCall
from sandboxd.core.rollouts.cost import CostFigures
from sandboxd.core.rollouts.figures import Figures, StalenessStats
from sandboxd.core.rollouts.model import (
    Batch,
    FilterMode,
    Group,
    InfraFailure,
    Outcome,
    RunConfig,
    Segment,
    StalenessMode,
    StepReward,
    Trajectory,
)
from sandboxd.core.rollouts.service import RolloutManager
from sandboxd.core.rollouts.timeline import LifecycleFigures
from sandboxd.core.rollouts.verifier import VerifierSpec
from sandboxd.errors import InvalidArgument
from sandboxd.v1 import rollouts_pb2 as pb
from sandboxd.v1 import rollouts_pb2_grpc

E = TypeVar("E", bound=enum.Enum)


def _enum(cls: type[E], value: int, field: str, default: E) -> E:
    if not value:
        return default
    try:
        return cls(value)
    except ValueError:
        raise InvalidArgument(field, f"unknown value {value}") from None


def config_from(c: pb.RunConfig) -> RunConfig:
    """The core config with the proto's unset defaults filled in; INVALID_ARGUMENT for an unknown mode."""
    return RunConfig(
        batch_groups=c.batch_groups,
        group_size=c.group_size or 8,
        max_staleness=c.max_staleness,
        staleness_mode=_enum(StalenessMode, c.staleness_mode, "config.staleness_mode", StalenessMode.DROP),
        filter_mode=_enum(FilterMode, c.filter_mode, "config.filter_mode", FilterMode.MASK),
        filter_epsilon=c.filter_epsilon if c.HasField("filter_epsilon") else 1e-6,
        filter_mean_min=c.filter_mean_min,
        filter_mean_max=c.filter_mean_max,
        backfill_cap=c.backfill_cap,
        over_sample=c.over_sample,
        partial_rollouts=c.partial_rollouts,
        max_versions_spanned=c.max_versions_spanned,
        pool=c.pool,
        sandboxes_per_group=c.sandboxes_per_group,
        max_concurrent=c.max_concurrent,
        controller=c.controller,
        ack_timeout_seconds=c.ack_timeout_seconds,
        window_seconds=c.window_seconds,
    )


def config_to(c: RunConfig) -> pb.RunConfig:
    """The wire form of a run's config as the queue holds it (zero timeouts already defaulted)."""
    return pb.RunConfig(
        batch_groups=c.batch_groups,
        group_size=c.group_size,
        max_staleness=c.max_staleness,
        staleness_mode=c.staleness_mode.value,  # type: ignore[arg-type]
        filter_mode=c.filter_mode.value,  # type: ignore[arg-type]
        filter_epsilon=c.filter_epsilon,
        filter_mean_min=c.filter_mean_min,
        filter_mean_max=c.filter_mean_max,
        backfill_cap=c.backfill_cap,
        over_sample=c.over_sample,
        partial_rollouts=c.partial_rollouts,
        max_versions_spanned=c.max_versions_spanned,
        pool=c.pool,
        sandboxes_per_group=c.sandboxes_per_group,
        max_concurrent=c.max_concurrent,
        controller=c.controller,
        ack_timeout_seconds=c.ack_timeout_seconds,
        window_seconds=c.window_seconds,
    )


def trajectory_from(t: pb.Trajectory) -> tuple[Trajectory, VerifierSpec | None]:
    """A trajectory and its verifier (None without a command); a 0 reward with steps means their sum."""
    steps = [StepReward(s.step, s.reward, dict(s.components)) for s in t.steps]
    verifier = None
    if t.HasField("verifier") and t.verifier.command:
        verifier = VerifierSpec(t.verifier.sandbox_id, t.verifier.command, t.verifier.timeout_seconds)
    reward: float | None = t.reward
    if steps and not t.reward:
        reward = None  # the sum of the steps
    return (
        Trajectory(
            trajectory_id=t.trajectory_id,
            payload=t.payload,
            segments=[Segment(s.policy_version, s.tokens) for s in t.segments],
            reward=reward,
            components=dict(t.components),
            steps=steps,
            failure=_enum(InfraFailure, t.failure, "trajectories.failure", InfraFailure.NONE),
            failure_detail=t.failure_detail,
            env_policy_version=t.env_policy_version or None,
            sandbox_id=t.sandbox_id,
        ),
        verifier,
    )


def _segments(t: Trajectory) -> list[pb.Segment]:
    return [pb.Segment(policy_version=s.policy_version, tokens=s.tokens) for s in t.segments]


def scored_to(t: Trajectory, default_version: int) -> pb.ScoredTrajectory:
    """The wire form of a scored trajectory; no reward (masked failure) is sent as 0 with ``masked``."""
    return pb.ScoredTrajectory(
        trajectory_id=t.trajectory_id,
        payload=t.payload,
        segments=_segments(t),
        reward=t.reward or 0.0,
        components=t.components,
        steps=[pb.StepReward(step=s.step, reward=s.reward, components=s.components) for s in t.steps],
        masked=t.masked,
        mask_reason=t.mask_reason,
        failure=t.failure.value,  # type: ignore[arg-type]
        failure_detail=t.failure_detail,
        advantage=t.advantage,
        segment_masked=t.segment_masked,
        env_policy_version=t.env_version(default_version),
        model_calls=[model_call_to(c) for c in t.model_calls],
    )


def model_call_to(c: ModelCall) -> pb.ModelCall:
    """The wire form of one recorded model call."""
    return pb.ModelCall(
        lease_id=c.lease_id,
        sandbox_id=c.sandbox_id,
        method=c.method,
        path=c.path,
        model=c.model,
        status=c.status,
        stream=c.stream,
        request=c.request,
        request_truncated=c.request_truncated,
        prompt_tokens=c.prompt_tokens,
        completion_tokens=c.completion_tokens,
        prompt_token_ids=c.prompt_token_ids,
        choices=[
            pb.ModelChoice(
                index=ch.index,
                text=ch.text,
                token_ids=ch.token_ids,
                logprobs=ch.logprobs,
                finish_reason=ch.finish_reason,
            )
            for ch in c.choices
        ],
        started_at=c.started_at,
        duration_seconds=c.duration_seconds,
        error=c.error,
    )


def group_to(g: Group) -> pb.ScoredGroup:
    """The wire form of a scored group; env versions default to the group's start version."""
    return pb.ScoredGroup(
        group_id=g.group_id,
        prompt_id=g.prompt_id,
        start_version=g.start_version,
        trajectories=[scored_to(t, g.start_version) for t in g.trajectories],
        outcome=g.outcome.value if g.outcome else 0,  # type: ignore[arg-type]
        reason=g.reason,
        reward_mean=g.reward_mean,
        reward_std=g.reward_std,
    )


def slot_to(g: Group) -> pb.Slot:
    """A granted slot; a resumed group carries its parked trajectories' token state and snapshots."""
    return pb.Slot(
        group_id=g.group_id,
        policy_version=g.start_version,
        prompt_id=g.prompt_id,
        image=g.image,
        resume=[
            pb.ParkedTrajectory(
                trajectory_id=t.trajectory_id,
                payload=t.payload,
                segments=_segments(t),
                snapshot_id=t.snapshot_id,
                env_policy_version=t.env_version(g.start_version),
            )
            for t in g.resume
        ],
    )


def batch_to(b: Batch) -> pb.Batch:
    """The wire form of a batch, with its delivery count (1 on first delivery)."""
    return pb.Batch(
        batch_id=b.batch_id,
        groups=[group_to(g) for g in b.groups],
        policy_version=b.policy_version,
        delivery=b.delivery,
    )


def stats_to(s: StalenessStats) -> pb.StalenessStats:
    """The wire form of one staleness distribution (mean, max, stale share, histogram)."""
    return pb.StalenessStats(
        mean=s.mean, max=s.max, share_stale=s.share_stale, over_budget=s.over_budget, histogram=s.histogram
    )


def figures_to(f: Figures) -> pb.Figures:
    """The wire form of a run's throughput-matching figures, field for field."""
    return pb.Figures(
        production_rate=f.production_rate,
        keep_rate=f.keep_rate,
        effective_rate=f.effective_rate,
        consumption_rate=f.consumption_rate,
        trainer_idle_ratio=f.trainer_idle_ratio,
        generator_idle_ratio=f.generator_idle_ratio,
        queue_depth=f.queue_depth,
        in_flight=f.in_flight,
        parked=f.parked,
        unacked_batches=f.unacked_batches,
        staleness_trajectory=stats_to(f.staleness_trajectory),
        staleness_token=stats_to(f.staleness_token),
        staleness_env=stats_to(f.staleness_env),
        filtered=f.filtered,
        policy_version=f.policy_version,
        target_concurrency=f.target_concurrency,
        accepted_total=f.accepted_total,
        consumed_groups=f.consumed_groups,
        infra_failures_masked=f.infra_failures_masked,
        window_seconds=f.window_seconds,
        controller_reason=f.controller_reason,
        lifecycle=lifecycle_to(f.lifecycle) if f.lifecycle is not None else None,
        cost=cost_to(f.cost) if f.cost is not None else None,
    )


def lifecycle_to(f: LifecycleFigures) -> pb.RolloutLifecycle:
    """The wire form of a run's stage distributions and sandbox counts."""
    return pb.RolloutLifecycle(
        stages=[
            pb.StageDistribution(
                stage=d.stage, count=d.count, p50_seconds=d.p50, p90_seconds=d.p90, p99_seconds=d.p99,
                mean_seconds=d.mean, max_seconds=d.max, share=d.share,
            )
            for d in f.stages
        ],
        warm_sandboxes=f.warm_sandboxes,
        cold_sandboxes=f.cold_sandboxes,
        image_pulls=f.image_pulls,
        bottleneck=f.bottleneck,
        traces=f.traces,
    )


def cost_to(c: CostFigures) -> pb.CostFigures:
    """The wire form of a run's dollar figures, with the prices they were computed at."""
    return pb.CostFigures(
        trainer_idle_usd_per_step=c.trainer_idle_usd_per_step,
        trainer_idle_usd_per_hour=c.trainer_idle_usd_per_hour,
        sandbox_usd_per_rollout=c.sandbox_usd_per_rollout,
        sandbox_usd_per_step=c.sandbox_usd_per_step,
        usd_per_mtok=c.usd_per_mtok,
        sandbox_usd_per_mtok=c.sandbox_usd_per_mtok,
        trainer_idle_usd_per_mtok=c.trainer_idle_usd_per_mtok,
        window_trainer_idle_usd=c.window_trainer_idle_usd,
        window_sandbox_usd=c.window_sandbox_usd,
        sandbox_usd_total=c.sandbox_usd_total,
        steps=c.steps,
        rollouts=c.rollouts,
        tokens=c.tokens,
        gpu_hour_usd=c.prices.gpu_hour_usd,
        trainer_gpus=c.prices.trainer_gpus,
        sandbox_cpu_hour_usd=c.prices.sandbox_cpu_hour_usd,
        sandbox_gb_hour_usd=c.prices.sandbox_gb_hour_usd,
    )


class RolloutServicer(rollouts_pb2_grpc.RolloutServiceServicer):
    """RolloutService over the rollout manager; every RPC answers INVALID_ARGUMENT for a bad run name."""

    def __init__(self, manager: RolloutManager) -> None:
        self._m = manager

    async def ConfigureRun(self, request: pb.ConfigureRunRequest, context: Any) -> pb.ConfigureRunResponse:
        """INVALID_ARGUMENT (a bad field, named), NOT_FOUND (the pool named does not exist)."""
        queue = await self._m.configure(request.run, config_from(request.config))
        return pb.ConfigureRunResponse(config=config_to(queue.config), policy_version=queue.version)

    async def RequestSlots(self, request: pb.RequestSlotsRequest, context: Any) -> pb.RequestSlotsResponse:
        """NOT_FOUND (unknown run), INVALID_ARGUMENT (count < 1, a bad image), FAILED_PRECONDITION (an
        image the run's pool does not serve), RESOURCE_EXHAUSTED (no capacity now, with retry-after)."""
        slots, version = await self._m.request_slots(request.run, request.count, list(request.images))
        return pb.RequestSlotsResponse(slots=[slot_to(g) for g in slots], policy_version=version)

    async def ReportProgress(
        self, request: pb.ReportProgressRequest, context: Any
    ) -> pb.ReportProgressResponse:
        """NOT_FOUND (unknown run, group or new lease), INVALID_ARGUMENT (a bad field, a sandbox not
        under the group's leases)."""
        trajectories = [trajectory_from(t)[0] for t in request.trajectories]
        g = await self._m.report_progress(
            request.run, request.group_id, list(request.lease_ids), trajectories
        )
        return pb.ReportProgressResponse(
            cancelled=g.outcome in (Outcome.CANCELLED, Outcome.PARKED),
            outcome=g.outcome.value if g.outcome else 0,  # type: ignore[arg-type]
            policy_version=self._m.get(request.run).queue.version,
        )

    async def SubmitGroup(self, request: pb.SubmitGroupRequest, context: Any) -> pb.SubmitGroupResponse:
        """NOT_FOUND (unknown run or group), INVALID_ARGUMENT (a bad field, named), FAILED_PRECONDITION
        (already submitted or cancelled)."""
        pairs = [trajectory_from(t) for t in request.trajectories]
        g = await self._m.submit(
            request.run, request.group_id, request.prompt_id, [t for t, _ in pairs], [v for _, v in pairs]
        )
        return pb.SubmitGroupResponse(group=group_to(g))

    async def PullBatch(
        self, request: pb.PullBatchRequest, context: Any
    ) -> AsyncIterator[pb.PullBatchResponse]:
        """Streams batches until cancelled; NOT_FOUND (unknown run), INVALID_ARGUMENT (max_batches < 0)."""
        async for batch in self._m.pull(request.run, request.max_batches):
            yield pb.PullBatchResponse(batch=batch_to(batch))

    async def AckBatch(self, request: pb.AckBatchRequest, context: Any) -> pb.AckBatchResponse:
        """Idempotent; NOT_FOUND for an unknown run or batch."""
        await self._m.ack(request.run, request.batch_id)
        return pb.AckBatchResponse()

    async def PublishPolicyVersion(
        self, request: pb.PublishPolicyVersionRequest, context: Any
    ) -> pb.PublishPolicyVersionResponse:
        """NOT_FOUND (unknown run), FAILED_PRECONDITION (a version below the current one)."""
        return pb.PublishPolicyVersionResponse(version=await self._m.publish(request.run, request.version))

    async def WatchPolicyVersion(
        self, request: pb.WatchPolicyVersionRequest, context: Any
    ) -> AsyncIterator[pb.WatchPolicyVersionResponse]:
        """The current version at once, then every change; NOT_FOUND for an unknown run."""
        async for version in self._m.watch_version(request.run):
            yield pb.WatchPolicyVersionResponse(version=version)

    async def GetFigures(self, request: pb.GetFiguresRequest, context: Any) -> pb.GetFiguresResponse:
        """NOT_FOUND for an unknown run."""
        return pb.GetFiguresResponse(figures=figures_to(await self._m.figures(request.run)))
