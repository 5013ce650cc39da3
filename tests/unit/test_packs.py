"""Snapshot blobs in packs over a real local directory: one stored object per
batch, per-file dedup, ranged reads, deletion once a pack empties, the orphan
sweep, blobs stored loose by earlier versions, and blobs streamed in and
out a piece at a time."""

from __future__ import annotations

import hashlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from sandboxd import errors
from sandboxd.core.snapshots import packs
from sandboxd.core.snapshots.catalog import SnapshotCatalog
from sandboxd.core.snapshots.packs import PackedBlobs, blob_key
from sandboxd.stores.base import STREAM_CHUNK_BYTES
from sandboxd.stores.local import LocalBlobStore

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
async def packed(tmp_path: Path) -> AsyncIterator[PackedBlobs]:
    catalog = SnapshotCatalog(None)
    await catalog.open()
    blobs = PackedBlobs(LocalBlobStore(tmp_path / "blobs"), catalog)
    try:
        yield blobs
    finally:
        await blobs.close()
        await catalog.close()


async def test_one_pack_per_batch_and_per_file_dedup(packed: PackedBlobs) -> None:
    first = {"ns/aa/a": b"alpha", "ns/bb/b": b"bravo!", "other/cc/c": b"c"}
    assert await packed.put_absent(first) == 12
    stored = await packed.store.list_keys()
    assert len(stored) == 2 and all("/packs/" in k for k in stored), "one pack per namespace"
    assert await packed.put_absent({"ns/aa/a": b"alpha", "ns/dd/d": b"delta"}) == 5, "only the new blob"
    assert len(await packed.store.list_keys()) == 3
    assert await packed.get_many(["ns/bb/b", "ns/aa/a", "ns/dd/d"]) == {
        "ns/bb/b": b"bravo!",
        "ns/aa/a": b"alpha",
        "ns/dd/d": b"delta",
    }
    assert await packed.missing(["ns/aa/a", "ns/zz/z"]) == {"ns/zz/z"}
    assert await packed.list_keys("ns/") == ["ns/aa/a", "ns/bb/b", "ns/dd/d"]
    with pytest.raises(errors.NotFound):
        await packed.get_many(["ns/zz/z"])


async def test_a_pack_is_deleted_once_no_blob_in_it_is_left(packed: PackedBlobs) -> None:
    await packed.put_absent({"ns/aa/a": b"alpha", "ns/bb/b": b"bravo"})
    (pack,) = await packed.store.list_keys()
    await packed.delete_many(["ns/aa/a"])
    assert await packed.store.list_keys() == [pack], "b still lies in it"
    assert await packed.get_many(["ns/bb/b"]) == {"ns/bb/b": b"bravo"}
    assert await packed.missing(["ns/aa/a"]) == {"ns/aa/a"}
    await packed.delete_many(["ns/bb/b", "ns/never/x"])
    assert await packed.store.list_keys() == []
    assert await packed.list_keys() == []


async def test_sweep_takes_unindexed_packs_only(packed: PackedBlobs) -> None:
    await packed.put_absent({"ns/aa/a": b"alpha"})
    (indexed,) = await packed.store.list_keys()
    await packed.store.put_absent({"ns/packs/crashed-before-indexing": b"junk"})
    assert await packed.sweep_packs() == 1
    assert await packed.store.list_keys() == [indexed]
    assert await packed.get_many(["ns/aa/a"]) == {"ns/aa/a": b"alpha"}


async def test_loose_blobs_of_earlier_versions_stay_readable(packed: PackedBlobs) -> None:
    await packed.store.put_absent({"ns/ee/old": b"loose"})
    assert await packed.put_absent({"ns/ee/old": b"loose"}) == 0, "already stored, loose"
    assert await packed.get_many(["ns/ee/old"]) == {"ns/ee/old": b"loose"}
    assert await packed.list_keys() == ["ns/ee/old"]
    await packed.delete_many(["ns/ee/old"])
    assert await packed.store.list_keys() == []


async def test_a_truncated_pack_is_an_error_not_short_content(packed: PackedBlobs, tmp_path: Path) -> None:
    await packed.put_absent({"ns/aa/a": b"alpha", "ns/bb/b": b"bravo"})
    (pack,) = await packed.store.list_keys()
    (tmp_path / "blobs" / pack).write_bytes(b"alph")
    with pytest.raises(errors.BackendError, match="ends before"):
        await packed.get_many(["ns/bb/b"])


async def _pieces(data: bytes, step: int = 1000) -> AsyncIterator[bytes]:
    for i in range(0, len(data), step):
        yield data[i : i + step]


async def test_a_streamed_blob_is_a_pack_of_its_own_stored_once(packed: PackedBlobs, tmp_path: Path) -> None:
    data = os.urandom(10_500)
    key = blob_key("ns", hashlib.sha256(data).hexdigest())
    pins: list[str] = []

    async def pin(k: str) -> None:
        pins.append(k)

    assert await packed.put_stream("ns", _pieces(data), len(data), pin) == (key.rsplit("/", 1)[1], len(data))
    assert pins == [key], "pinned before it was looked up"
    assert await packed.put_stream("ns", _pieces(data), len(data), pin) == (key.rsplit("/", 1)[1], 0)
    (pack,) = await packed.store.list_keys()
    assert "/packs/" in pack, "the second copy was dropped"
    got = [p async for p in packed.open_stream(key, len(data))]
    assert b"".join(got) == data
    assert await packed.get_many([key]) == {key: data}
    # A stream that fails, or holds another count than announced, stores nothing.
    for announced in (len(data) - 1, len(data) + 1):
        with pytest.raises(errors.BackendError, match="announced"):
            await packed.put_stream("ns", _pieces(os.urandom(len(data))), announced, pin)

    async def failing() -> AsyncIterator[bytes]:
        yield b"x" * 100
        raise errors.FailedPrecondition("the file changed while it was read")

    with pytest.raises(errors.FailedPrecondition):
        await packed.put_stream("ns", failing(), 200, pin)
    assert await packed.store.list_keys() == [pack]
    assert [p for p in (tmp_path / "blobs").rglob("*") if p.is_file()] == [tmp_path / "blobs" / pack]
    assert await packed.sweep_packs() == 0


async def test_reads_of_a_pack_skip_what_lies_between_far_apart_blobs(
    packed: PackedBlobs, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(packs, "_GAP_BYTES", 100)
    blobs = {"ns/aa/a": b"a" * 10, "ns/bb/b": b"b" * 1000, "ns/cc/c": b"c" * 10, "ns/dd/d": b"d" * 10}
    await packed.put_absent(blobs)
    asked: list[list[tuple[int, int]]] = []
    real = packed.store.get_ranges

    async def spy(key: str, ranges: Any) -> list[bytes]:
        asked.append(list(ranges))
        return await real(key, ranges)

    monkeypatch.setattr(packed.store, "get_ranges", spy)
    assert await packed.get_many(["ns/aa/a", "ns/cc/c", "ns/dd/d"]) == {
        k: blobs[k] for k in ("ns/aa/a", "ns/cc/c", "ns/dd/d")
    }
    assert asked == [[(0, 10)], [(1010, 10), (1020, 10)]], "the 1000 bytes between were not read"


async def test_the_local_store_streams_ranges_and_reports_a_short_blob(tmp_path: Path) -> None:
    store = LocalBlobStore(tmp_path / "raw")
    try:
        data = os.urandom(3 << 20)
        assert await store.put_stream("k/big", _pieces(data, 1 << 20), len(data)) == len(data)
        got = [p async for p in store.read_stream("k/big", 5, len(data) - 10)]
        assert b"".join(got) == data[5:-5] and max(map(len, got)) <= STREAM_CHUNK_BYTES
        assert await store.get_ranges("k/big", [(0, len(data))]) == [data]
        with pytest.raises(errors.BackendError, match="ends at"):
            _ = [p async for p in store.read_stream("k/big", 0, len(data) + 1)]
        with pytest.raises(errors.NotFound):
            _ = [p async for p in store.read_stream("k/none", 0, 1)]
    finally:
        await store.close()
