"""The rollout queue's vocabulary: run configuration, trajectories, groups,
batches. Plain dataclasses, no I/O; ``to_json``/``from_json`` for the store."""

from __future__ import annotations

import base64
import enum
import math
import secrets
from dataclasses import dataclass, field
from typing import Any

from sandboxd.backends.network.meter import ModelCall, ModelChoice
from sandboxd.errors import InvalidArgument


class FilterMode(enum.Enum):
    """What happens to a zero-advantage group: delivered as is, delivered masked, or dropped (backfilled)."""

    OFF = 1
    MASK = 2
    DROP_AND_BACKFILL = 3


class StalenessMode(enum.Enum):
    """What happens to a group over the staleness bound: dropped, only counted, or its stale parts masked."""

    DROP = 1
    COUNT = 2
    MASK = 3


class InfraFailure(enum.Enum):
    """Why a trajectory has no reward. Never scored 0: masked and counted."""

    NONE = 0
    SANDBOX_LOST = 1
    BACKEND = 2
    VERIFIER = 3
    GENERATOR = 4


class GroupState(enum.Enum):
    """Where a group is in the queue's life cycle, from running to acknowledged or discarded."""

    RUNNING = 1
    QUEUED = 2  # admitted, waiting for the trainer
    DELIVERED = 3  # in a batch, not yet acknowledged
    DONE = 4  # acknowledged
    DROPPED = 5  # filtered out
    CANCELLED = 6  # straggler or over-stale, sandboxes released
    PARKED = 7  # straggler kept for later (token state + snapshot)


class Outcome(enum.Enum):
    """What the queue did with a group, as SubmitGroup and ReportProgress answer it (GroupOutcome)."""

    ADMITTED = 1
    MASKED = 2
    DROPPED = 3
    CANCELLED = 4
    PARKED = 5


@dataclass
class RunConfig:
    """A run's batch size, staleness budget, filters and concurrency; ``check`` validates it."""

    batch_groups: int
    """Groups per training step (B)."""
    group_size: int = 8
    max_staleness: int = 1
    """Staleness budget S in policy versions."""
    staleness_mode: StalenessMode = StalenessMode.DROP
    filter_mode: FilterMode = FilterMode.MASK
    filter_epsilon: float = 1e-6
    filter_mean_min: float = 0.0
    filter_mean_max: float = 0.0
    """Both 0: no mean range check."""
    backfill_cap: int = 0
    """Dropped groups replaced per policy version; 0 = batch_groups."""
    over_sample: float = 0.0
    partial_rollouts: bool = False
    max_versions_spanned: int = 0
    """0 = max_staleness + 1."""
    pool: str = ""
    sandboxes_per_group: int = 0
    """0 = group_size."""
    max_concurrent: int = 0
    """Groups running at once; 0 = only the gate limits."""
    controller: bool = False
    ack_timeout_seconds: float = 600.0
    window_seconds: float = 60.0

    def check(self) -> RunConfig:
        """Itself, with zero timeouts set to their defaults; INVALID_ARGUMENT naming a bad field."""

        def positive(name: str, value: float) -> None:
            if value < 1:
                raise InvalidArgument(f"config.{name}", f"must be >= 1, got {value}")

        def non_negative(name: str, value: float) -> None:
            if value < 0 or not math.isfinite(value):
                raise InvalidArgument(f"config.{name}", f"must be >= 0, got {value}")

        positive("batch_groups", self.batch_groups)
        positive("group_size", self.group_size)
        for name in ("max_staleness", "backfill_cap", "max_versions_spanned", "sandboxes_per_group"):
            non_negative(name, getattr(self, name))
        non_negative("max_concurrent", self.max_concurrent)
        non_negative("filter_epsilon", self.filter_epsilon)
        non_negative("ack_timeout_seconds", self.ack_timeout_seconds)
        non_negative("window_seconds", self.window_seconds)
        if not 0 <= self.over_sample <= 4:
            raise InvalidArgument("config.over_sample", f"must be between 0 and 4, got {self.over_sample}")
        for name in ("filter_mean_min", "filter_mean_max"):
            # NaN compares false with everything: the range check below would pass it.
            if math.isnan(getattr(self, name)):
                raise InvalidArgument(f"config.{name}", "must be a number, got nan")
        if self.filter_mean_min > self.filter_mean_max:
            raise InvalidArgument(
                "config.filter_mean_min",
                f"({self.filter_mean_min}) must not exceed filter_mean_max ({self.filter_mean_max})",
            )
        if self.batch_groups > 100_000 or self.group_size > 100_000:
            raise InvalidArgument("config.batch_groups", "batch_groups and group_size must be <= 100000")
        self.ack_timeout_seconds = self.ack_timeout_seconds or 600.0
        self.window_seconds = self.window_seconds or 60.0
        return self

    @property
    def spanned_cap(self) -> int:
        """Most policy versions one trajectory may span (max_versions_spanned, else S + 1)."""
        return self.max_versions_spanned or self.max_staleness + 1

    @property
    def backfills(self) -> int:
        """Dropped groups that may be backfilled per policy version (backfill_cap, else B)."""
        return self.backfill_cap or self.batch_groups

    @property
    def extra_slots(self) -> int:
        """Over-sampling allowance on top of the staleness gate."""
        return math.ceil(self.over_sample * self.batch_groups)

    @property
    def per_group(self) -> int:
        """Sandboxes one group holds, for pool caps and demand (sandboxes_per_group, else group_size)."""
        return self.sandboxes_per_group or self.group_size

    @property
    def has_mean_range(self) -> bool:
        """Whether groups are filtered by mean reward (only when min < max)."""
        return self.filter_mean_min < self.filter_mean_max


@dataclass
class Segment:
    """A run of ``tokens`` generated under one policy version (for token-level staleness)."""

    policy_version: int
    tokens: int


@dataclass
class StepReward:
    """One step's reward and its named components; a trajectory's steps sum to its reward when unset."""

    step: int
    reward: float
    components: dict[str, float] = field(default_factory=dict)


@dataclass
class Trajectory:
    """One rollout: its token segments, reward or typed failure, and how scoring masked it."""

    trajectory_id: str
    payload: bytes = b""
    segments: list[Segment] = field(default_factory=list)
    reward: float | None = None
    """None until scored, and for ever when an infrastructure failure masked it."""
    components: dict[str, float] = field(default_factory=dict)
    steps: list[StepReward] = field(default_factory=list)
    failure: InfraFailure = InfraFailure.NONE
    failure_detail: str = ""
    env_policy_version: int | None = None
    sandbox_id: str = ""
    masked: bool = False
    mask_reason: str = ""
    advantage: float = 0.0
    segment_masked: list[bool] = field(default_factory=list)
    snapshot_id: str = ""
    model_calls: list[ModelCall] = field(default_factory=list)
    """What an agent in its sandbox asked the run's model through the gateway,
    and what came back (taken from the gateway's ledger when submitted)."""

    def oldest_version(self, default: int) -> int:
        """The oldest policy version among its segments; ``default`` when it has none."""
        return min((s.policy_version for s in self.segments), default=default)

    def env_version(self, default: int) -> int:
        """The policy version its environment saw: as reported, else its oldest segment's."""
        if self.env_policy_version is not None:
            return self.env_policy_version
        return self.oldest_version(default)

    def mask(self, reason: str) -> None:
        """Masks it with zero advantage; the first reason given is the one kept."""
        if not self.masked:
            self.masked = True
            self.mask_reason = reason
        self.advantage = 0.0


@dataclass
class Group:
    """A prompt's trajectories (GRPO group), scored and delivered together, with its leases and state."""

    group_id: str
    start_version: int
    started_at: float
    prompt_id: str = ""
    state: GroupState = GroupState.RUNNING
    lease_ids: list[str] = field(default_factory=list)
    trajectories: list[Trajectory] = field(default_factory=list)
    outcome: Outcome | None = None
    reason: str = ""
    reward_mean: float = 0.0
    reward_std: float = 0.0
    resumed_from: str = ""
    """Id of the parked group this one resumes."""
    resume: list[Trajectory] = field(default_factory=list)
    """What the slot handed back to resume (parked token state)."""
    snapshots_ready: bool = True
    """Parked: whether its snapshots were taken (only then is it handed out)."""
    accepted_seq: int = 0
    image: str = ""
    """The image of the group's task, as the generator named it when asking
    for the slot ("" = the pool's own); announced to the pool until leased."""

    def oldest_version(self) -> int:
        """The oldest policy version any of its trajectories' tokens came from (else start_version)."""
        versions = [t.oldest_version(self.start_version) for t in self.trajectories]
        return min(versions, default=self.start_version)


@dataclass
class Batch:
    """Groups delivered to the trainer together; redelivered when not acknowledged by its deadline."""

    batch_id: str
    groups: list[Group]
    policy_version: int
    delivery: int = 0
    delivered_at: float = 0.0
    deadline: float = 0.0
    stream: int = 0
    """Which PullBatch stream holds it (0: none, waiting to be redelivered)."""


def new_id(prefix: str) -> str:
    """A fresh random id, ``prefix-`` and 16 hex digits."""
    return f"{prefix}-{secrets.token_hex(8)}"


# -- (de)serialisation for the store -------------------------------------------


def _enc(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"__b64": base64.b64encode(value).decode()}
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, list):
        return [_enc(v) for v in value]
    if isinstance(value, dict):
        return {k: _enc(v) for k, v in value.items()}
    if hasattr(value, "__dataclass_fields__"):
        return {k: _enc(getattr(value, k)) for k in value.__dataclass_fields__}
    return value


def _bytes(value: Any) -> bytes:
    return base64.b64decode(value["__b64"]) if isinstance(value, dict) else b""


def trajectory_from(d: dict[str, Any]) -> Trajectory:
    """A trajectory from its stored JSON form (as ``_enc`` wrote it); KeyError on a missing field."""
    return Trajectory(
        trajectory_id=d["trajectory_id"],
        payload=_bytes(d["payload"]),
        segments=[Segment(**s) for s in d["segments"]],
        reward=d["reward"],
        components=dict(d["components"]),
        steps=[StepReward(**s) for s in d["steps"]],
        failure=InfraFailure[d["failure"]],
        failure_detail=d["failure_detail"],
        env_policy_version=d["env_policy_version"],
        sandbox_id=d["sandbox_id"],
        masked=d["masked"],
        mask_reason=d["mask_reason"],
        advantage=d["advantage"],
        segment_masked=list(d["segment_masked"]),
        snapshot_id=d["snapshot_id"],
        model_calls=[_call_from(c) for c in d.get("model_calls", [])],
    )


def _call_from(d: dict[str, Any]) -> ModelCall:
    fields = dict(d)
    fields["request"] = _bytes(d["request"])
    fields["choices"] = [ModelChoice(**c) for c in d["choices"]]
    return ModelCall(**fields)


def group_to_json(g: Group) -> dict[str, Any]:
    """The group as JSON-safe data for the store: enums by name, bytes as base64."""
    out: dict[str, Any] = _enc(g)
    return out


def group_from_json(d: dict[str, Any]) -> Group:
    """The inverse of ``group_to_json``."""
    return Group(
        group_id=d["group_id"],
        start_version=d["start_version"],
        started_at=d["started_at"],
        prompt_id=d["prompt_id"],
        state=GroupState[d["state"]],
        lease_ids=list(d["lease_ids"]),
        trajectories=[trajectory_from(t) for t in d["trajectories"]],
        outcome=Outcome[d["outcome"]] if d["outcome"] else None,
        reason=d["reason"],
        reward_mean=d["reward_mean"],
        reward_std=d["reward_std"],
        resumed_from=d["resumed_from"],
        resume=[trajectory_from(t) for t in d["resume"]],
        snapshots_ready=d["snapshots_ready"],
        accepted_seq=d["accepted_seq"],
        image=d.get("image", ""),
    )


def config_to_json(c: RunConfig) -> dict[str, Any]:
    """The config as JSON-safe data for the store, modes by name."""
    out: dict[str, Any] = _enc(c)
    return out


def config_from_json(d: dict[str, Any]) -> RunConfig:
    """The inverse of ``config_to_json``; validation is left to ``check``."""
    d = dict(d)
    d["staleness_mode"] = StalenessMode[d["staleness_mode"]]
    d["filter_mode"] = FilterMode[d["filter_mode"]]
    return RunConfig(**d)
