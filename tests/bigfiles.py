"""Helpers for the large and sparse file tests of both tiers: tar archives
that lie about their size (a GNU sparse member whose apparent size is far
above what it stores, a member declaring more data than the archive holds),
and a spy on what reaches a blob store."""

from __future__ import annotations

import io
import tarfile
from collections.abc import AsyncIterator, Sequence

import pytest

from sandboxd.stores.base import BlobStore


def sparse_tar(name: str, apparent: int, data: bytes = b"tail" * 128) -> bytes:
    """A tar of one old-style GNU sparse member ('S'): ``apparent`` bytes,
    all a hole but ``data`` at its end (GNU tar extracts it sparse)."""
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    info.type = tarfile.GNUTYPE_SPARSE
    block = bytearray(info.tobuf(tarfile.GNU_FORMAT))
    assert len(block) == 512, "a short name: one header block"
    # One sparse map entry (offset, bytes stored) at 386, realsize at 483.
    block[386:398] = _number(apparent - len(data))
    block[398:410] = _number(len(data))
    block[482] = 0
    block[483:495] = _number(apparent)
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\0 " % sum(block)
    return bytes(block) + data + bytes(-len(data) % 512) + bytes(1024)


def _number(n: int) -> bytes:
    """A 12-byte tar number field: octal, or GNU base-256 past 11 digits."""
    return b"%011o\0" % n if n < 8**11 else b"\x80" + n.to_bytes(11, "big")


def short_tar(name: str, declared: int, data: bytes = b"only this") -> bytes:
    """A tar whose one member declares ``declared`` bytes and holds ``data``."""
    info = tarfile.TarInfo(name)
    info.size = declared
    info.mode = 0o644
    return info.tobuf(tarfile.GNU_FORMAT) + data


def listed(data: bytes) -> list[tuple[str, int]]:
    """(name, size as tarfile reports it) of each member."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        return [(m.name, m.size) for m in tar]


class Watched:
    """What reaches ``store`` from now on: the largest streamed piece, the
    largest blob written in a pack, and how many blobs were streamed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, store: BlobStore) -> None:
        self.piece = self.packed = self.streams = 0
        real_stream, real_parts = store.put_stream, store.put_parts

        async def put_stream(key: str, chunks: AsyncIterator[bytes], size: int) -> int:
            async def watched() -> AsyncIterator[bytes]:
                async for chunk in chunks:
                    self.piece = max(self.piece, len(chunk))
                    yield chunk

            self.streams += 1
            return await real_stream(key, watched(), size)

        async def put_parts(key: str, parts: Sequence[bytes]) -> int:
            self.packed = max(self.packed, *(len(p) for p in parts))
            return await real_parts(key, parts)

        monkeypatch.setattr(store, "put_stream", put_stream)
        monkeypatch.setattr(store, "put_parts", put_parts)
