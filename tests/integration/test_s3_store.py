"""The S3 blob store against a real S3-compatible server: versitygw (the
Versity S3 Gateway, a Go module that scripts/setup.sh builds) serving a
temporary directory on 127.0.0.1. Signature V4, listing, deletes, streamed
blobs (multipart uploads, ranged reads), and whole snapshots stored there and
garbage-collected."""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from sandboxd import errors
from sandboxd.app import build_app
from sandboxd.backends.fake import FakeBackend
from sandboxd.client import AsyncClient
from sandboxd.settings import load_settings
from sandboxd.stores.s3 import PART_BYTES, S3BlobStore, S3Config
from tests.integration import versitygw
from tests.integration.versitygw import ACCESS, SECRET

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def s3_endpoint(tmp_path: Path) -> Iterator[str]:
    with versitygw.serve(tmp_path) as endpoint:
        yield endpoint


@pytest.fixture
async def store(s3_endpoint: str) -> AsyncIterator[S3BlobStore]:
    s = S3BlobStore(S3Config(s3_endpoint, "blobs-" + secrets.token_hex(3), ACCESS, SECRET, prefix="p/"))
    yield s
    await s.close()


async def test_blob_operations(store: S3BlobStore) -> None:
    blobs = {f"ns/{i:02x}/k{i}": os.urandom(i * 1000) for i in range(1, 40)}
    blobs["ns/odd name+=&?.bin"] = "ünïcode".encode()
    assert await store.put_absent(blobs) == sum(len(v) for v in blobs.values())
    assert await store.put_absent(blobs) == 0, "present keys are not written again"
    assert await store.missing([*blobs, "ns/none"]) == {"ns/none"}
    assert await store.get_many(list(blobs)) == blobs
    assert sorted(await store.list_keys("ns/")) == sorted(blobs)
    await store.delete_many(["ns/01/k1", "ns/nothing"])
    assert "ns/01/k1" not in await store.list_keys()
    with pytest.raises(errors.NotFound, match="ns/01/k1"):
        await store.get_many(["ns/01/k1"])
    # Ranged reads (packs): one request covering the slices asked for.
    whole = blobs["ns/05/k5"]
    assert await store.get_ranges("ns/05/k5", [(10, 5), (100, 0), (4000, 1000)]) == [
        whole[10:15],
        b"",
        whole[4000:5000],
    ]
    with pytest.raises(errors.NotFound, match="ns/01/k1"):
        await store.get_ranges("ns/01/k1", [(0, 1)])
    with pytest.raises(errors.BackendError, match="ends before"):
        await store.get_ranges("ns/05/k5", [(4990, 20)])


async def _pieces(data: bytes, step: int = 1 << 20) -> AsyncIterator[bytes]:
    for i in range(0, len(data), step):
        yield data[i : i + step]


async def _uploads_in_progress(store: S3BlobStore) -> int:
    _, body = await store._request("GET", store._url(query={"uploads": ""}))
    return body.count(b"<Upload>")


async def test_streamed_blobs_go_up_in_parts_and_come_back_in_ranges(store: S3BlobStore) -> None:
    data = os.urandom(2 * PART_BYTES + 12345)
    assert await store.put_stream("ns/packs/big", _pieces(data), len(data)) == len(data)
    assert await store.put_stream("ns/packs/big", _pieces(data), len(data)) == 0, "present: not written again"
    got = [p async for p in store.read_stream("ns/packs/big", 100, len(data) - 200)]
    assert b"".join(got) == data[100:-100] and max(map(len, got)) <= PART_BYTES
    small = [p async for p in store.read_stream("ns/packs/big", 7, 5)]
    assert small == [data[7:12]]
    # Another count than announced, or a source that fails, stores nothing and leaves no upload open.
    for key, announced in (("over", len(data) - 1), ("under", len(data) + 1), ("one-put", 100)):
        with pytest.raises(errors.BackendError, match="announced"):
            await store.put_stream(f"ns/packs/{key}", _pieces(data), announced)

    async def failing() -> AsyncIterator[bytes]:
        yield data[:PART_BYTES]
        yield data[PART_BYTES : 2 * PART_BYTES]
        raise errors.FailedPrecondition("the file changed while it was read")

    with pytest.raises(errors.FailedPrecondition):
        await store.put_stream("ns/packs/failing", failing(), len(data))
    assert await store.list_keys() == ["ns/packs/big"]
    assert await _uploads_in_progress(store) == 0
    with pytest.raises(errors.BackendError, match="ends before"):
        _ = [p async for p in store.read_stream("ns/packs/big", 0, len(data) + 1)]
    with pytest.raises(errors.NotFound, match="ns/packs/none"):
        _ = [p async for p in store.read_stream("ns/packs/none", 0, 10)]


async def test_wrong_secret_is_refused(s3_endpoint: str) -> None:
    bad = S3BlobStore(S3Config(s3_endpoint, "blobs", ACCESS, "wrong", create_bucket=False))
    try:
        with pytest.raises(errors.BackendError):
            await bad.put_absent({"k": b"v"})
    finally:
        await bad.close()


async def test_snapshots_stored_in_s3(s3_endpoint: str, tmp_path: Path) -> None:
    settings = load_settings(
        None,
        {
            "instance_id": "s3",
            "state_dir": str(tmp_path / "state"),
            "backend.kind": "fake",
            "server.port": 0,
            "snapshots.gc_interval_seconds": 0.0,
            "snapshots.s3.endpoint": s3_endpoint,
            "snapshots.s3.bucket": "snaps",
            "snapshots.s3.access_key": ACCESS,
            "snapshots.s3.secret_key": SECRET,
        },
    )
    app = build_app(settings, backend=FakeBackend())
    await app.start()
    try:
        assert app.snapshots is not None and isinstance(app.snapshots.blobs.store, S3BlobStore)
        raw = app.snapshots.blobs.store
        async with AsyncClient(app.address) as client:
            await client.create_pool("p", "img", min_ready=2, max_size=8)
            lease = await client.lease("p", timeout=5)
            await lease[0].write_files({"a.txt": "alpha", "b/c.txt": "gamma" * 100})
            snap = await lease[0].snapshot()
            assert snap.stored_bytes == 5 + 500
            fork = await client.restore(snap.id, n=2, timeout=5)
            files = await asyncio.gather(*(s.read_files(["a.txt", "b/c.txt"]) for s in fork))
            assert all(f == {"a.txt": b"alpha", "b/c.txt": b"gamma" * 100} for f in files)
            assert len(await app.snapshots.blobs.list_keys()) == 2
            assert len(await raw.list_keys()) == 1, "both files went into one pack object"
            await client.delete_snapshot(snap.id)
            assert (await app.snapshots.gc()).deleted_blobs == 2
            assert await app.snapshots.blobs.list_keys() == []
            assert await raw.list_keys() == []
    finally:
        await app.stop(0.5)
