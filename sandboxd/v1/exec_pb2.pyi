from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ExecOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EXEC_OUTCOME_UNSPECIFIED: _ClassVar[ExecOutcome]
    EXEC_OUTCOME_EXITED: _ClassVar[ExecOutcome]
    EXEC_OUTCOME_TIMED_OUT: _ClassVar[ExecOutcome]
    EXEC_OUTCOME_KILLED: _ClassVar[ExecOutcome]
    EXEC_OUTCOME_OUTPUT_TRUNCATED: _ClassVar[ExecOutcome]
    EXEC_OUTCOME_SANDBOX_LOST: _ClassVar[ExecOutcome]
    EXEC_OUTCOME_OOM_KILLED: _ClassVar[ExecOutcome]
    EXEC_OUTCOME_PIDS_EXHAUSTED: _ClassVar[ExecOutcome]
    EXEC_OUTCOME_DISK_FULL: _ClassVar[ExecOutcome]
    EXEC_OUTCOME_FILE_LIMIT: _ClassVar[ExecOutcome]
EXEC_OUTCOME_UNSPECIFIED: ExecOutcome
EXEC_OUTCOME_EXITED: ExecOutcome
EXEC_OUTCOME_TIMED_OUT: ExecOutcome
EXEC_OUTCOME_KILLED: ExecOutcome
EXEC_OUTCOME_OUTPUT_TRUNCATED: ExecOutcome
EXEC_OUTCOME_SANDBOX_LOST: ExecOutcome
EXEC_OUTCOME_OOM_KILLED: ExecOutcome
EXEC_OUTCOME_PIDS_EXHAUSTED: ExecOutcome
EXEC_OUTCOME_DISK_FULL: ExecOutcome
EXEC_OUTCOME_FILE_LIMIT: ExecOutcome

class ExecRequest(_message.Message):
    __slots__ = ("sandbox_id", "argv", "shell", "cwd", "env", "timeout_seconds", "stdin", "output_limit_bytes", "session", "user")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    ARGV_FIELD_NUMBER: _ClassVar[int]
    SHELL_FIELD_NUMBER: _ClassVar[int]
    CWD_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    STDIN_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_LIMIT_BYTES_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    argv: Argv
    shell: str
    cwd: str
    env: _containers.ScalarMap[str, str]
    timeout_seconds: float
    stdin: bytes
    output_limit_bytes: int
    session: str
    user: str
    def __init__(self, sandbox_id: _Optional[str] = ..., argv: _Optional[_Union[Argv, _Mapping]] = ..., shell: _Optional[str] = ..., cwd: _Optional[str] = ..., env: _Optional[_Mapping[str, str]] = ..., timeout_seconds: _Optional[float] = ..., stdin: _Optional[bytes] = ..., output_limit_bytes: _Optional[int] = ..., session: _Optional[str] = ..., user: _Optional[str] = ...) -> None: ...

class Argv(_message.Message):
    __slots__ = ("args",)
    ARGS_FIELD_NUMBER: _ClassVar[int]
    args: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, args: _Optional[_Iterable[str]] = ...) -> None: ...

class ExecResult(_message.Message):
    __slots__ = ("outcome", "exit_code", "signal", "stdout", "stderr", "duration_seconds", "output_truncated", "detail")
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    STDOUT_FIELD_NUMBER: _ClassVar[int]
    STDERR_FIELD_NUMBER: _ClassVar[int]
    DURATION_SECONDS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    outcome: ExecOutcome
    exit_code: int
    signal: int
    stdout: bytes
    stderr: bytes
    duration_seconds: float
    output_truncated: bool
    detail: str
    def __init__(self, outcome: _Optional[_Union[ExecOutcome, str]] = ..., exit_code: _Optional[int] = ..., signal: _Optional[int] = ..., stdout: _Optional[bytes] = ..., stderr: _Optional[bytes] = ..., duration_seconds: _Optional[float] = ..., output_truncated: _Optional[bool] = ..., detail: _Optional[str] = ...) -> None: ...

class ExecResponse(_message.Message):
    __slots__ = ("result",)
    RESULT_FIELD_NUMBER: _ClassVar[int]
    result: ExecResult
    def __init__(self, result: _Optional[_Union[ExecResult, _Mapping]] = ...) -> None: ...

class ExecEvent(_message.Message):
    __slots__ = ("stdout", "stderr", "result")
    STDOUT_FIELD_NUMBER: _ClassVar[int]
    STDERR_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    stdout: bytes
    stderr: bytes
    result: ExecResult
    def __init__(self, stdout: _Optional[bytes] = ..., stderr: _Optional[bytes] = ..., result: _Optional[_Union[ExecResult, _Mapping]] = ...) -> None: ...
