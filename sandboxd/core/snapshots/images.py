"""Checkpoint images as archives: the few files of a live snapshot's image
written as one tar stream and read back from one, without a copy on disk
on either side (an image is as large as the sandbox's memory).

The archive is deterministic (sorted names, GNU headers with no owners,
times or host modes), so equal images are equal blobs. Reading accepts only
what writing produces: regular files with plain names, checkpoint.img among
them; anything else (links, directories, paths, long-name or extended
headers, trailing garbage) is a foreign image and refused."""

from __future__ import annotations

import asyncio
import os
import re
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import BinaryIO

from sandboxd.core.snapshots.manifest import UnsafeSnapshot

_BLOCK = tarfile.BLOCKSIZE
_CHUNK = 1 << 20
_MEMBER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
REQUIRED = "checkpoint.img"
_MAX_MEMBERS = 16


def _header(name: str, size: int) -> bytes:
    member = tarfile.TarInfo(name)
    member.size = size
    member.mode = 0o600
    return member.tobuf(tarfile.GNU_FORMAT, "utf-8", "strict")


def _padding(size: int) -> int:
    return -size % _BLOCK


def _members(image: Path) -> list[tuple[str, int]]:
    return sorted((entry.name, entry.stat().st_size) for entry in os.scandir(image))


def archived_size(image: Path) -> int:
    """Bytes of the archive ``archive_chunks`` makes of ``image`` (a directory)."""
    total = 2 * _BLOCK
    for name, size in _members(image):
        total += len(_header(name, size)) + size + _padding(size)
    return total


async def archive_chunks(image: Path) -> AsyncIterator[bytes]:
    """The archive of directory ``image``, in pieces of at most 1 MiB, read in worker threads."""
    for name, size in await asyncio.to_thread(_members, image):
        yield _header(name, size)
        with (image / name).open("rb") as f:
            left = size
            while left > 0:
                piece = await asyncio.to_thread(f.read, min(_CHUNK, left))
                if not piece:
                    raise OSError(f"{name} shrank while it was archived")
                left -= len(piece)
                yield piece
        if _padding(size):
            yield b"\0" * _padding(size)
    yield b"\0" * (2 * _BLOCK)


class Unpacker:
    """Writes an archive fed in pieces into directory ``dest`` (made here),
    refusing (UnsafeSnapshot) anything but a checkpoint image."""

    def __init__(self, dest: Path) -> None:
        dest.mkdir(mode=0o700)
        self._dest = dest
        self._buffer = b""
        self._out: BinaryIO | None = None
        self._left = 0  # bytes of the current member still to come
        self._pad = 0  # padding after it
        self._names: set[str] = set()
        self._ended = False

    def feed(self, data: bytes) -> None:
        """Takes the next piece of the archive."""
        view = memoryview(data)
        while view:
            if self._out is not None:
                n = min(self._left, len(view))
                self._out.write(view[:n])
                view, self._left = view[n:], self._left - n
                if not self._left:
                    self._out.close()
                    self._out = None
                continue
            if self._pad:
                n = min(self._pad, len(view))
                view, self._pad = view[n:], self._pad - n
                continue
            need = _BLOCK - len(self._buffer)
            self._buffer += bytes(view[:need])
            view = view[need:]
            if len(self._buffer) == _BLOCK:
                block, self._buffer = self._buffer, b""
                self._header(block)

    def _header(self, block: bytes) -> None:
        if self._ended:
            if block.strip(b"\0"):
                raise UnsafeSnapshot("its image has data after its end")
            return
        if not block.strip(b"\0"):
            self._ended = True
            return
        try:
            member = tarfile.TarInfo.frombuf(block, "utf-8", "strict")
        except (tarfile.HeaderError, UnicodeDecodeError) as e:
            raise UnsafeSnapshot(f"its image is not a readable archive: {e}") from e
        if member.type != tarfile.REGTYPE or not _MEMBER.fullmatch(member.name) or member.name in self._names:
            raise UnsafeSnapshot(f"its image holds {member.name[:80]!r}, which is not a checkpoint file")
        self._names.add(member.name)
        if len(self._names) > _MAX_MEMBERS:
            raise UnsafeSnapshot("its image has more members than a checkpoint has files")
        self._out = (self._dest / member.name).open("xb")
        self._left, self._pad = member.size, _padding(member.size)
        if not self._left:
            self._out.close()
            self._out = None

    def finish(self) -> None:
        """After the last piece: UnsafeSnapshot unless the archive was whole and an image."""
        if self._out is not None:
            self._out.close()
            self._out = None
            raise UnsafeSnapshot("its image ends inside a file")
        if not self._ended or self._buffer:
            raise UnsafeSnapshot("its image is not a readable archive: it has no end")
        if REQUIRED not in self._names:
            raise UnsafeSnapshot(f"its image has no {REQUIRED}: not a checkpoint image")

    def close(self) -> None:
        """Closes a member left open (after a failure)."""
        if self._out is not None:
            self._out.close()
            self._out = None
