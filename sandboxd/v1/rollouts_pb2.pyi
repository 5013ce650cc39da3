from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FilterMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FILTER_MODE_UNSPECIFIED: _ClassVar[FilterMode]
    FILTER_MODE_OFF: _ClassVar[FilterMode]
    FILTER_MODE_MASK: _ClassVar[FilterMode]
    FILTER_MODE_DROP_AND_BACKFILL: _ClassVar[FilterMode]

class StalenessMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STALENESS_MODE_UNSPECIFIED: _ClassVar[StalenessMode]
    STALENESS_MODE_DROP: _ClassVar[StalenessMode]
    STALENESS_MODE_COUNT: _ClassVar[StalenessMode]
    STALENESS_MODE_MASK: _ClassVar[StalenessMode]

class InfraFailure(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    INFRA_FAILURE_UNSPECIFIED: _ClassVar[InfraFailure]
    INFRA_FAILURE_SANDBOX_LOST: _ClassVar[InfraFailure]
    INFRA_FAILURE_BACKEND: _ClassVar[InfraFailure]
    INFRA_FAILURE_VERIFIER: _ClassVar[InfraFailure]
    INFRA_FAILURE_GENERATOR: _ClassVar[InfraFailure]

class GroupOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    GROUP_OUTCOME_UNSPECIFIED: _ClassVar[GroupOutcome]
    GROUP_OUTCOME_ADMITTED: _ClassVar[GroupOutcome]
    GROUP_OUTCOME_MASKED: _ClassVar[GroupOutcome]
    GROUP_OUTCOME_DROPPED: _ClassVar[GroupOutcome]
    GROUP_OUTCOME_CANCELLED: _ClassVar[GroupOutcome]
    GROUP_OUTCOME_PARKED: _ClassVar[GroupOutcome]
FILTER_MODE_UNSPECIFIED: FilterMode
FILTER_MODE_OFF: FilterMode
FILTER_MODE_MASK: FilterMode
FILTER_MODE_DROP_AND_BACKFILL: FilterMode
STALENESS_MODE_UNSPECIFIED: StalenessMode
STALENESS_MODE_DROP: StalenessMode
STALENESS_MODE_COUNT: StalenessMode
STALENESS_MODE_MASK: StalenessMode
INFRA_FAILURE_UNSPECIFIED: InfraFailure
INFRA_FAILURE_SANDBOX_LOST: InfraFailure
INFRA_FAILURE_BACKEND: InfraFailure
INFRA_FAILURE_VERIFIER: InfraFailure
INFRA_FAILURE_GENERATOR: InfraFailure
GROUP_OUTCOME_UNSPECIFIED: GroupOutcome
GROUP_OUTCOME_ADMITTED: GroupOutcome
GROUP_OUTCOME_MASKED: GroupOutcome
GROUP_OUTCOME_DROPPED: GroupOutcome
GROUP_OUTCOME_CANCELLED: GroupOutcome
GROUP_OUTCOME_PARKED: GroupOutcome

class RunConfig(_message.Message):
    __slots__ = ("batch_groups", "group_size", "max_staleness", "staleness_mode", "filter_mode", "filter_epsilon", "filter_mean_min", "filter_mean_max", "backfill_cap", "over_sample", "partial_rollouts", "max_versions_spanned", "pool", "sandboxes_per_group", "max_concurrent", "controller", "ack_timeout_seconds", "window_seconds")
    BATCH_GROUPS_FIELD_NUMBER: _ClassVar[int]
    GROUP_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_STALENESS_FIELD_NUMBER: _ClassVar[int]
    STALENESS_MODE_FIELD_NUMBER: _ClassVar[int]
    FILTER_MODE_FIELD_NUMBER: _ClassVar[int]
    FILTER_EPSILON_FIELD_NUMBER: _ClassVar[int]
    FILTER_MEAN_MIN_FIELD_NUMBER: _ClassVar[int]
    FILTER_MEAN_MAX_FIELD_NUMBER: _ClassVar[int]
    BACKFILL_CAP_FIELD_NUMBER: _ClassVar[int]
    OVER_SAMPLE_FIELD_NUMBER: _ClassVar[int]
    PARTIAL_ROLLOUTS_FIELD_NUMBER: _ClassVar[int]
    MAX_VERSIONS_SPANNED_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    SANDBOXES_PER_GROUP_FIELD_NUMBER: _ClassVar[int]
    MAX_CONCURRENT_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_FIELD_NUMBER: _ClassVar[int]
    ACK_TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_SECONDS_FIELD_NUMBER: _ClassVar[int]
    batch_groups: int
    group_size: int
    max_staleness: int
    staleness_mode: StalenessMode
    filter_mode: FilterMode
    filter_epsilon: float
    filter_mean_min: float
    filter_mean_max: float
    backfill_cap: int
    over_sample: float
    partial_rollouts: bool
    max_versions_spanned: int
    pool: str
    sandboxes_per_group: int
    max_concurrent: int
    controller: bool
    ack_timeout_seconds: float
    window_seconds: float
    def __init__(self, batch_groups: _Optional[int] = ..., group_size: _Optional[int] = ..., max_staleness: _Optional[int] = ..., staleness_mode: _Optional[_Union[StalenessMode, str]] = ..., filter_mode: _Optional[_Union[FilterMode, str]] = ..., filter_epsilon: _Optional[float] = ..., filter_mean_min: _Optional[float] = ..., filter_mean_max: _Optional[float] = ..., backfill_cap: _Optional[int] = ..., over_sample: _Optional[float] = ..., partial_rollouts: _Optional[bool] = ..., max_versions_spanned: _Optional[int] = ..., pool: _Optional[str] = ..., sandboxes_per_group: _Optional[int] = ..., max_concurrent: _Optional[int] = ..., controller: _Optional[bool] = ..., ack_timeout_seconds: _Optional[float] = ..., window_seconds: _Optional[float] = ...) -> None: ...

class ConfigureRunRequest(_message.Message):
    __slots__ = ("run", "config")
    RUN_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    run: str
    config: RunConfig
    def __init__(self, run: _Optional[str] = ..., config: _Optional[_Union[RunConfig, _Mapping]] = ...) -> None: ...

class ConfigureRunResponse(_message.Message):
    __slots__ = ("config", "policy_version")
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    config: RunConfig
    policy_version: int
    def __init__(self, config: _Optional[_Union[RunConfig, _Mapping]] = ..., policy_version: _Optional[int] = ...) -> None: ...

class Segment(_message.Message):
    __slots__ = ("policy_version", "tokens")
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    policy_version: int
    tokens: int
    def __init__(self, policy_version: _Optional[int] = ..., tokens: _Optional[int] = ...) -> None: ...

class ParkedTrajectory(_message.Message):
    __slots__ = ("trajectory_id", "payload", "segments", "snapshot_id", "env_policy_version")
    TRAJECTORY_ID_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    ENV_POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    trajectory_id: str
    payload: bytes
    segments: _containers.RepeatedCompositeFieldContainer[Segment]
    snapshot_id: str
    env_policy_version: int
    def __init__(self, trajectory_id: _Optional[str] = ..., payload: _Optional[bytes] = ..., segments: _Optional[_Iterable[_Union[Segment, _Mapping]]] = ..., snapshot_id: _Optional[str] = ..., env_policy_version: _Optional[int] = ...) -> None: ...

class Slot(_message.Message):
    __slots__ = ("group_id", "policy_version", "resume", "prompt_id", "image")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    PROMPT_ID_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    policy_version: int
    resume: _containers.RepeatedCompositeFieldContainer[ParkedTrajectory]
    prompt_id: str
    image: str
    def __init__(self, group_id: _Optional[str] = ..., policy_version: _Optional[int] = ..., resume: _Optional[_Iterable[_Union[ParkedTrajectory, _Mapping]]] = ..., prompt_id: _Optional[str] = ..., image: _Optional[str] = ...) -> None: ...

class RequestSlotsRequest(_message.Message):
    __slots__ = ("run", "count", "images")
    RUN_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    run: str
    count: int
    images: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, run: _Optional[str] = ..., count: _Optional[int] = ..., images: _Optional[_Iterable[str]] = ...) -> None: ...

class RequestSlotsResponse(_message.Message):
    __slots__ = ("slots", "policy_version")
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    slots: _containers.RepeatedCompositeFieldContainer[Slot]
    policy_version: int
    def __init__(self, slots: _Optional[_Iterable[_Union[Slot, _Mapping]]] = ..., policy_version: _Optional[int] = ...) -> None: ...

class Verifier(_message.Message):
    __slots__ = ("sandbox_id", "command", "timeout_seconds")
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    command: str
    timeout_seconds: float
    def __init__(self, sandbox_id: _Optional[str] = ..., command: _Optional[str] = ..., timeout_seconds: _Optional[float] = ...) -> None: ...

class StepReward(_message.Message):
    __slots__ = ("step", "reward", "components")
    class ComponentsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    STEP_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    COMPONENTS_FIELD_NUMBER: _ClassVar[int]
    step: int
    reward: float
    components: _containers.ScalarMap[str, float]
    def __init__(self, step: _Optional[int] = ..., reward: _Optional[float] = ..., components: _Optional[_Mapping[str, float]] = ...) -> None: ...

class Trajectory(_message.Message):
    __slots__ = ("trajectory_id", "payload", "segments", "reward", "components", "steps", "verifier", "failure", "failure_detail", "env_policy_version", "sandbox_id")
    class ComponentsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    TRAJECTORY_ID_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    COMPONENTS_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    VERIFIER_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    FAILURE_DETAIL_FIELD_NUMBER: _ClassVar[int]
    ENV_POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    trajectory_id: str
    payload: bytes
    segments: _containers.RepeatedCompositeFieldContainer[Segment]
    reward: float
    components: _containers.ScalarMap[str, float]
    steps: _containers.RepeatedCompositeFieldContainer[StepReward]
    verifier: Verifier
    failure: InfraFailure
    failure_detail: str
    env_policy_version: int
    sandbox_id: str
    def __init__(self, trajectory_id: _Optional[str] = ..., payload: _Optional[bytes] = ..., segments: _Optional[_Iterable[_Union[Segment, _Mapping]]] = ..., reward: _Optional[float] = ..., components: _Optional[_Mapping[str, float]] = ..., steps: _Optional[_Iterable[_Union[StepReward, _Mapping]]] = ..., verifier: _Optional[_Union[Verifier, _Mapping]] = ..., failure: _Optional[_Union[InfraFailure, str]] = ..., failure_detail: _Optional[str] = ..., env_policy_version: _Optional[int] = ..., sandbox_id: _Optional[str] = ...) -> None: ...

class ReportProgressRequest(_message.Message):
    __slots__ = ("run", "group_id", "lease_ids", "trajectories")
    RUN_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_IDS_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORIES_FIELD_NUMBER: _ClassVar[int]
    run: str
    group_id: str
    lease_ids: _containers.RepeatedScalarFieldContainer[str]
    trajectories: _containers.RepeatedCompositeFieldContainer[Trajectory]
    def __init__(self, run: _Optional[str] = ..., group_id: _Optional[str] = ..., lease_ids: _Optional[_Iterable[str]] = ..., trajectories: _Optional[_Iterable[_Union[Trajectory, _Mapping]]] = ...) -> None: ...

class ReportProgressResponse(_message.Message):
    __slots__ = ("cancelled", "outcome", "policy_version")
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    cancelled: bool
    outcome: GroupOutcome
    policy_version: int
    def __init__(self, cancelled: _Optional[bool] = ..., outcome: _Optional[_Union[GroupOutcome, str]] = ..., policy_version: _Optional[int] = ...) -> None: ...

class SubmitGroupRequest(_message.Message):
    __slots__ = ("run", "group_id", "prompt_id", "trajectories")
    RUN_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_ID_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORIES_FIELD_NUMBER: _ClassVar[int]
    run: str
    group_id: str
    prompt_id: str
    trajectories: _containers.RepeatedCompositeFieldContainer[Trajectory]
    def __init__(self, run: _Optional[str] = ..., group_id: _Optional[str] = ..., prompt_id: _Optional[str] = ..., trajectories: _Optional[_Iterable[_Union[Trajectory, _Mapping]]] = ...) -> None: ...

class ScoredTrajectory(_message.Message):
    __slots__ = ("trajectory_id", "payload", "segments", "reward", "components", "steps", "masked", "mask_reason", "failure", "failure_detail", "advantage", "segment_masked", "env_policy_version", "model_calls")
    class ComponentsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    TRAJECTORY_ID_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    COMPONENTS_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    MASKED_FIELD_NUMBER: _ClassVar[int]
    MASK_REASON_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    FAILURE_DETAIL_FIELD_NUMBER: _ClassVar[int]
    ADVANTAGE_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_MASKED_FIELD_NUMBER: _ClassVar[int]
    ENV_POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    MODEL_CALLS_FIELD_NUMBER: _ClassVar[int]
    trajectory_id: str
    payload: bytes
    segments: _containers.RepeatedCompositeFieldContainer[Segment]
    reward: float
    components: _containers.ScalarMap[str, float]
    steps: _containers.RepeatedCompositeFieldContainer[StepReward]
    masked: bool
    mask_reason: str
    failure: InfraFailure
    failure_detail: str
    advantage: float
    segment_masked: _containers.RepeatedScalarFieldContainer[bool]
    env_policy_version: int
    model_calls: _containers.RepeatedCompositeFieldContainer[ModelCall]
    def __init__(self, trajectory_id: _Optional[str] = ..., payload: _Optional[bytes] = ..., segments: _Optional[_Iterable[_Union[Segment, _Mapping]]] = ..., reward: _Optional[float] = ..., components: _Optional[_Mapping[str, float]] = ..., steps: _Optional[_Iterable[_Union[StepReward, _Mapping]]] = ..., masked: _Optional[bool] = ..., mask_reason: _Optional[str] = ..., failure: _Optional[_Union[InfraFailure, str]] = ..., failure_detail: _Optional[str] = ..., advantage: _Optional[float] = ..., segment_masked: _Optional[_Iterable[bool]] = ..., env_policy_version: _Optional[int] = ..., model_calls: _Optional[_Iterable[_Union[ModelCall, _Mapping]]] = ...) -> None: ...

class ModelCall(_message.Message):
    __slots__ = ("lease_id", "sandbox_id", "method", "path", "model", "status", "stream", "request", "request_truncated", "prompt_tokens", "completion_tokens", "prompt_token_ids", "choices", "started_at", "duration_seconds", "error")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    REQUEST_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    CHOICES_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    DURATION_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    sandbox_id: str
    method: str
    path: str
    model: str
    status: int
    stream: bool
    request: bytes
    request_truncated: bool
    prompt_tokens: int
    completion_tokens: int
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    choices: _containers.RepeatedCompositeFieldContainer[ModelChoice]
    started_at: float
    duration_seconds: float
    error: str
    def __init__(self, lease_id: _Optional[str] = ..., sandbox_id: _Optional[str] = ..., method: _Optional[str] = ..., path: _Optional[str] = ..., model: _Optional[str] = ..., status: _Optional[int] = ..., stream: _Optional[bool] = ..., request: _Optional[bytes] = ..., request_truncated: _Optional[bool] = ..., prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., choices: _Optional[_Iterable[_Union[ModelChoice, _Mapping]]] = ..., started_at: _Optional[float] = ..., duration_seconds: _Optional[float] = ..., error: _Optional[str] = ...) -> None: ...

class ModelChoice(_message.Message):
    __slots__ = ("index", "text", "token_ids", "logprobs", "finish_reason")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    index: int
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    finish_reason: str
    def __init__(self, index: _Optional[int] = ..., text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[float]] = ..., finish_reason: _Optional[str] = ...) -> None: ...

class ScoredGroup(_message.Message):
    __slots__ = ("group_id", "prompt_id", "start_version", "trajectories", "outcome", "reason", "reward_mean", "reward_std")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_ID_FIELD_NUMBER: _ClassVar[int]
    START_VERSION_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORIES_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REWARD_MEAN_FIELD_NUMBER: _ClassVar[int]
    REWARD_STD_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    prompt_id: str
    start_version: int
    trajectories: _containers.RepeatedCompositeFieldContainer[ScoredTrajectory]
    outcome: GroupOutcome
    reason: str
    reward_mean: float
    reward_std: float
    def __init__(self, group_id: _Optional[str] = ..., prompt_id: _Optional[str] = ..., start_version: _Optional[int] = ..., trajectories: _Optional[_Iterable[_Union[ScoredTrajectory, _Mapping]]] = ..., outcome: _Optional[_Union[GroupOutcome, str]] = ..., reason: _Optional[str] = ..., reward_mean: _Optional[float] = ..., reward_std: _Optional[float] = ...) -> None: ...

class SubmitGroupResponse(_message.Message):
    __slots__ = ("group",)
    GROUP_FIELD_NUMBER: _ClassVar[int]
    group: ScoredGroup
    def __init__(self, group: _Optional[_Union[ScoredGroup, _Mapping]] = ...) -> None: ...

class Batch(_message.Message):
    __slots__ = ("batch_id", "groups", "policy_version", "delivery")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_FIELD_NUMBER: _ClassVar[int]
    batch_id: str
    groups: _containers.RepeatedCompositeFieldContainer[ScoredGroup]
    policy_version: int
    delivery: int
    def __init__(self, batch_id: _Optional[str] = ..., groups: _Optional[_Iterable[_Union[ScoredGroup, _Mapping]]] = ..., policy_version: _Optional[int] = ..., delivery: _Optional[int] = ...) -> None: ...

class PullBatchRequest(_message.Message):
    __slots__ = ("run", "max_batches")
    RUN_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCHES_FIELD_NUMBER: _ClassVar[int]
    run: str
    max_batches: int
    def __init__(self, run: _Optional[str] = ..., max_batches: _Optional[int] = ...) -> None: ...

class PullBatchResponse(_message.Message):
    __slots__ = ("batch",)
    BATCH_FIELD_NUMBER: _ClassVar[int]
    batch: Batch
    def __init__(self, batch: _Optional[_Union[Batch, _Mapping]] = ...) -> None: ...

class AckBatchRequest(_message.Message):
    __slots__ = ("run", "batch_id")
    RUN_FIELD_NUMBER: _ClassVar[int]
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    run: str
    batch_id: str
    def __init__(self, run: _Optional[str] = ..., batch_id: _Optional[str] = ...) -> None: ...

class AckBatchResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PublishPolicyVersionRequest(_message.Message):
    __slots__ = ("run", "version")
    RUN_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    run: str
    version: int
    def __init__(self, run: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...

class PublishPolicyVersionResponse(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: int
    def __init__(self, version: _Optional[int] = ...) -> None: ...

class WatchPolicyVersionRequest(_message.Message):
    __slots__ = ("run",)
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: str
    def __init__(self, run: _Optional[str] = ...) -> None: ...

class WatchPolicyVersionResponse(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: int
    def __init__(self, version: _Optional[int] = ...) -> None: ...

class StalenessStats(_message.Message):
    __slots__ = ("mean", "max", "share_stale", "over_budget", "histogram")
    MEAN_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    SHARE_STALE_FIELD_NUMBER: _ClassVar[int]
    OVER_BUDGET_FIELD_NUMBER: _ClassVar[int]
    HISTOGRAM_FIELD_NUMBER: _ClassVar[int]
    mean: float
    max: int
    share_stale: float
    over_budget: int
    histogram: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, mean: _Optional[float] = ..., max: _Optional[int] = ..., share_stale: _Optional[float] = ..., over_budget: _Optional[int] = ..., histogram: _Optional[_Iterable[int]] = ...) -> None: ...

class Figures(_message.Message):
    __slots__ = ("production_rate", "keep_rate", "effective_rate", "consumption_rate", "trainer_idle_ratio", "generator_idle_ratio", "queue_depth", "in_flight", "parked", "unacked_batches", "staleness_trajectory", "staleness_token", "staleness_env", "filtered", "policy_version", "target_concurrency", "accepted_total", "consumed_groups", "infra_failures_masked", "window_seconds", "controller_reason", "lifecycle", "cost")
    class FilteredEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    PRODUCTION_RATE_FIELD_NUMBER: _ClassVar[int]
    KEEP_RATE_FIELD_NUMBER: _ClassVar[int]
    EFFECTIVE_RATE_FIELD_NUMBER: _ClassVar[int]
    CONSUMPTION_RATE_FIELD_NUMBER: _ClassVar[int]
    TRAINER_IDLE_RATIO_FIELD_NUMBER: _ClassVar[int]
    GENERATOR_IDLE_RATIO_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    PARKED_FIELD_NUMBER: _ClassVar[int]
    UNACKED_BATCHES_FIELD_NUMBER: _ClassVar[int]
    STALENESS_TRAJECTORY_FIELD_NUMBER: _ClassVar[int]
    STALENESS_TOKEN_FIELD_NUMBER: _ClassVar[int]
    STALENESS_ENV_FIELD_NUMBER: _ClassVar[int]
    FILTERED_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    TARGET_CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    CONSUMED_GROUPS_FIELD_NUMBER: _ClassVar[int]
    INFRA_FAILURES_MASKED_FIELD_NUMBER: _ClassVar[int]
    WINDOW_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_REASON_FIELD_NUMBER: _ClassVar[int]
    LIFECYCLE_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    production_rate: float
    keep_rate: float
    effective_rate: float
    consumption_rate: float
    trainer_idle_ratio: float
    generator_idle_ratio: float
    queue_depth: int
    in_flight: int
    parked: int
    unacked_batches: int
    staleness_trajectory: StalenessStats
    staleness_token: StalenessStats
    staleness_env: StalenessStats
    filtered: _containers.ScalarMap[str, int]
    policy_version: int
    target_concurrency: int
    accepted_total: int
    consumed_groups: int
    infra_failures_masked: int
    window_seconds: float
    controller_reason: str
    lifecycle: RolloutLifecycle
    cost: CostFigures
    def __init__(self, production_rate: _Optional[float] = ..., keep_rate: _Optional[float] = ..., effective_rate: _Optional[float] = ..., consumption_rate: _Optional[float] = ..., trainer_idle_ratio: _Optional[float] = ..., generator_idle_ratio: _Optional[float] = ..., queue_depth: _Optional[int] = ..., in_flight: _Optional[int] = ..., parked: _Optional[int] = ..., unacked_batches: _Optional[int] = ..., staleness_trajectory: _Optional[_Union[StalenessStats, _Mapping]] = ..., staleness_token: _Optional[_Union[StalenessStats, _Mapping]] = ..., staleness_env: _Optional[_Union[StalenessStats, _Mapping]] = ..., filtered: _Optional[_Mapping[str, int]] = ..., policy_version: _Optional[int] = ..., target_concurrency: _Optional[int] = ..., accepted_total: _Optional[int] = ..., consumed_groups: _Optional[int] = ..., infra_failures_masked: _Optional[int] = ..., window_seconds: _Optional[float] = ..., controller_reason: _Optional[str] = ..., lifecycle: _Optional[_Union[RolloutLifecycle, _Mapping]] = ..., cost: _Optional[_Union[CostFigures, _Mapping]] = ...) -> None: ...

class StageDistribution(_message.Message):
    __slots__ = ("stage", "count", "p50_seconds", "p90_seconds", "p99_seconds", "mean_seconds", "max_seconds", "share")
    STAGE_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    P50_SECONDS_FIELD_NUMBER: _ClassVar[int]
    P90_SECONDS_FIELD_NUMBER: _ClassVar[int]
    P99_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MEAN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MAX_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SHARE_FIELD_NUMBER: _ClassVar[int]
    stage: str
    count: int
    p50_seconds: float
    p90_seconds: float
    p99_seconds: float
    mean_seconds: float
    max_seconds: float
    share: float
    def __init__(self, stage: _Optional[str] = ..., count: _Optional[int] = ..., p50_seconds: _Optional[float] = ..., p90_seconds: _Optional[float] = ..., p99_seconds: _Optional[float] = ..., mean_seconds: _Optional[float] = ..., max_seconds: _Optional[float] = ..., share: _Optional[float] = ...) -> None: ...

class RolloutLifecycle(_message.Message):
    __slots__ = ("stages", "warm_sandboxes", "cold_sandboxes", "image_pulls", "bottleneck", "traces")
    STAGES_FIELD_NUMBER: _ClassVar[int]
    WARM_SANDBOXES_FIELD_NUMBER: _ClassVar[int]
    COLD_SANDBOXES_FIELD_NUMBER: _ClassVar[int]
    IMAGE_PULLS_FIELD_NUMBER: _ClassVar[int]
    BOTTLENECK_FIELD_NUMBER: _ClassVar[int]
    TRACES_FIELD_NUMBER: _ClassVar[int]
    stages: _containers.RepeatedCompositeFieldContainer[StageDistribution]
    warm_sandboxes: int
    cold_sandboxes: int
    image_pulls: int
    bottleneck: str
    traces: int
    def __init__(self, stages: _Optional[_Iterable[_Union[StageDistribution, _Mapping]]] = ..., warm_sandboxes: _Optional[int] = ..., cold_sandboxes: _Optional[int] = ..., image_pulls: _Optional[int] = ..., bottleneck: _Optional[str] = ..., traces: _Optional[int] = ...) -> None: ...

class CostFigures(_message.Message):
    __slots__ = ("trainer_idle_usd_per_step", "trainer_idle_usd_per_hour", "sandbox_usd_per_rollout", "sandbox_usd_per_step", "usd_per_mtok", "sandbox_usd_per_mtok", "trainer_idle_usd_per_mtok", "window_trainer_idle_usd", "window_sandbox_usd", "sandbox_usd_total", "steps", "rollouts", "tokens", "gpu_hour_usd", "trainer_gpus", "sandbox_cpu_hour_usd", "sandbox_gb_hour_usd")
    TRAINER_IDLE_USD_PER_STEP_FIELD_NUMBER: _ClassVar[int]
    TRAINER_IDLE_USD_PER_HOUR_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_USD_PER_ROLLOUT_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_USD_PER_STEP_FIELD_NUMBER: _ClassVar[int]
    USD_PER_MTOK_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_USD_PER_MTOK_FIELD_NUMBER: _ClassVar[int]
    TRAINER_IDLE_USD_PER_MTOK_FIELD_NUMBER: _ClassVar[int]
    WINDOW_TRAINER_IDLE_USD_FIELD_NUMBER: _ClassVar[int]
    WINDOW_SANDBOX_USD_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_USD_TOTAL_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    ROLLOUTS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    GPU_HOUR_USD_FIELD_NUMBER: _ClassVar[int]
    TRAINER_GPUS_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_CPU_HOUR_USD_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_GB_HOUR_USD_FIELD_NUMBER: _ClassVar[int]
    trainer_idle_usd_per_step: float
    trainer_idle_usd_per_hour: float
    sandbox_usd_per_rollout: float
    sandbox_usd_per_step: float
    usd_per_mtok: float
    sandbox_usd_per_mtok: float
    trainer_idle_usd_per_mtok: float
    window_trainer_idle_usd: float
    window_sandbox_usd: float
    sandbox_usd_total: float
    steps: int
    rollouts: int
    tokens: int
    gpu_hour_usd: float
    trainer_gpus: int
    sandbox_cpu_hour_usd: float
    sandbox_gb_hour_usd: float
    def __init__(self, trainer_idle_usd_per_step: _Optional[float] = ..., trainer_idle_usd_per_hour: _Optional[float] = ..., sandbox_usd_per_rollout: _Optional[float] = ..., sandbox_usd_per_step: _Optional[float] = ..., usd_per_mtok: _Optional[float] = ..., sandbox_usd_per_mtok: _Optional[float] = ..., trainer_idle_usd_per_mtok: _Optional[float] = ..., window_trainer_idle_usd: _Optional[float] = ..., window_sandbox_usd: _Optional[float] = ..., sandbox_usd_total: _Optional[float] = ..., steps: _Optional[int] = ..., rollouts: _Optional[int] = ..., tokens: _Optional[int] = ..., gpu_hour_usd: _Optional[float] = ..., trainer_gpus: _Optional[int] = ..., sandbox_cpu_hour_usd: _Optional[float] = ..., sandbox_gb_hour_usd: _Optional[float] = ...) -> None: ...

class GetFiguresRequest(_message.Message):
    __slots__ = ("run",)
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: str
    def __init__(self, run: _Optional[str] = ...) -> None: ...

class GetFiguresResponse(_message.Message):
    __slots__ = ("figures",)
    FIGURES_FIELD_NUMBER: _ClassVar[int]
    figures: Figures
    def __init__(self, figures: _Optional[_Union[Figures, _Mapping]] = ...) -> None: ...
