"""Moving files and directories in and out of a leased sandbox."""

from __future__ import annotations

import asyncio
import io
import tarfile
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path

from sandboxd.client.rpc import Connection, rpc_errors
from sandboxd.v1 import files_pb2


class FileCalls(Connection):
    """The client's file calls."""

    async def write_files(
        self,
        sandbox_id: str,
        files: Mapping[str, bytes | str],
        modes: Mapping[str, int] | None = None,
        *,
        user: str = "",
    ) -> int:
        """Writes files under /workspace (relative paths) or /tmp, as ``user``."""
        request = files_pb2.WriteFilesRequest(
            sandbox_id=sandbox_id,
            user=user,
            files=[
                files_pb2.File(
                    path=p, content=c.encode() if isinstance(c, str) else c, mode=(modes or {}).get(p, 0)
                )
                for p, c in files.items()
            ],
        )
        with rpc_errors():
            return int((await self.files.WriteFiles(request, metadata=self.metadata)).bytes_written)

    async def read_files(
        self, sandbox_id: str, paths: Sequence[str], max_bytes: int = 0, *, user: str = ""
    ) -> dict[str, bytes]:
        """Reads several files in one call, as ``user``: path -> content."""
        request = files_pb2.ReadFilesRequest(
            sandbox_id=sandbox_id, paths=list(paths), max_bytes=max_bytes, user=user
        )
        with rpc_errors():
            response = await self.files.ReadFiles(request, metadata=self.metadata)
        return {f.path: f.content for f in response.files}

    async def upload_dir(self, sandbox_id: str, local: str | Path | bytes, dest: str = ".") -> int:
        """Uploads a local directory (or ready-made tar bytes) under ``dest``."""
        data = local if isinstance(local, bytes) else await asyncio.to_thread(_tar_dir, Path(local))

        async def chunks() -> AsyncIterator[files_pb2.UploadChunk]:
            yield files_pb2.UploadChunk(header=files_pb2.UploadHeader(sandbox_id=sandbox_id, path=dest))
            for i in range(0, len(data), 1 << 20):
                yield files_pb2.UploadChunk(data=data[i : i + (1 << 20)])

        with rpc_errors():
            return int((await self.files.UploadDirectory(chunks(), metadata=self.metadata)).bytes_received)

    async def download_dir(self, sandbox_id: str, path: str = ".") -> bytes:
        """A tar of the directory, paths relative to it."""
        request = files_pb2.DownloadDirectoryRequest(sandbox_id=sandbox_id, path=path)
        out = bytearray()
        with rpc_errors():
            async for chunk in self.files.DownloadDirectory(request, metadata=self.metadata):
                out += chunk.data
        return bytes(out)


def _tar_dir(path: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for child in sorted(path.iterdir()):
            tar.add(child, arcname=child.name)
    return buf.getvalue()
