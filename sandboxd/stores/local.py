"""Blobs as files in a local directory (default ``state_dir/blobs``). Writes
go to a temporary name and are renamed into place, so a crash never leaves a
key with partial content. Each batch runs in one worker thread hop."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import secrets
import shutil
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from sandboxd.errors import BackendError, InvalidArgument, NotFound

T = TypeVar("T")
_IOV_MAX = 1024
_TMP_SUFFIX = ".tmp-"


class LocalBlobStore:
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
        if not blobs:
            return 0
        written: int = await self._run(self._put_sync, dict(blobs))
        return written

    def _put_sync(self, blobs: dict[str, bytes]) -> int:
        return sum(self._put_one(key, [data]) for key, data in blobs.items())

    async def put_parts(self, key: str, parts: Sequence[bytes]) -> int:
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

    async def get_many(self, keys: Sequence[str]) -> dict[str, bytes]:
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
            out = [os.pread(fd, size, offset) for offset, size in ranges]
        except OSError as e:
            raise BackendError(f"blob store {self.root}: read of {key} failed: {e}") from e
        finally:
            os.close(fd)
        for (offset, size), data in zip(ranges, out, strict=True):
            if len(data) != size:
                raise BackendError(f"blob {key} ends before {offset + size} (truncated?)")
        return out

    async def missing(self, keys: Sequence[str]) -> set[str]:
        if not keys:
            return set()
        out: set[str] = await self._run(lambda: {k for k in keys if not self._path(k).exists()})
        return out

    async def delete_many(self, keys: Sequence[str]) -> None:
        if keys:
            await self._run(self._delete_sync, list(keys))

    def _delete_sync(self, keys: list[str]) -> None:
        for key in keys:
            with contextlib.suppress(FileNotFoundError):
                self._path(key).unlink()

    async def list_keys(self, prefix: str = "") -> list[str]:
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
        if self._remove_on_close:
            await self._run(functools.partial(shutil.rmtree, self.root, ignore_errors=True))
        self._executor.shutdown(wait=True)


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
