import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from sandboxd.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AcquireRequest(_message.Message):
    __slots__ = ("pool", "n", "min_n", "labels", "lease_ttl_seconds", "timeout_seconds", "limits", "request_id", "image", "network", "no_network")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    POOL_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    MIN_N_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    NETWORK_FIELD_NUMBER: _ClassVar[int]
    NO_NETWORK_FIELD_NUMBER: _ClassVar[int]
    pool: str
    n: int
    min_n: int
    labels: _containers.ScalarMap[str, str]
    lease_ttl_seconds: float
    timeout_seconds: float
    limits: _common_pb2.Limits
    request_id: str
    image: str
    network: _containers.RepeatedScalarFieldContainer[str]
    no_network: bool
    def __init__(self, pool: _Optional[str] = ..., n: _Optional[int] = ..., min_n: _Optional[int] = ..., labels: _Optional[_Mapping[str, str]] = ..., lease_ttl_seconds: _Optional[float] = ..., timeout_seconds: _Optional[float] = ..., limits: _Optional[_Union[_common_pb2.Limits, _Mapping]] = ..., request_id: _Optional[str] = ..., image: _Optional[str] = ..., network: _Optional[_Iterable[str]] = ..., no_network: _Optional[bool] = ...) -> None: ...

class Lease(_message.Message):
    __slots__ = ("id", "sandbox_ids", "ttl_seconds", "expires_at", "network", "no_network")
    ID_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_IDS_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    NETWORK_FIELD_NUMBER: _ClassVar[int]
    NO_NETWORK_FIELD_NUMBER: _ClassVar[int]
    id: str
    sandbox_ids: _containers.RepeatedScalarFieldContainer[str]
    ttl_seconds: float
    expires_at: _timestamp_pb2.Timestamp
    network: _containers.RepeatedScalarFieldContainer[str]
    no_network: bool
    def __init__(self, id: _Optional[str] = ..., sandbox_ids: _Optional[_Iterable[str]] = ..., ttl_seconds: _Optional[float] = ..., expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., network: _Optional[_Iterable[str]] = ..., no_network: _Optional[bool] = ...) -> None: ...

class AcquireResponse(_message.Message):
    __slots__ = ("lease", "sandboxes")
    LEASE_FIELD_NUMBER: _ClassVar[int]
    SANDBOXES_FIELD_NUMBER: _ClassVar[int]
    lease: Lease
    sandboxes: _containers.RepeatedCompositeFieldContainer[_common_pb2.Sandbox]
    def __init__(self, lease: _Optional[_Union[Lease, _Mapping]] = ..., sandboxes: _Optional[_Iterable[_Union[_common_pb2.Sandbox, _Mapping]]] = ...) -> None: ...

class SetLeaseNetworkRequest(_message.Message):
    __slots__ = ("lease_id", "network", "no_network")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    NETWORK_FIELD_NUMBER: _ClassVar[int]
    NO_NETWORK_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    network: _containers.RepeatedScalarFieldContainer[str]
    no_network: bool
    def __init__(self, lease_id: _Optional[str] = ..., network: _Optional[_Iterable[str]] = ..., no_network: _Optional[bool] = ...) -> None: ...

class SetLeaseNetworkResponse(_message.Message):
    __slots__ = ("lease",)
    LEASE_FIELD_NUMBER: _ClassVar[int]
    lease: Lease
    def __init__(self, lease: _Optional[_Union[Lease, _Mapping]] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("lease_id", "ttl_seconds")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    ttl_seconds: float
    def __init__(self, lease_id: _Optional[str] = ..., ttl_seconds: _Optional[float] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("lease",)
    LEASE_FIELD_NUMBER: _ClassVar[int]
    lease: Lease
    def __init__(self, lease: _Optional[_Union[Lease, _Mapping]] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("lease_id", "sandbox_ids", "request_id")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_IDS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    sandbox_ids: _containers.RepeatedScalarFieldContainer[str]
    request_id: str
    def __init__(self, lease_id: _Optional[str] = ..., sandbox_ids: _Optional[_Iterable[str]] = ..., request_id: _Optional[str] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ("released",)
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, released: _Optional[_Iterable[str]] = ...) -> None: ...

class GetSandboxRequest(_message.Message):
    __slots__ = ("sandbox_id",)
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    def __init__(self, sandbox_id: _Optional[str] = ...) -> None: ...

class GetSandboxResponse(_message.Message):
    __slots__ = ("sandbox",)
    SANDBOX_FIELD_NUMBER: _ClassVar[int]
    sandbox: _common_pb2.Sandbox
    def __init__(self, sandbox: _Optional[_Union[_common_pb2.Sandbox, _Mapping]] = ...) -> None: ...

class ListSandboxesRequest(_message.Message):
    __slots__ = ("pool", "state", "labels")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    POOL_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    pool: str
    state: _common_pb2.SandboxState
    labels: _containers.ScalarMap[str, str]
    def __init__(self, pool: _Optional[str] = ..., state: _Optional[_Union[_common_pb2.SandboxState, str]] = ..., labels: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ListSandboxesResponse(_message.Message):
    __slots__ = ("sandboxes",)
    SANDBOXES_FIELD_NUMBER: _ClassVar[int]
    sandboxes: _containers.RepeatedCompositeFieldContainer[_common_pb2.Sandbox]
    def __init__(self, sandboxes: _Optional[_Iterable[_Union[_common_pb2.Sandbox, _Mapping]]] = ...) -> None: ...

class GetUsageRequest(_message.Message):
    __slots__ = ("sandbox_id",)
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    def __init__(self, sandbox_id: _Optional[str] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("memory_bytes", "memory_peak_bytes", "pids", "disk_bytes", "disk_limit_bytes", "files", "files_limit", "cpu_seconds")
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_PEAK_BYTES_FIELD_NUMBER: _ClassVar[int]
    PIDS_FIELD_NUMBER: _ClassVar[int]
    DISK_BYTES_FIELD_NUMBER: _ClassVar[int]
    DISK_LIMIT_BYTES_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    FILES_LIMIT_FIELD_NUMBER: _ClassVar[int]
    CPU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    memory_bytes: int
    memory_peak_bytes: int
    pids: int
    disk_bytes: int
    disk_limit_bytes: int
    files: int
    files_limit: int
    cpu_seconds: float
    def __init__(self, memory_bytes: _Optional[int] = ..., memory_peak_bytes: _Optional[int] = ..., pids: _Optional[int] = ..., disk_bytes: _Optional[int] = ..., disk_limit_bytes: _Optional[int] = ..., files: _Optional[int] = ..., files_limit: _Optional[int] = ..., cpu_seconds: _Optional[float] = ...) -> None: ...

class GetUsageResponse(_message.Message):
    __slots__ = ("usage",)
    USAGE_FIELD_NUMBER: _ClassVar[int]
    usage: Usage
    def __init__(self, usage: _Optional[_Union[Usage, _Mapping]] = ...) -> None: ...

class PauseRequest(_message.Message):
    __slots__ = ("sandbox_id",)
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    def __init__(self, sandbox_id: _Optional[str] = ...) -> None: ...

class PauseResponse(_message.Message):
    __slots__ = ("sandbox",)
    SANDBOX_FIELD_NUMBER: _ClassVar[int]
    sandbox: _common_pb2.Sandbox
    def __init__(self, sandbox: _Optional[_Union[_common_pb2.Sandbox, _Mapping]] = ...) -> None: ...

class ResumeRequest(_message.Message):
    __slots__ = ("sandbox_id",)
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    def __init__(self, sandbox_id: _Optional[str] = ...) -> None: ...

class ResumeResponse(_message.Message):
    __slots__ = ("sandbox",)
    SANDBOX_FIELD_NUMBER: _ClassVar[int]
    sandbox: _common_pb2.Sandbox
    def __init__(self, sandbox: _Optional[_Union[_common_pb2.Sandbox, _Mapping]] = ...) -> None: ...
