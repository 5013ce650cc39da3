"""Blobs as files in a local directory (default ``state_dir/blobs``). Writes
go to a temporary name and are renamed into place, so a crash never leaves a
key with partial content. Each batch runs in one worker thread hop; a
streamed blob takes one per piece."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import secrets
import shutil
from collections.abc import AsyncIterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from sandboxd.errors import BackendError, InvalidArgument, NotFound
from sandboxd.stores.base import STREAM_CHUNK_BYTES

T = TypeVar("T")
_IOV_MAX = 1024
_TMP_SUFFIX = ".tmp-"
# One pread(2) returns at most this on Linux, whatever was asked.
_MAX_READ = 0x7FFFF000


class LocalBlobStore:
    """Blobs as files under ``root``."""

    def __init__(self, root: Path, *, threads: int = 2, remove_on_close: bool = False) -> None:
        """``remove_on_close`` deletes the directory on close (throw-away servers)."""
        self.root = root
        self._remove_on_close = remove_on_close
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="sandboxd-blobs")
        self._made: set[Path] = set()

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def _path(self, key: str) -> Path:
        parts = key.split("/")
        if not key or any(p in ("", ".", "..") for p in parts) or _TMP_SUFFIX in key:
            raise InvalidArgument("key", f"{key[:100]!r} is not a valid blob key")
        return self.root.joinpath(*parts)

    async def put_absent(self, blobs: Mapping[str, bytes]) -> int:
        """Each absent blob written to a temporary name and renamed into place, in one thread hop."""
        if not blobs:
            return 0
        written: int = await self._run(self._put_sync, dict(blobs))
        return written

    def _put_sync(self, blobs: dict[str, bytes]) -> int:
        return sum(self._put_one(key, [data]) for key, data in blobs.items())

    async def put_parts(self, key: str, parts: Sequence[bytes]) -> int:
        """One blob from its parts, written with vectored writes (never joined), unless present."""
        written: int = await self._run(self._put_one, key, list(parts))
        return written

    def _put_one(self, key: str, parts: list[bytes]) -> int:
        path = self._path(key)
        try:
            if path.exists():
                return 0
            parent = path.parent
            if parent not in self._made:
                parent.mkdir(parents=True, exist_ok=True)
                self._made.add(parent)
            tmp = parent / f"{path.name}{_TMP_SUFFIX}{secrets.token_hex(4)}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                _write_all(fd, parts)
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except OSError as e:
            raise BackendError(f"blob store {self.root}: write failed: {e}") from e
        return sum(len(p) for p in parts)

    async def put_stream(self, key: str, chunks: AsyncIterator[bytes], size: int) -> int:
        """As BlobStore.put_stream: written to a temporary name piece by
        piece, renamed into place once all ``size`` bytes are there."""
        opened: tuple[int, Path] | None = await self._run(self._open_tmp, key)
        if opened is None:
            return 0
        fd, tmp = opened
        done = False
        try:
            count = 0
            async for chunk in chunks:
                count += len(chunk)
                if count > size:
                    break
                await self._run(_write_all, fd, [chunk])
            if count != size:
                more = "holds more than" if count > size else f"ended after {count} of"
                raise BackendError(f"blob {key}: the stream {more} the {size} bytes announced")
            await self._run(self._finish_tmp, fd, tmp, key)
            done = True
        except OSError as e:
            raise BackendError(f"blob store {self.root}: write of {key} failed: {e}") from e
        finally:
            if not done:
                # Plain calls: they must run even when the task is being cancelled.
                with contextlib.suppress(OSError):
                    os.close(fd)
                with contextlib.suppress(OSError):
                    tmp.unlink()
        return size

    def _open_tmp(self, key: str) -> tuple[int, Path] | None:
        path = self._path(key)
        try:
            if path.exists():
                return None
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.parent / f"{path.name}{_TMP_SUFFIX}{secrets.token_hex(4)}"
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644), tmp
        except OSError as e:
            raise BackendError(f"blob store {self.root}: write of {key} failed: {e}") from e

    def _finish_tmp(self, fd: int, tmp: Path, key: str) -> None:
        os.close(fd)
        os.replace(tmp, self._path(key))

    async def read_stream(self, key: str, offset: int, size: int) -> AsyncIterator[bytes]:
        """As BlobStore.read_stream, a thread hop per piece."""
        fd: int = await self._run(self._open_blob, key)
        try:
            pos, end = offset, offset + size
            while pos < end:
                try:
                    data: bytes = await self._run(os.pread, fd, min(STREAM_CHUNK_BYTES, end - pos), pos)
                except OSError as e:
                    raise BackendError(f"blob store {self.root}: read of {key} failed: {e}") from e
                if not data:
                    raise BackendError(f"blob {key} ends at {pos}, before {end} (truncated?)")
                pos += len(data)
                yield data
        finally:
            os.close(fd)

    def _open_blob(self, key: str) -> int:
        try:
            return os.open(self._path(key), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError as e:
            raise NotFound(f"blob {key} is missing from the store") from e
        except OSError as e:
            raise BackendError(f"blob store {self.root}: read of {key} failed: {e}") from e

    async def get_many(self, keys: Sequence[str]) -> dict[str, bytes]:
        """The blobs' contents, read in one thread hop; NotFound naming the first missing key."""
        if not keys:
            return {}
        out: dict[str, bytes] = await self._run(self._get_sync, list(keys))
        return out

    def _get_sync(self, keys: list[str]) -> dict[str, bytes]:
        out: dict[str, bytes] = {}
        for key in keys:
            try:
                out[key] = self._path(key).read_bytes()
            except FileNotFoundError as e:
                raise NotFound(f"blob {key} is missing from the store") from e
            except OSError as e:
                raise BackendError(f"blob store {self.root}: read of {key} failed: {e}") from e
        return out

    async def get_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """The slices, by pread on one descriptor; BackendError when a range passes the file's end."""
        out: list[bytes] = await self._run(self._ranges_sync, key, list(ranges))
        return out

    def _ranges_sync(self, key: str, ranges: list[tuple[int, int]]) -> list[bytes]:
        try:
            fd = os.open(self._path(key), os.O_RDONLY)
        except FileNotFoundError as e:
            raise NotFound(f"blob {key} is missing from the store") from e
        except OSError as e:
            raise BackendError(f"blob store {self.root}: read of {key} failed: {e}") from e
        try:
            out = [_pread_all(fd, size, offset) for offset, size in ranges]
        except OSError as e:
            raise BackendError(f"blob store {self.root}: read of {key} failed: {e}") from e
        finally:
            os.close(fd)
        for (offset, size), data in zip(ranges, out, strict=True):
            if len(data) != size:
                raise BackendError(f"blob {key} ends before {offset + size} (truncated?)")
        return out

    async def missing(self, keys: Sequence[str]) -> set[str]:
        """Keys with no file (a temporary file of an unfinished write does not count)."""
        if not keys:
            return set()
        out: set[str] = await self._run(lambda: {k for k in keys if not self._path(k).exists()})
        return out

    async def delete_many(self, keys: Sequence[str]) -> None:
        """Unlinks the blobs' files; missing ones are skipped, emptied directories are kept."""
        if keys:
            await self._run(self._delete_sync, list(keys))

    def _delete_sync(self, keys: list[str]) -> None:
        for key in keys:
            with contextlib.suppress(FileNotFoundError):
                self._path(key).unlink()

    async def list_keys(self, prefix: str = "") -> list[str]:
        """Keys of every file under the root that starts with ``prefix``; unfinished writes are skipped."""
        out: list[str] = await self._run(self._list_sync, prefix)
        return out

    def _list_sync(self, prefix: str) -> list[str]:
        out: list[str] = []
        if not self.root.exists():
            return out
        for dirpath, _dirs, files in os.walk(self.root):
            rel = os.path.relpath(dirpath, self.root)
            for name in files:
                if _TMP_SUFFIX in name:
                    continue
                key = name if rel == "." else f"{rel.replace(os.sep, '/')}/{name}"
                if key.startswith(prefix):
                    out.append(key)
        return out

    async def close(self) -> None:
        """Removes the directory if ``remove_on_close``, then waits for the worker threads to stop."""
        if self._remove_on_close:
            await self._run(functools.partial(shutil.rmtree, self.root, ignore_errors=True))
        self._executor.shutdown(wait=True)


def _pread_all(fd: int, size: int, offset: int) -> bytes:
    """``size`` bytes at ``offset`` (fewer only at the end of the file):
    one pread returns at most _MAX_READ, so a larger range takes several."""
    first = os.pread(fd, min(size, _MAX_READ), offset)
    if len(first) == size or len(first) < min(size, _MAX_READ):
        return first
    parts = [first]
    got = len(first)
    while got < size and (data := os.pread(fd, min(size - got, _MAX_READ), offset + got)):
        parts.append(data)
        got += len(data)
    return b"".join(parts)


def _write_all(fd: int, parts: list[bytes]) -> None:
    """Writes ``parts`` in order with gathered writes (no joined copy)."""
    views = [memoryview(p) for p in parts if p]
    i = 0
    while i < len(views):
        done = os.writev(fd, views[i : i + _IOV_MAX])
        while done and i < len(views):
            if done >= len(views[i]):
                done -= len(views[i])
                i += 1
            else:
                views[i] = views[i][done:]
                done = 0
