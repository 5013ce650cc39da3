"""Pools, leases and files against real containers."""

from __future__ import annotations

import asyncio
import io
import tarfile

import docker
import pytest

from sandboxd import errors
from sandboxd.app import App
from sandboxd.client import AsyncClient
from tests.integration.conftest import instance_containers, poll

pytestmark = [pytest.mark.docker, pytest.mark.timeout(120)]


async def test_group_rollout_round_trip(
    app: App, client: AsyncClient, pool: str, engine: docker.DockerClient
) -> None:
    async with client.acquire_group(pool, n=3, labels={"run": "r1", "group": "g0"}, timeout=60) as group:
        assert len(group) == 3 and len({sb.id for sb in group}) == 3
        listed = await client.list_sandboxes(pool, labels={"group": "g0"})
        assert {s.id for s in listed} == {sb.id for sb in group}
        results = await asyncio.gather(
            *(sb.exec(["python3", "-c", f"print({i}*2)"]) for i, sb in enumerate(group))
        )
        assert [r.text.strip() for r in results] == ["0", "2", "4"]
        ids = {sb.id for sb in group}
    # Released sandboxes are destroyed, never recycled.
    await poll(lambda: not any(s in app.control._index for s in ids), what="released sandboxes to go")
    after = await client.list_sandboxes(pool)
    assert not ids & {s.id for s in after}
    await poll(lambda: app.control.pools[pool].ready >= 2, what="pool to refill")


async def test_files_round_trip(client: AsyncClient, pool: str) -> None:
    async with client.acquire(pool) as sb:
        payload = bytes(range(256)) * 100
        await sb.write_files({"a/b/c.bin": payload, "run.sh": "#!/bin/sh\necho hi\n"})
        await sb.write_file("exe.sh", "#!/bin/sh\necho exe\n", mode=0o755)
        got = await sb.read_files(["a/b/c.bin", "/workspace/run.sh"])
        assert got == {"a/b/c.bin": payload, "/workspace/run.sh": b"#!/bin/sh\necho hi\n"}
        assert (await sb.exec("./exe.sh")).text == "exe\n"
        with pytest.raises(errors.NotFound, match="nope.txt"):
            await sb.read_file("nope.txt")
        with pytest.raises(errors.InvalidArgument, match="escapes"):
            await sb.write_files({"../etc/passwd": "x"})
        with pytest.raises(errors.InvalidArgument, match="not a regular file"):
            await sb.read_file("a")
        # Directory upload and download as tar streams.
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for name, body in [("pkg/__init__.py", b""), ("pkg/mod.py", b"X = 1\n")]:
                info = tarfile.TarInfo(name)
                info.size = len(body)
                tar.addfile(info, io.BytesIO(body))
        await sb.upload_dir(buf.getvalue(), "proj")
        r = await sb.exec(["python3", "-c", "import pkg.mod; print(pkg.mod.X)"], cwd="proj")
        assert r.text == "1\n"
        data = await sb.download_dir("proj")
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            names = {m.name.removeprefix("./") for m in tar.getmembers()}
        assert {"pkg/__init__.py", "pkg/mod.py"} <= names
        bad = io.BytesIO()
        with tarfile.open(fileobj=bad, mode="w") as tar:
            info = tarfile.TarInfo("../../escape")
            tar.addfile(info, io.BytesIO(b""))
        with pytest.raises(errors.InvalidArgument, match="escapes"):
            await sb.upload_dir(bad.getvalue(), "proj")


async def test_disk_limit_is_enforced_by_the_kernel(client: AsyncClient, image: str) -> None:
    await client.create_pool(
        "small", image, min_ready=1, max_size=2, limits={"disk_bytes": 4 << 20, "max_files": 100}
    )
    async with client.acquire("small") as sb:
        with pytest.raises(errors.ResourceExhausted):
            await sb.write_files({"big.bin": b"x" * (6 << 20)})
        r = await sb.exec("for i in $(seq 1 500); do touch f$i || exit 9; done")
        assert r.exit_code == 9
        count = await sb.exec("ls | wc -l")
        assert int(count.text) < 100
    await client.delete_pool("small")


async def test_lease_expiry_reclaims(
    app: App, client: AsyncClient, pool: str, engine: docker.DockerClient
) -> None:
    lease = await client.lease(pool, lease_ttl=0.5, timeout=60)
    sid = lease.sandboxes[0].id
    await poll(lambda: sid not in app.control._index, timeout=20, what="expired lease to be reclaimed")
    with pytest.raises(errors.NotFound, match="lease expired"):
        await client.exec(sid, "true")
    assert await client.release(lease.id) == [], "releasing an expired lease is a no-op"

    kept = await client.lease(pool, lease_ttl=1.0, timeout=60)
    for _ in range(4):
        await client.heartbeat(kept.id, 1.0)
        assert (await kept.sandboxes[0].exec("true")).ok
    await kept.release()


async def test_bad_requests(client: AsyncClient, pool: str, image: str) -> None:
    with pytest.raises(errors.FailedPrecondition, match="at most 8"):
        await client.lease(pool, n=9, timeout=1)
    with pytest.raises(errors.NotFound):
        await client.exec("sb-000000000000", "true")
    with pytest.raises(errors.InvalidArgument, match="sandbox_id"):
        await client.exec("nonsense", "true")
    with pytest.raises(errors.FailedPrecondition, match="not present"):
        await client.create_pool("ghost", "sandboxd/does-not-exist:1")
    with pytest.raises(errors.InvalidArgument, match="min_ready"):
        await client.create_pool("bad", image, min_ready=5, max_size=2)
    async with client.acquire(pool) as sb:
        with pytest.raises(errors.InvalidArgument, match="argv"):
            await client.exec(sb.id, [])
        with pytest.raises(errors.InvalidArgument, match="timeout"):
            await sb.exec("true", timeout=-1)
        with pytest.raises(errors.InvalidArgument, match="env"):
            await sb.exec("true", env={"1BAD": "x"})


async def test_graceful_stop_leaves_no_half_created(
    tmp_path: object, engine: docker.DockerClient, image: str
) -> None:
    from pathlib import Path

    from sandboxd.app import build_app
    from tests.integration.conftest import make_settings

    settings = make_settings(Path(str(tmp_path)))
    app = build_app(settings)
    await app.start()
    async with AsyncClient(app.address) as client:
        await client.create_pool("busy", image, min_ready=6, max_size=6)
        await poll(lambda: app.control.pools["busy"].creating > 0, what="creates to start")
    await app.stop(grace=1)
    left = await asyncio.to_thread(instance_containers, engine, settings.instance_id)
    assert left == [], "warm and half-created sandboxes are removed on shutdown"
