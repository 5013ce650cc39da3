import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from sandboxd.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PoolSpec(_message.Message):
    __slots__ = ("name", "image", "min_ready", "max_size", "limits", "env", "labels", "max_ready", "idle_seconds", "runtime", "images", "network", "live_snapshots", "recycle", "recycle_label", "max_uses", "model_endpoint", "image_pull_secrets", "root")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    MIN_READY_FIELD_NUMBER: _ClassVar[int]
    MAX_SIZE_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    MAX_READY_FIELD_NUMBER: _ClassVar[int]
    IDLE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_FIELD_NUMBER: _ClassVar[int]
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    NETWORK_FIELD_NUMBER: _ClassVar[int]
    LIVE_SNAPSHOTS_FIELD_NUMBER: _ClassVar[int]
    RECYCLE_FIELD_NUMBER: _ClassVar[int]
    RECYCLE_LABEL_FIELD_NUMBER: _ClassVar[int]
    MAX_USES_FIELD_NUMBER: _ClassVar[int]
    MODEL_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    IMAGE_PULL_SECRETS_FIELD_NUMBER: _ClassVar[int]
    ROOT_FIELD_NUMBER: _ClassVar[int]
    name: str
    image: str
    min_ready: int
    max_size: int
    limits: _common_pb2.Limits
    env: _containers.ScalarMap[str, str]
    labels: _containers.ScalarMap[str, str]
    max_ready: int
    idle_seconds: float
    runtime: str
    images: _containers.RepeatedScalarFieldContainer[str]
    network: _containers.RepeatedScalarFieldContainer[str]
    live_snapshots: str
    recycle: str
    recycle_label: str
    max_uses: int
    model_endpoint: str
    image_pull_secrets: _containers.RepeatedScalarFieldContainer[str]
    root: str
    def __init__(self, name: _Optional[str] = ..., image: _Optional[str] = ..., min_ready: _Optional[int] = ..., max_size: _Optional[int] = ..., limits: _Optional[_Union[_common_pb2.Limits, _Mapping]] = ..., env: _Optional[_Mapping[str, str]] = ..., labels: _Optional[_Mapping[str, str]] = ..., max_ready: _Optional[int] = ..., idle_seconds: _Optional[float] = ..., runtime: _Optional[str] = ..., images: _Optional[_Iterable[str]] = ..., network: _Optional[_Iterable[str]] = ..., live_snapshots: _Optional[str] = ..., recycle: _Optional[str] = ..., recycle_label: _Optional[str] = ..., max_uses: _Optional[int] = ..., model_endpoint: _Optional[str] = ..., image_pull_secrets: _Optional[_Iterable[str]] = ..., root: _Optional[str] = ...) -> None: ...

class PoolStatus(_message.Message):
    __slots__ = ("ready", "creating", "leased", "releasing", "failed_total", "waiting", "last_error", "warm_target", "recycled_total", "reset_p50_seconds", "create_p50_seconds")
    READY_FIELD_NUMBER: _ClassVar[int]
    CREATING_FIELD_NUMBER: _ClassVar[int]
    LEASED_FIELD_NUMBER: _ClassVar[int]
    RELEASING_FIELD_NUMBER: _ClassVar[int]
    FAILED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    WARM_TARGET_FIELD_NUMBER: _ClassVar[int]
    RECYCLED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    RESET_P50_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CREATE_P50_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ready: int
    creating: int
    leased: int
    releasing: int
    failed_total: int
    waiting: int
    last_error: str
    warm_target: int
    recycled_total: int
    reset_p50_seconds: float
    create_p50_seconds: float
    def __init__(self, ready: _Optional[int] = ..., creating: _Optional[int] = ..., leased: _Optional[int] = ..., releasing: _Optional[int] = ..., failed_total: _Optional[int] = ..., waiting: _Optional[int] = ..., last_error: _Optional[str] = ..., warm_target: _Optional[int] = ..., recycled_total: _Optional[int] = ..., reset_p50_seconds: _Optional[float] = ..., create_p50_seconds: _Optional[float] = ...) -> None: ...

class Pool(_message.Message):
    __slots__ = ("spec", "status", "created_at")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    spec: PoolSpec
    status: PoolStatus
    created_at: _timestamp_pb2.Timestamp
    def __init__(self, spec: _Optional[_Union[PoolSpec, _Mapping]] = ..., status: _Optional[_Union[PoolStatus, _Mapping]] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class CreatePoolRequest(_message.Message):
    __slots__ = ("spec",)
    SPEC_FIELD_NUMBER: _ClassVar[int]
    spec: PoolSpec
    def __init__(self, spec: _Optional[_Union[PoolSpec, _Mapping]] = ...) -> None: ...

class CreatePoolResponse(_message.Message):
    __slots__ = ("pool",)
    POOL_FIELD_NUMBER: _ClassVar[int]
    pool: Pool
    def __init__(self, pool: _Optional[_Union[Pool, _Mapping]] = ...) -> None: ...

class GetPoolRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class GetPoolResponse(_message.Message):
    __slots__ = ("pool",)
    POOL_FIELD_NUMBER: _ClassVar[int]
    pool: Pool
    def __init__(self, pool: _Optional[_Union[Pool, _Mapping]] = ...) -> None: ...

class ListPoolsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListPoolsResponse(_message.Message):
    __slots__ = ("pools",)
    POOLS_FIELD_NUMBER: _ClassVar[int]
    pools: _containers.RepeatedCompositeFieldContainer[Pool]
    def __init__(self, pools: _Optional[_Iterable[_Union[Pool, _Mapping]]] = ...) -> None: ...

class UpdatePoolRequest(_message.Message):
    __slots__ = ("name", "min_ready", "max_size", "max_ready")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MIN_READY_FIELD_NUMBER: _ClassVar[int]
    MAX_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_READY_FIELD_NUMBER: _ClassVar[int]
    name: str
    min_ready: int
    max_size: int
    max_ready: int
    def __init__(self, name: _Optional[str] = ..., min_ready: _Optional[int] = ..., max_size: _Optional[int] = ..., max_ready: _Optional[int] = ...) -> None: ...

class UpdatePoolResponse(_message.Message):
    __slots__ = ("pool",)
    POOL_FIELD_NUMBER: _ClassVar[int]
    pool: Pool
    def __init__(self, pool: _Optional[_Union[Pool, _Mapping]] = ...) -> None: ...

class DeletePoolRequest(_message.Message):
    __slots__ = ("name", "force")
    NAME_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    name: str
    force: bool
    def __init__(self, name: _Optional[str] = ..., force: _Optional[bool] = ...) -> None: ...

class DeletePoolResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
