from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class File(_message.Message):
    __slots__ = ("path", "content", "mode")
    PATH_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    path: str
    content: bytes
    mode: int
    def __init__(self, path: _Optional[str] = ..., content: _Optional[bytes] = ..., mode: _Optional[int] = ...) -> None: ...

class WriteFilesRequest(_message.Message):
    __slots__ = ("sandbox_id", "files", "user")
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    files: _containers.RepeatedCompositeFieldContainer[File]
    user: str
    def __init__(self, sandbox_id: _Optional[str] = ..., files: _Optional[_Iterable[_Union[File, _Mapping]]] = ..., user: _Optional[str] = ...) -> None: ...

class WriteFilesResponse(_message.Message):
    __slots__ = ("bytes_written",)
    BYTES_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    bytes_written: int
    def __init__(self, bytes_written: _Optional[int] = ...) -> None: ...

class ReadFilesRequest(_message.Message):
    __slots__ = ("sandbox_id", "paths", "max_bytes", "user")
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    PATHS_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    paths: _containers.RepeatedScalarFieldContainer[str]
    max_bytes: int
    user: str
    def __init__(self, sandbox_id: _Optional[str] = ..., paths: _Optional[_Iterable[str]] = ..., max_bytes: _Optional[int] = ..., user: _Optional[str] = ...) -> None: ...

class ReadFilesResponse(_message.Message):
    __slots__ = ("files",)
    FILES_FIELD_NUMBER: _ClassVar[int]
    files: _containers.RepeatedCompositeFieldContainer[File]
    def __init__(self, files: _Optional[_Iterable[_Union[File, _Mapping]]] = ...) -> None: ...

class UploadHeader(_message.Message):
    __slots__ = ("sandbox_id", "path")
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    path: str
    def __init__(self, sandbox_id: _Optional[str] = ..., path: _Optional[str] = ...) -> None: ...

class UploadChunk(_message.Message):
    __slots__ = ("header", "data")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    header: UploadHeader
    data: bytes
    def __init__(self, header: _Optional[_Union[UploadHeader, _Mapping]] = ..., data: _Optional[bytes] = ...) -> None: ...

class UploadDirectoryResponse(_message.Message):
    __slots__ = ("bytes_received",)
    BYTES_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    bytes_received: int
    def __init__(self, bytes_received: _Optional[int] = ...) -> None: ...

class DownloadDirectoryRequest(_message.Message):
    __slots__ = ("sandbox_id", "path")
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    path: str
    def __init__(self, sandbox_id: _Optional[str] = ..., path: _Optional[str] = ...) -> None: ...

class DownloadChunk(_message.Message):
    __slots__ = ("data",)
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    def __init__(self, data: _Optional[bytes] = ...) -> None: ...
