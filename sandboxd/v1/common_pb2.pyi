import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SandboxState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SANDBOX_STATE_UNSPECIFIED: _ClassVar[SandboxState]
    SANDBOX_STATE_CREATING: _ClassVar[SandboxState]
    SANDBOX_STATE_READY: _ClassVar[SandboxState]
    SANDBOX_STATE_LEASED: _ClassVar[SandboxState]
    SANDBOX_STATE_RELEASING: _ClassVar[SandboxState]
    SANDBOX_STATE_GONE: _ClassVar[SandboxState]
    SANDBOX_STATE_FAILED: _ClassVar[SandboxState]
SANDBOX_STATE_UNSPECIFIED: SandboxState
SANDBOX_STATE_CREATING: SandboxState
SANDBOX_STATE_READY: SandboxState
SANDBOX_STATE_LEASED: SandboxState
SANDBOX_STATE_RELEASING: SandboxState
SANDBOX_STATE_GONE: SandboxState
SANDBOX_STATE_FAILED: SandboxState

class Limits(_message.Message):
    __slots__ = ("memory_bytes", "cpu_millis", "pids", "disk_bytes", "max_files", "output_bytes", "lifetime_seconds")
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    CPU_MILLIS_FIELD_NUMBER: _ClassVar[int]
    PIDS_FIELD_NUMBER: _ClassVar[int]
    DISK_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_FILES_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_BYTES_FIELD_NUMBER: _ClassVar[int]
    LIFETIME_SECONDS_FIELD_NUMBER: _ClassVar[int]
    memory_bytes: int
    cpu_millis: int
    pids: int
    disk_bytes: int
    max_files: int
    output_bytes: int
    lifetime_seconds: int
    def __init__(self, memory_bytes: _Optional[int] = ..., cpu_millis: _Optional[int] = ..., pids: _Optional[int] = ..., disk_bytes: _Optional[int] = ..., max_files: _Optional[int] = ..., output_bytes: _Optional[int] = ..., lifetime_seconds: _Optional[int] = ...) -> None: ...

class Sandbox(_message.Message):
    __slots__ = ("id", "pool", "image", "state", "lease_id", "labels", "limits", "created_at", "ready_at", "leased_at", "lease_expires_at", "failure_reason", "paused", "network", "no_network")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    READY_AT_FIELD_NUMBER: _ClassVar[int]
    LEASED_AT_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    FAILURE_REASON_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    NETWORK_FIELD_NUMBER: _ClassVar[int]
    NO_NETWORK_FIELD_NUMBER: _ClassVar[int]
    id: str
    pool: str
    image: str
    state: SandboxState
    lease_id: str
    labels: _containers.ScalarMap[str, str]
    limits: Limits
    created_at: _timestamp_pb2.Timestamp
    ready_at: _timestamp_pb2.Timestamp
    leased_at: _timestamp_pb2.Timestamp
    lease_expires_at: _timestamp_pb2.Timestamp
    failure_reason: str
    paused: bool
    network: _containers.RepeatedScalarFieldContainer[str]
    no_network: bool
    def __init__(self, id: _Optional[str] = ..., pool: _Optional[str] = ..., image: _Optional[str] = ..., state: _Optional[_Union[SandboxState, str]] = ..., lease_id: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., limits: _Optional[_Union[Limits, _Mapping]] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., ready_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., leased_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., lease_expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., failure_reason: _Optional[str] = ..., paused: _Optional[bool] = ..., network: _Optional[_Iterable[str]] = ..., no_network: _Optional[bool] = ...) -> None: ...
