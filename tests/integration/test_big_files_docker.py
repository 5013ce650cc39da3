"""Large and sparse files against the real engine, with workspaces read in
place from the host and read through the sandbox: a file above the inline
and chunk sizes snapshots and restores with exact size and digest (local
blob directory and S3); a sparse file within the sandbox's disk limit is
snapshotted and restored in bounded memory (traced in the server, which
runs in this process); one whose apparent size passes the limit is refused
by name with nothing stored; a tar upload holding a sparse member, or lying
about a member's size, is refused. A bystander sandbox keeps answering
throughout, and nothing leaks."""

from __future__ import annotations

import contextlib
import hashlib
import tracemalloc
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any

import docker
import pytest

from sandboxd import errors
from sandboxd.app import App
from sandboxd.client import AsyncClient, ExecResult, Sandbox
from sandboxd.core.snapshots import sizes
from sandboxd.stores.local import LocalBlobStore
from sandboxd.stores.s3 import S3BlobStore
from tests.bigfiles import Watched, short_tar, sparse_tar
from tests.integration import versitygw
from tests.integration.conftest import make_settings, running_app
from tests.probing import while_probing

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

READ_PATHS = ["in-place", "through-sandbox"]
BIG = 10 << 20  # above the inline size, the chunk size and one S3 part
HOLES = 6 << 20


@contextlib.asynccontextmanager
async def server(
    tmp_path: Path, engine: docker.DockerClient, read_path: str, store: str = "local"
) -> AsyncIterator[App]:
    overrides: dict[str, Any] = {
        "backend.host_workspaces": read_path == "in-place",
        "snapshots.gc_interval_seconds": 0.0,
    }
    with contextlib.ExitStack() as stack:
        if store == "s3":
            endpoint = stack.enter_context(versitygw.serve(tmp_path))
            overrides.update(
                {
                    "snapshots.s3.endpoint": endpoint,
                    "snapshots.s3.bucket": "snaps",
                    "snapshots.s3.access_key": versitygw.ACCESS,
                    "snapshots.s3.secret_key": versitygw.SECRET,
                }
            )
        async with running_app(make_settings(tmp_path, **overrides), engine) as app:
            yield app


@contextlib.asynccontextmanager
async def pair(client: AsyncClient, image: str, **limits: int) -> AsyncIterator[tuple[Sandbox, Sandbox]]:
    await client.create_pool("big", image, min_ready=2, max_size=4, limits=limits or None)
    async with client.acquire_group("big", n=2, timeout=60) as group:
        assert (await group[1].exec("true", session="probe")).ok
        yield group[0], group[1]


async def probed(bystander: Sandbox, work: Awaitable[Any]) -> Any:
    """``work``'s result; fails unless the bystander was answered meanwhile."""
    out: list[Any] = []

    async def attack() -> ExecResult:
        out.append(await work)
        return await bystander.exec("true")

    _, latencies = await while_probing(bystander, attack())
    assert latencies and max(latencies) < 10.0, latencies
    return out[0]


async def assert_nothing_leaked(app: App) -> None:
    """No pins, no staged archive, no partial blob, no open upload."""
    assert app.snapshots is not None
    assert app.snapshots.pinned() == 0
    staged = app.settings.state_dir / "inbox-staged"
    assert not staged.exists() or list(staged.iterdir()) == []
    store = app.snapshots.blobs.store
    if isinstance(store, LocalBlobStore):
        assert [p for p in store.root.rglob("*") if ".tmp-" in p.name] == []
    if isinstance(store, S3BlobStore):
        _, body = await store._request("GET", store._url(query={"uploads": ""}))
        assert b"<Upload>" not in body


async def raw_keys(app: App) -> list[str]:
    assert app.snapshots is not None
    return await app.snapshots.blobs.store.list_keys()


SETUP = f"""
set -e
mkdir -p d
head -c {BIG} /dev/urandom > big.bin && cp big.bin d/copy.bin && printf s > small
truncate -s {HOLES} holes.bin
"""
FILES = "big.bin d/copy.bin small holes.bin"
SUMS = f"cd /workspace && sha256sum {FILES} && stat -c '%n %s' {FILES}"


@pytest.mark.parametrize("store", ["local", "s3"])
@pytest.mark.parametrize("read_path", READ_PATHS)
async def test_a_file_above_the_chunk_size_round_trips_exactly(
    tmp_path: Path,
    engine: docker.DockerClient,
    image: str,
    read_path: str,
    store: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with server(tmp_path, engine, read_path, store) as app, AsyncClient(app.address) as client:
        assert app.snapshots is not None
        watched = Watched(monkeypatch, app.snapshots.blobs.store)
        async with pair(client, image) as (victim, bystander):
            assert (await victim.exec(SETUP)).ok
            sums = (await victim.exec(SUMS)).text
            snap = await probed(bystander, victim.snapshot())
        assert snap.size_bytes == 2 * BIG + 1 + HOLES, "exact, a sparse file at its apparent size"
        assert snap.stored_bytes == BIG + 1 + HOLES, "the copy is stored once"
        entries = await app.snapshots._catalog.entries(snap.id)
        assert entries is not None
        for line in sums.splitlines()[:4]:
            digest, name = line.split()
            assert entries[name].digest == digest, name
        # Structural bound on memory: no piece above a chunk, no packed blob above the inline size.
        assert watched.streams == 3 and 0 < watched.piece <= sizes.CHUNK_BYTES
        assert watched.packed <= sizes.INLINE_BYTES

        restored = await client.restore(snap.id, timeout=60)
        try:
            assert (await restored[0].exec(SUMS)).text == sums
            again = await restored[0].snapshot()
            assert again.parent_id == snap.id and again.stored_bytes == 0
        finally:
            await restored.release()
        await assert_nothing_leaked(app)


def _zeros_sha256(n: int) -> str:
    h = hashlib.sha256()
    block = bytes(1 << 20)
    for _ in range(n >> 20):
        h.update(block)
    return h.hexdigest()


@pytest.mark.parametrize("read_path", READ_PATHS)
async def test_a_sparse_file_within_the_limit_is_snapshotted_and_restored_in_bounded_memory(
    tmp_path: Path, engine: docker.DockerClient, image: str, read_path: str
) -> None:
    """160 MiB of holes: held whole, a capture or restore would trace more
    than that; streamed, a few chunks."""
    holes = 160 << 20
    async with server(tmp_path, engine, read_path) as app, AsyncClient(app.address) as client:
        async with pair(client, image) as (victim, bystander):
            assert (await victim.exec(f"truncate -s {holes} holes.bin && printf x > small")).ok
            tracemalloc.start()
            try:
                base = tracemalloc.get_traced_memory()[0]
                snap = await probed(bystander, victim.snapshot())
                captured = tracemalloc.get_traced_memory()[1] - base
                tracemalloc.reset_peak()
                base = tracemalloc.get_traced_memory()[0]
                restored = await probed(bystander, client.restore(snap.id, timeout=60))
                restoring = tracemalloc.get_traced_memory()[1] - base
            finally:
                tracemalloc.stop()
            try:
                r = await restored[0].exec("stat -c %s holes.bin && sha256sum holes.bin && cat small")
                assert r.text == f"{holes}\n{_zeros_sha256(holes)}  holes.bin\nx", r
            finally:
                await restored.release()
        assert snap.size_bytes == holes + 1
        assert captured < 48 << 20, f"the capture traced {captured} bytes"
        assert restoring < 48 << 20, f"the restore traced {restoring} bytes"
        await assert_nothing_leaked(app)


@pytest.mark.parametrize("read_path", READ_PATHS)
async def test_a_sparse_file_above_the_disk_limit_is_refused_and_nothing_is_stored(
    tmp_path: Path, engine: docker.DockerClient, image: str, read_path: str
) -> None:
    """20 GiB of holes on a 256 MiB workspace (tmpfs keeps files sparse)."""
    async with server(tmp_path, engine, read_path) as app, AsyncClient(app.address) as client:
        assert app.snapshots is not None
        async with pair(client, image) as (victim, bystander):
            setup = (
                "mkdir -p src && for i in $(seq 1 40); do head -c 20000 /dev/urandom > src/f$i; done "
                "&& head -c 6000000 /dev/urandom > big.bin && truncate -s 20G holes.bin"
            )
            assert (await victim.exec(setup)).ok
            with pytest.raises(errors.ResourceExhausted) as info:
                await probed(bystander, victim.snapshot())
            message = info.value.message
            want = "/workspace/holes.bin has an apparent size of 21474836480 bytes (20.0 GiB"
            assert want in message, message
            assert "a sparse file counts whole" in message and str(256 << 20) in message
            assert await raw_keys(app) == [], "nothing was written to the blob store"
            assert await client.list_snapshots() == []
            # The sandbox goes on working; without the file it snapshots.
            assert (await victim.exec("rm holes.bin")).ok
            snap = await victim.snapshot()
            assert snap.size_bytes == 40 * 20000 + 6000000
        await assert_nothing_leaked(app)


async def test_an_upload_with_a_sparse_or_lying_member_is_refused(
    tmp_path: Path, engine: docker.DockerClient, image: str
) -> None:
    async with server(tmp_path, engine, "in-place") as app, AsyncClient(app.address) as client:
        async with pair(client, image) as (victim, bystander):
            lying = [(sparse_tar("holes.bin", 20 << 30), "holes.bin"), (short_tar("liar", 1 << 40), "liar")]
            for data, name in lying:
                with pytest.raises(errors.ResourceExhausted, match=f"'{name}' has an apparent size of"):
                    await probed(bystander, client.upload_dir(victim.id, data))
            with pytest.raises(errors.InvalidArgument, match="declares more data than the archive holds"):
                await client.upload_dir(victim.id, short_tar("liar", 100_000))
            assert (await victim.exec("ls -A /workspace")).text == ""
            # A sparse member that fits is extracted (sparse, by the sandbox's tar).
            assert await client.upload_dir(victim.id, sparse_tar("fits.bin", 100 << 20)) > 0
            r = await victim.exec("stat -c %s fits.bin && tail -c 4 fits.bin")
            assert r.text == f"{100 << 20}\ntail", r
        await assert_nothing_leaked(app)
