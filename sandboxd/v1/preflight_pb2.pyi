from sandboxd.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ProblemKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PROBLEM_KIND_UNSPECIFIED: _ClassVar[ProblemKind]
    PROBLEM_KIND_IMAGE_MISSING: _ClassVar[ProblemKind]
    PROBLEM_KIND_LIMITS_INVALID: _ClassVar[ProblemKind]
    PROBLEM_KIND_QUOTA_TOO_SMALL: _ClassVar[ProblemKind]
    PROBLEM_KIND_CAPACITY_TOO_SMALL: _ClassVar[ProblemKind]
    PROBLEM_KIND_BACKEND_UNHEALTHY: _ClassVar[ProblemKind]
    PROBLEM_KIND_POOL_TOO_SMALL: _ClassVar[ProblemKind]
    PROBLEM_KIND_LIFETIME_TOO_SHORT: _ClassVar[ProblemKind]
    PROBLEM_KIND_RUNTIME_UNAVAILABLE: _ClassVar[ProblemKind]
    PROBLEM_KIND_IMAGE_TOO_LARGE: _ClassVar[ProblemKind]
    PROBLEM_KIND_NETWORK_UNAVAILABLE: _ClassVar[ProblemKind]
    PROBLEM_KIND_ROOT_UNAVAILABLE: _ClassVar[ProblemKind]
PROBLEM_KIND_UNSPECIFIED: ProblemKind
PROBLEM_KIND_IMAGE_MISSING: ProblemKind
PROBLEM_KIND_LIMITS_INVALID: ProblemKind
PROBLEM_KIND_QUOTA_TOO_SMALL: ProblemKind
PROBLEM_KIND_CAPACITY_TOO_SMALL: ProblemKind
PROBLEM_KIND_BACKEND_UNHEALTHY: ProblemKind
PROBLEM_KIND_POOL_TOO_SMALL: ProblemKind
PROBLEM_KIND_LIFETIME_TOO_SHORT: ProblemKind
PROBLEM_KIND_RUNTIME_UNAVAILABLE: ProblemKind
PROBLEM_KIND_IMAGE_TOO_LARGE: ProblemKind
PROBLEM_KIND_NETWORK_UNAVAILABLE: ProblemKind
PROBLEM_KIND_ROOT_UNAVAILABLE: ProblemKind

class PreflightRequest(_message.Message):
    __slots__ = ("pool", "template", "concurrent", "expected_duration_seconds", "images")
    POOL_FIELD_NUMBER: _ClassVar[int]
    TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    CONCURRENT_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_DURATION_SECONDS_FIELD_NUMBER: _ClassVar[int]
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    pool: str
    template: Template
    concurrent: int
    expected_duration_seconds: float
    images: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, pool: _Optional[str] = ..., template: _Optional[_Union[Template, _Mapping]] = ..., concurrent: _Optional[int] = ..., expected_duration_seconds: _Optional[float] = ..., images: _Optional[_Iterable[str]] = ...) -> None: ...

class Template(_message.Message):
    __slots__ = ("image", "limits", "runtime")
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_FIELD_NUMBER: _ClassVar[int]
    image: str
    limits: _common_pb2.Limits
    runtime: str
    def __init__(self, image: _Optional[str] = ..., limits: _Optional[_Union[_common_pb2.Limits, _Mapping]] = ..., runtime: _Optional[str] = ...) -> None: ...

class Problem(_message.Message):
    __slots__ = ("kind", "message", "field")
    KIND_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    FIELD_FIELD_NUMBER: _ClassVar[int]
    kind: ProblemKind
    message: str
    field: str
    def __init__(self, kind: _Optional[_Union[ProblemKind, str]] = ..., message: _Optional[str] = ..., field: _Optional[str] = ...) -> None: ...

class Capacity(_message.Message):
    __slots__ = ("memory_bytes", "cpus", "memory_needed_bytes", "cpus_needed", "quota_sandboxes_left", "quota_memory_left_bytes")
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    CPUS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_NEEDED_BYTES_FIELD_NUMBER: _ClassVar[int]
    CPUS_NEEDED_FIELD_NUMBER: _ClassVar[int]
    QUOTA_SANDBOXES_LEFT_FIELD_NUMBER: _ClassVar[int]
    QUOTA_MEMORY_LEFT_BYTES_FIELD_NUMBER: _ClassVar[int]
    memory_bytes: int
    cpus: int
    memory_needed_bytes: int
    cpus_needed: float
    quota_sandboxes_left: int
    quota_memory_left_bytes: int
    def __init__(self, memory_bytes: _Optional[int] = ..., cpus: _Optional[int] = ..., memory_needed_bytes: _Optional[int] = ..., cpus_needed: _Optional[float] = ..., quota_sandboxes_left: _Optional[int] = ..., quota_memory_left_bytes: _Optional[int] = ...) -> None: ...

class PreflightResponse(_message.Message):
    __slots__ = ("ok", "problems", "capacity", "predicted_warm_seconds", "measured_start_seconds", "network")
    OK_FIELD_NUMBER: _ClassVar[int]
    PROBLEMS_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_WARM_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MEASURED_START_SECONDS_FIELD_NUMBER: _ClassVar[int]
    NETWORK_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    problems: _containers.RepeatedCompositeFieldContainer[Problem]
    capacity: Capacity
    predicted_warm_seconds: float
    measured_start_seconds: float
    network: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, ok: _Optional[bool] = ..., problems: _Optional[_Iterable[_Union[Problem, _Mapping]]] = ..., capacity: _Optional[_Union[Capacity, _Mapping]] = ..., predicted_warm_seconds: _Optional[float] = ..., measured_start_seconds: _Optional[float] = ..., network: _Optional[_Iterable[str]] = ...) -> None: ...
