import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PoolScaling(_message.Message):
    __slots__ = ("pool", "ready", "leased", "starting", "releasing", "waiting", "warm_target", "warm_keep", "min_ready", "max_ready", "max_size", "acquire_rate", "startup_seconds", "announced", "reason", "failed_total", "last_error", "created_total", "oldest_wait_seconds", "in_doubt", "engine_degraded", "start_window", "images", "pulls")
    POOL_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    LEASED_FIELD_NUMBER: _ClassVar[int]
    STARTING_FIELD_NUMBER: _ClassVar[int]
    RELEASING_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    WARM_TARGET_FIELD_NUMBER: _ClassVar[int]
    WARM_KEEP_FIELD_NUMBER: _ClassVar[int]
    MIN_READY_FIELD_NUMBER: _ClassVar[int]
    MAX_READY_FIELD_NUMBER: _ClassVar[int]
    MAX_SIZE_FIELD_NUMBER: _ClassVar[int]
    ACQUIRE_RATE_FIELD_NUMBER: _ClassVar[int]
    STARTUP_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ANNOUNCED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    FAILED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    CREATED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    OLDEST_WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    IN_DOUBT_FIELD_NUMBER: _ClassVar[int]
    ENGINE_DEGRADED_FIELD_NUMBER: _ClassVar[int]
    START_WINDOW_FIELD_NUMBER: _ClassVar[int]
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    PULLS_FIELD_NUMBER: _ClassVar[int]
    pool: str
    ready: int
    leased: int
    starting: int
    releasing: int
    waiting: int
    warm_target: int
    warm_keep: int
    min_ready: int
    max_ready: int
    max_size: int
    acquire_rate: float
    startup_seconds: float
    announced: int
    reason: str
    failed_total: int
    last_error: str
    created_total: int
    oldest_wait_seconds: float
    in_doubt: int
    engine_degraded: str
    start_window: int
    images: _containers.RepeatedCompositeFieldContainer[ImageScaling]
    pulls: _containers.RepeatedCompositeFieldContainer[ImagePull]
    def __init__(self, pool: _Optional[str] = ..., ready: _Optional[int] = ..., leased: _Optional[int] = ..., starting: _Optional[int] = ..., releasing: _Optional[int] = ..., waiting: _Optional[int] = ..., warm_target: _Optional[int] = ..., warm_keep: _Optional[int] = ..., min_ready: _Optional[int] = ..., max_ready: _Optional[int] = ..., max_size: _Optional[int] = ..., acquire_rate: _Optional[float] = ..., startup_seconds: _Optional[float] = ..., announced: _Optional[int] = ..., reason: _Optional[str] = ..., failed_total: _Optional[int] = ..., last_error: _Optional[str] = ..., created_total: _Optional[int] = ..., oldest_wait_seconds: _Optional[float] = ..., in_doubt: _Optional[int] = ..., engine_degraded: _Optional[str] = ..., start_window: _Optional[int] = ..., images: _Optional[_Iterable[_Union[ImageScaling, _Mapping]]] = ..., pulls: _Optional[_Iterable[_Union[ImagePull, _Mapping]]] = ...) -> None: ...

class ImageScaling(_message.Message):
    __slots__ = ("image", "ready", "starting", "waiting", "warm_target")
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    STARTING_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    WARM_TARGET_FIELD_NUMBER: _ClassVar[int]
    image: str
    ready: int
    starting: int
    waiting: int
    warm_target: int
    def __init__(self, image: _Optional[str] = ..., ready: _Optional[int] = ..., starting: _Optional[int] = ..., waiting: _Optional[int] = ..., warm_target: _Optional[int] = ...) -> None: ...

class ImagePull(_message.Message):
    __slots__ = ("image", "state", "bytes_done", "bytes_total", "started", "detail")
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    BYTES_DONE_FIELD_NUMBER: _ClassVar[int]
    BYTES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    STARTED_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    image: str
    state: str
    bytes_done: int
    bytes_total: int
    started: _timestamp_pb2.Timestamp
    detail: str
    def __init__(self, image: _Optional[str] = ..., state: _Optional[str] = ..., bytes_done: _Optional[int] = ..., bytes_total: _Optional[int] = ..., started: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., detail: _Optional[str] = ...) -> None: ...

class SetDemandRequest(_message.Message):
    __slots__ = ("pool", "source", "count", "in_seconds", "ttl_seconds", "images")
    class ImagesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    POOL_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    IN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    pool: str
    source: str
    count: int
    in_seconds: float
    ttl_seconds: float
    images: _containers.ScalarMap[str, int]
    def __init__(self, pool: _Optional[str] = ..., source: _Optional[str] = ..., count: _Optional[int] = ..., in_seconds: _Optional[float] = ..., ttl_seconds: _Optional[float] = ..., images: _Optional[_Mapping[str, int]] = ...) -> None: ...

class SetDemandResponse(_message.Message):
    __slots__ = ("pool",)
    POOL_FIELD_NUMBER: _ClassVar[int]
    pool: PoolScaling
    def __init__(self, pool: _Optional[_Union[PoolScaling, _Mapping]] = ...) -> None: ...

class PrewarmRequest(_message.Message):
    __slots__ = ("pool", "count", "ttl_seconds", "wait", "timeout_seconds", "source")
    POOL_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    WAIT_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    pool: str
    count: int
    ttl_seconds: float
    wait: bool
    timeout_seconds: float
    source: str
    def __init__(self, pool: _Optional[str] = ..., count: _Optional[int] = ..., ttl_seconds: _Optional[float] = ..., wait: _Optional[bool] = ..., timeout_seconds: _Optional[float] = ..., source: _Optional[str] = ...) -> None: ...

class PrewarmResponse(_message.Message):
    __slots__ = ("pool",)
    POOL_FIELD_NUMBER: _ClassVar[int]
    pool: PoolScaling
    def __init__(self, pool: _Optional[_Union[PoolScaling, _Mapping]] = ...) -> None: ...

class WatchPoolRequest(_message.Message):
    __slots__ = ("pool", "interval_seconds")
    POOL_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    pool: str
    interval_seconds: float
    def __init__(self, pool: _Optional[str] = ..., interval_seconds: _Optional[float] = ...) -> None: ...

class WatchPoolResponse(_message.Message):
    __slots__ = ("at", "pools")
    AT_FIELD_NUMBER: _ClassVar[int]
    POOLS_FIELD_NUMBER: _ClassVar[int]
    at: _timestamp_pb2.Timestamp
    pools: _containers.RepeatedCompositeFieldContainer[PoolScaling]
    def __init__(self, at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., pools: _Optional[_Iterable[_Union[PoolScaling, _Mapping]]] = ...) -> None: ...
