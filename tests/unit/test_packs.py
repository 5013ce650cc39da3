"""Snapshot blobs in packs over a real local directory: one stored object per
batch, per-file dedup, ranged reads, deletion once a pack empties, the orphan
sweep, and blobs stored loose by earlier versions."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sandboxd import errors
from sandboxd.core.packs import PackedBlobs
from sandboxd.core.snapshot_catalog import SnapshotCatalog
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
