"""The S3 blob store against a real S3-compatible server: versitygw (the
Versity S3 Gateway, a Go module that scripts/setup.sh builds) serving a
temporary directory on 127.0.0.1. Signature V4, listing, deletes, and whole
snapshots stored there and garbage-collected."""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from sandboxd import errors
from sandboxd.app import build_app
from sandboxd.backends.fake import FakeBackend
from sandboxd.client import AsyncClient
from sandboxd.settings import load_settings
from sandboxd.stores.s3 import S3BlobStore, S3Config

pytestmark = pytest.mark.timeout(60)

ACCESS, SECRET = "sandboxd-test", "sandboxd-test-secret"


def versitygw_binary() -> str:
    found = shutil.which("versitygw")
    gopath = os.environ.get("GOPATH") or str(Path.home() / "go")
    candidate = Path(gopath) / "bin" / "versitygw"
    if found:
        return found
    if candidate.exists():
        return str(candidate)
    raise AssertionError("versitygw not found: run scripts/setup.sh (it builds it with `go install`)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def s3_endpoint(tmp_path: Path) -> Iterator[str]:
    root = tmp_path / "s3"
    root.mkdir()
    port = free_port()
    log = (tmp_path / "versitygw.log").open("wb")
    proc = subprocess.Popen(
        [versitygw_binary(), "--access", ACCESS, "--secret", SECRET, "--port", f"127.0.0.1:{port}",
         "--quiet", "posix", "--nometa", str(root)],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        for _ in range(400):  # up to ~20 s for the port to accept
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.05).close()
                break
            except OSError as e:
                if proc.poll() is not None:
                    raise AssertionError(
                        f"versitygw exited: {(tmp_path / 'versitygw.log').read_text()}"
                    ) from e
                time.sleep(0.05)  # a pause between polls of another process's port
        else:
            raise AssertionError("versitygw did not start listening")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


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
