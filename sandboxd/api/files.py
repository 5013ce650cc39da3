"""FileService."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from sandboxd.core.control import ControlPlane
from sandboxd.core.files import FileData
from sandboxd.errors import InvalidArgument
from sandboxd.v1 import files_pb2, files_pb2_grpc

_CHUNK = 1 << 20


class FileServicer(files_pb2_grpc.FileServiceServicer):
    """FileService over the control plane; only leased sandboxes' file roots are reachable."""

    def __init__(self, control: ControlPlane) -> None:
        self._control = control

    async def WriteFiles(
        self, request: files_pb2.WriteFilesRequest, context: Any
    ) -> files_pb2.WriteFilesResponse:
        """INVALID_ARGUMENT (path, link, mode, size, user), NOT_FOUND, FAILED_PRECONDITION (not leased,
        root unavailable, a directory where a file goes), PERMISSION_DENIED (the user may not write
        there), RESOURCE_EXHAUSTED (workspace full); all or nothing."""
        files = [FileData(f.path, f.content, f.mode) for f in request.files]
        written = await self._control.write_files(request.sandbox_id, files, user=request.user)
        return files_pb2.WriteFilesResponse(bytes_written=written)

    async def ReadFiles(
        self, request: files_pb2.ReadFilesRequest, context: Any
    ) -> files_pb2.ReadFilesResponse:
        """NOT_FOUND (sandbox or path), INVALID_ARGUMENT (escaping, link, not a regular file),
        FAILED_PRECONDITION (not leased), RESOURCE_EXHAUSTED (over max_bytes)."""
        files = await self._control.read_files(
            request.sandbox_id, list(request.paths), request.max_bytes, user=request.user
        )
        return files_pb2.ReadFilesResponse(
            files=[files_pb2.File(path=f.path, content=f.content, mode=f.mode) for f in files]
        )

    async def UploadDirectory(
        self, request_iterator: AsyncIterator[files_pb2.UploadChunk], context: Any
    ) -> files_pb2.UploadDirectoryResponse:
        """INVALID_ARGUMENT (header, path, link, bad member), NOT_FOUND, FAILED_PRECONDITION,
        PERMISSION_DENIED, RESOURCE_EXHAUSTED (over the disk limit); a refused archive extracts nothing."""
        first = await anext(aiter(request_iterator), None)
        if first is None or first.WhichOneof("part") != "header":
            raise InvalidArgument("header", "the first message must carry the header")
        header = first.header

        async def data() -> AsyncIterator[bytes]:
            async for chunk in request_iterator:
                if chunk.WhichOneof("part") != "data":
                    raise InvalidArgument("header", "only the first message may carry a header")
                yield chunk.data

        size = await self._control.upload_directory(header.sandbox_id, header.path, data())
        return files_pb2.UploadDirectoryResponse(bytes_received=size)

    async def DownloadDirectory(
        self, request: files_pb2.DownloadDirectoryRequest, context: Any
    ) -> AsyncIterator[files_pb2.DownloadChunk]:
        """A tar stream in 1 MiB chunks; NOT_FOUND (sandbox or directory), INVALID_ARGUMENT (escaping
        path or a link), FAILED_PRECONDITION (not leased)."""
        stream = self._control.download_directory(request.sandbox_id, request.path)
        buf = bytearray()
        async for chunk in stream:
            buf += chunk
            while len(buf) >= _CHUNK:
                yield files_pb2.DownloadChunk(data=bytes(buf[:_CHUNK]))
                del buf[:_CHUNK]
        if buf:
            yield files_pb2.DownloadChunk(data=bytes(buf))
