"""Killing the control plane with SIGKILL and starting it again leaves no
orphans: leased sandboxes are adopted under their leases, the rest removed."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import socket
import sys
from pathlib import Path

import docker
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sandboxd import errors
from sandboxd.client import AsyncClient
from tests.integration.conftest import instance_containers, poll

pytestmark = [pytest.mark.docker, pytest.mark.timeout(180)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def start_server(instance: str, state: Path, port: int) -> asyncio.subprocess.Process:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "sandboxd.cli",
        "--log-level",
        "WARNING",
        "serve",
        "--port",
        str(port),
        "--instance",
        instance,
        "--state-dir",
        str(state),
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    async with AsyncClient(f"127.0.0.1:{port}") as client:
        stub = health_pb2_grpc.HealthStub(client._channel)

        async def serving() -> bool:
            try:
                reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
            except Exception:
                return False
            return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)

        await poll(serving, timeout=60, what="server to serve")
    return proc


async def test_sigkill_then_restart_adopts_leases_and_leaves_no_orphans(
    tmp_path: Path, engine: docker.DockerClient, image: str
) -> None:
    instance = "it-" + secrets.token_hex(4)
    port = free_port()
    proc = await start_server(instance, tmp_path, port)
    try:
        async with AsyncClient(f"127.0.0.1:{port}") as client:
            await client.create_pool("rs", image, min_ready=3, max_size=6)
            lease = await client.lease("rs", n=2, lease_ttl=600, timeout=60)
            kept = lease.sandboxes[0]
            await kept.write_file("state.txt", "before the crash")
            await poll(lambda: _ready(client, "rs", 3), timeout=60, what="pool to warm")
        before = {c.id for c in await asyncio.to_thread(instance_containers, engine, instance)}
        assert len(before) == 5

        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        proc = await start_server(instance, tmp_path, port)

        async with AsyncClient(f"127.0.0.1:{port}") as client:
            # The client's lease and files survived; it carries on.
            again = await client.read_files(kept.id, ["state.txt"])
            assert again["state.txt"] == b"before the crash"
            await client.heartbeat(lease.id)
            pool = await client.get_pool("rs")
            assert pool.status.leased == 2
            await poll(lambda: _ready(client, "rs", 3), timeout=60, what="pool to re-warm")
            now = {c.id for c in await asyncio.to_thread(instance_containers, engine, instance)}
            leased_ids = {s.id for s in lease.sandboxes}
            # Every container is either one of the two leased or a fresh warm one.
            survivors = before & now
            assert len(survivors) == 2, "only the leased sandboxes survive a crash"
            assert len(now) == 5
            await client.release(lease.id)
            with pytest.raises(errors.NotFound):
                await client.exec(next(iter(leased_ids)), "true")
            await client.delete_pool("rs")
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 60) == 0
        left = await asyncio.to_thread(instance_containers, engine, instance)
        assert left == [], "nothing of this instance remains after release and a clean stop"
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        for c in await asyncio.to_thread(instance_containers, engine, instance):
            with contextlib.suppress(docker.errors.NotFound):
                await asyncio.to_thread(c.remove, force=True)


async def _ready(client: AsyncClient, pool: str, n: int) -> bool:
    return (await client.get_pool(pool)).status.ready >= n


async def test_a_restart_adopts_each_sandbox_with_its_uid_and_gives_it_to_no_other(
    tmp_path: Path, engine: docker.DockerClient, image: str
) -> None:
    instance = "it-" + secrets.token_hex(4)
    port = free_port()
    proc = await start_server(instance, tmp_path, port)
    try:
        async with AsyncClient(f"127.0.0.1:{port}") as client:
            await client.create_pool("uids", image, min_ready=0, max_size=6)
            lease = await client.lease("uids", n=2, lease_ttl=600, timeout=60)
            before = {sb.id: (await sb.exec("id -u")).text for sb in lease.sandboxes}
            assert len(set(before.values())) == 2
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        proc = await start_server(instance, tmp_path, port)
        async with AsyncClient(f"127.0.0.1:{port}") as client:
            for sandbox_id, uid in before.items():
                assert (await client.exec(sandbox_id, "id -u; id -un")).text == f"{uid}sandbox\n"
                # Files written by the adopted control plane are the sandbox's own.
                await client.write_files(sandbox_id, {"after.txt": "x"})
                assert (await client.exec(sandbox_id, "stat -c %u after.txt")).text == uid
            fresh = await client.lease("uids", n=3, lease_ttl=600, timeout=60)
            uids = [(await sb.exec("id -u")).text for sb in fresh.sandboxes]
            assert len(set(uids)) == 3 and not set(uids) & set(before.values()), (uids, before)
            await client.release(fresh.id)
            await client.release(lease.id)
            await client.delete_pool("uids")
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 60) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        for c in await asyncio.to_thread(instance_containers, engine, instance):
            with contextlib.suppress(docker.errors.NotFound):
                await asyncio.to_thread(c.remove, force=True)
