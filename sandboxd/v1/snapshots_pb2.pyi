import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from sandboxd.v1 import common_pb2 as _common_pb2
from sandboxd.v1 import sandboxes_pb2 as _sandboxes_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SnapshotRef(_message.Message):
    __slots__ = ("id", "policy_version", "turn", "created_at")
    ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    TURN_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    id: str
    policy_version: int
    turn: int
    created_at: _timestamp_pb2.Timestamp
    def __init__(self, id: _Optional[str] = ..., policy_version: _Optional[int] = ..., turn: _Optional[int] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Snapshot(_message.Message):
    __slots__ = ("id", "pool", "image", "labels", "policy_version", "turn", "parent_id", "session", "cwd", "env", "size_bytes", "stored_bytes", "entry_count", "digest", "created_at", "expires_at", "chain", "live", "memory_limit_bytes", "not_carried", "cwd_bytes", "env_bytes")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class EnvBytesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    TURN_FIELD_NUMBER: _ClassVar[int]
    PARENT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    CWD_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    STORED_BYTES_FIELD_NUMBER: _ClassVar[int]
    ENTRY_COUNT_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    CHAIN_FIELD_NUMBER: _ClassVar[int]
    LIVE_FIELD_NUMBER: _ClassVar[int]
    MEMORY_LIMIT_BYTES_FIELD_NUMBER: _ClassVar[int]
    NOT_CARRIED_FIELD_NUMBER: _ClassVar[int]
    CWD_BYTES_FIELD_NUMBER: _ClassVar[int]
    ENV_BYTES_FIELD_NUMBER: _ClassVar[int]
    id: str
    pool: str
    image: str
    labels: _containers.ScalarMap[str, str]
    policy_version: int
    turn: int
    parent_id: str
    session: str
    cwd: str
    env: _containers.ScalarMap[str, str]
    size_bytes: int
    stored_bytes: int
    entry_count: int
    digest: str
    created_at: _timestamp_pb2.Timestamp
    expires_at: _timestamp_pb2.Timestamp
    chain: _containers.RepeatedCompositeFieldContainer[SnapshotRef]
    live: bool
    memory_limit_bytes: int
    not_carried: _containers.RepeatedScalarFieldContainer[str]
    cwd_bytes: bytes
    env_bytes: _containers.ScalarMap[str, bytes]
    def __init__(self, id: _Optional[str] = ..., pool: _Optional[str] = ..., image: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., policy_version: _Optional[int] = ..., turn: _Optional[int] = ..., parent_id: _Optional[str] = ..., session: _Optional[str] = ..., cwd: _Optional[str] = ..., env: _Optional[_Mapping[str, str]] = ..., size_bytes: _Optional[int] = ..., stored_bytes: _Optional[int] = ..., entry_count: _Optional[int] = ..., digest: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., chain: _Optional[_Iterable[_Union[SnapshotRef, _Mapping]]] = ..., live: _Optional[bool] = ..., memory_limit_bytes: _Optional[int] = ..., not_carried: _Optional[_Iterable[str]] = ..., cwd_bytes: _Optional[bytes] = ..., env_bytes: _Optional[_Mapping[str, bytes]] = ...) -> None: ...

class SnapshotRequest(_message.Message):
    __slots__ = ("sandbox_id", "session", "labels", "policy_version", "turn", "ttl_seconds", "live")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    TURN_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LIVE_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    session: str
    labels: _containers.ScalarMap[str, str]
    policy_version: int
    turn: int
    ttl_seconds: float
    live: bool
    def __init__(self, sandbox_id: _Optional[str] = ..., session: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., policy_version: _Optional[int] = ..., turn: _Optional[int] = ..., ttl_seconds: _Optional[float] = ..., live: _Optional[bool] = ...) -> None: ...

class SnapshotResponse(_message.Message):
    __slots__ = ("snapshot",)
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    snapshot: Snapshot
    def __init__(self, snapshot: _Optional[_Union[Snapshot, _Mapping]] = ...) -> None: ...

class RestoreRequest(_message.Message):
    __slots__ = ("snapshot_id", "n", "pool", "labels", "lease_ttl_seconds", "timeout_seconds", "network", "request_id", "no_network")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    NETWORK_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    NO_NETWORK_FIELD_NUMBER: _ClassVar[int]
    snapshot_id: str
    n: int
    pool: str
    labels: _containers.ScalarMap[str, str]
    lease_ttl_seconds: float
    timeout_seconds: float
    network: _containers.RepeatedScalarFieldContainer[str]
    request_id: str
    no_network: bool
    def __init__(self, snapshot_id: _Optional[str] = ..., n: _Optional[int] = ..., pool: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., lease_ttl_seconds: _Optional[float] = ..., timeout_seconds: _Optional[float] = ..., network: _Optional[_Iterable[str]] = ..., request_id: _Optional[str] = ..., no_network: _Optional[bool] = ...) -> None: ...

class RestoreResponse(_message.Message):
    __slots__ = ("lease", "sandboxes", "snapshot")
    LEASE_FIELD_NUMBER: _ClassVar[int]
    SANDBOXES_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    lease: _sandboxes_pb2.Lease
    sandboxes: _containers.RepeatedCompositeFieldContainer[_common_pb2.Sandbox]
    snapshot: Snapshot
    def __init__(self, lease: _Optional[_Union[_sandboxes_pb2.Lease, _Mapping]] = ..., sandboxes: _Optional[_Iterable[_Union[_common_pb2.Sandbox, _Mapping]]] = ..., snapshot: _Optional[_Union[Snapshot, _Mapping]] = ...) -> None: ...

class GetSnapshotRequest(_message.Message):
    __slots__ = ("snapshot_id",)
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    snapshot_id: str
    def __init__(self, snapshot_id: _Optional[str] = ...) -> None: ...

class GetSnapshotResponse(_message.Message):
    __slots__ = ("snapshot",)
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    snapshot: Snapshot
    def __init__(self, snapshot: _Optional[_Union[Snapshot, _Mapping]] = ...) -> None: ...

class ListSnapshotsRequest(_message.Message):
    __slots__ = ("labels", "pool", "parent_id")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    LABELS_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    PARENT_ID_FIELD_NUMBER: _ClassVar[int]
    labels: _containers.ScalarMap[str, str]
    pool: str
    parent_id: str
    def __init__(self, labels: _Optional[_Mapping[str, str]] = ..., pool: _Optional[str] = ..., parent_id: _Optional[str] = ...) -> None: ...

class ListSnapshotsResponse(_message.Message):
    __slots__ = ("snapshots",)
    SNAPSHOTS_FIELD_NUMBER: _ClassVar[int]
    snapshots: _containers.RepeatedCompositeFieldContainer[Snapshot]
    def __init__(self, snapshots: _Optional[_Iterable[_Union[Snapshot, _Mapping]]] = ...) -> None: ...

class DeleteSnapshotRequest(_message.Message):
    __slots__ = ("snapshot_id",)
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    snapshot_id: str
    def __init__(self, snapshot_id: _Optional[str] = ...) -> None: ...

class DeleteSnapshotResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
