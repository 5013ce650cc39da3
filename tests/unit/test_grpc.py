"""The full server in-process (FakeBackend, port 0) driven through the clients."""

from __future__ import annotations

import asyncio
import io
import tarfile
import time
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from sandboxd import errors
from sandboxd.app import SERVICE_NAMES, App
from sandboxd.backends.fake import FakeBackend
from sandboxd.client import AsyncClient, Client
from sandboxd.core.lifecycle import State
from sandboxd.v1 import files_pb2, sandboxes_pb2, sandboxes_pb2_grpc
from tests.unit.conftest import IMAGE, UNKNOWN_LEASE, UNKNOWN_SANDBOX, MakeApp, wait_for

pytestmark = pytest.mark.timeout(30)

SANDBOXD_SERVICES = {
    "sandboxd.v1.PoolService",
    "sandboxd.v1.SandboxService",
    "sandboxd.v1.ExecService",
    "sandboxd.v1.FileService",
}


async def raw_code(coro: Any) -> tuple[grpc.StatusCode, str]:
    """Status code and details of an RPC expected to fail."""
    try:
        await coro
    except grpc.aio.AioRpcError as e:
        return e.code(), e.details() or ""
    raise AssertionError("the RPC succeeded")


async def test_invalid_argument_names_the_field(app: App, client: AsyncClient) -> None:
    with pytest.raises(errors.InvalidArgument) as info:
        await client.create_pool("Not_A_Name", IMAGE)
    assert info.value.field == "spec.name"
    with pytest.raises(errors.InvalidArgument) as info:
        await client.create_pool("p", IMAGE, env={"SANDBOXD_X": "1"})
    assert info.value.field == "spec.env[SANDBOXD_X]"
    await client.create_pool("p", IMAGE, min_ready=1, max_size=2)
    with pytest.raises(errors.InvalidArgument) as info:
        await client.lease("p", labels={"bad key": "v"}, timeout=5)
    assert info.value.field == "labels['bad key']"
    with pytest.raises(errors.InvalidArgument) as info:
        await client.lease("Bad_Pool", timeout=5)
    assert info.value.field == "pool"
    # On the wire: INVALID_ARGUMENT with "field: problem" as the details.
    stub = sandboxes_pb2_grpc.SandboxServiceStub(client._channel)
    code, details = await raw_code(stub.Acquire(sandboxes_pb2.AcquireRequest(pool="p", n=2, min_n=3)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details.startswith("min_n: ")


async def test_invalid_exec_and_file_requests(app: App, client: AsyncClient) -> None:
    await client.create_pool("p", IMAGE, max_size=2)
    lease = await client.lease("p", timeout=5)
    sb = lease[0]
    with pytest.raises(errors.InvalidArgument) as info:
        await sb.exec([])
    assert info.value.field == "argv"
    with pytest.raises(errors.InvalidArgument) as info:
        await sb.exec("true", timeout=-1)
    assert info.value.field == "timeout_seconds"
    with pytest.raises(errors.InvalidArgument) as info:
        await sb.write_files({"../etc/passwd": b"x"})
    assert info.value.field == "files[0].path"
    with pytest.raises(errors.InvalidArgument) as info:
        await sb.read_files(["/etc/passwd"])
    assert info.value.field == "paths[0]"
    with pytest.raises(errors.InvalidArgument) as info:
        await sb.download_dir("a/../../x")
    assert info.value.field == "path"
    evil = io.BytesIO()
    with tarfile.open(fileobj=evil, mode="w") as tar:
        member = tarfile.TarInfo("../escape")
        tar.addfile(member, io.BytesIO(b""))
    with pytest.raises(errors.InvalidArgument) as info:
        await client.upload_dir(sb.id, evil.getvalue())
    assert info.value.field == "tar"
    await lease.release()


async def test_not_found(app: App, client: AsyncClient) -> None:
    with pytest.raises(errors.NotFound, match="nope"):
        await client.get_pool("nope")
    with pytest.raises(errors.NotFound):
        await client.release(UNKNOWN_LEASE)
    with pytest.raises(errors.NotFound):
        await client.heartbeat(UNKNOWN_LEASE)
    with pytest.raises(errors.NotFound):
        await client.get_sandbox(UNKNOWN_SANDBOX)
    with pytest.raises(errors.NotFound):
        await client.exec(UNKNOWN_SANDBOX, "true")
    await client.create_pool("p", IMAGE, max_size=3)
    lease = await client.lease("p", timeout=5)
    with pytest.raises(errors.NotFound, match="not held"):
        await client.release(lease.id, [UNKNOWN_SANDBOX])
    await client.write_files(lease[0].id, {"a.txt": "1"})
    with pytest.raises(errors.NotFound, match=r"missing\.txt"):
        await lease[0].read_files(["a.txt", "missing.txt"])
    await lease.release()
    assert await client.release(lease.id) == []  # idempotent


async def test_already_exists(app: App, client: AsyncClient) -> None:
    await client.create_pool("p", IMAGE)
    with pytest.raises(errors.AlreadyExists, match="'p'"):
        await client.create_pool("p", IMAGE)


async def test_failed_precondition(make_app: MakeApp) -> None:
    app = await make_app(backend=FakeBackend(images={IMAGE}))
    async with AsyncClient(app.address) as client:
        with pytest.raises(errors.FailedPrecondition, match="not present"):
            await client.create_pool("p", "absent/image:1")
        await client.create_pool("p", IMAGE, min_ready=1, max_size=2)
        with pytest.raises(errors.FailedPrecondition, match="at most 2"):
            await client.lease("p", n=3, timeout=5)
        lease = await client.lease("p", timeout=5)
        with pytest.raises(errors.FailedPrecondition, match="force"):
            await client.delete_pool("p")
        await client.delete_pool("p", force=True)
        with pytest.raises(errors.NotFound):
            await client.get_pool("p")
        with pytest.raises(errors.NotFound):
            await lease.heartbeat()


async def test_deadline_exceeded_when_the_pool_cannot_fill(make_app: MakeApp) -> None:
    app = await make_app(backend=FakeBackend(start_delay=30.0))
    async with AsyncClient(app.address) as client:
        await client.create_pool("slow", IMAGE, max_size=4)
        started = time.monotonic()
        with pytest.raises(errors.DeadlineExceeded):
            await client.lease("slow", n=2, timeout=0.3)
        assert time.monotonic() - started < 3.0
        # The call's own deadline bounds the wait too (timeout_seconds unset).
        stub = sandboxes_pb2_grpc.SandboxServiceStub(client._channel)
        code, _ = await raw_code(stub.Acquire(sandboxes_pb2.AcquireRequest(pool="slow"), timeout=0.3))
        assert code == grpc.StatusCode.DEADLINE_EXCEEDED
        await wait_for(lambda: app.control.get_pool("slow").waiting == 0, what="waiters withdrawn")
        assert len(app.control.leases) == 0
        assert await client.list_sandboxes("slow", state=int(State.LEASED)) == []


async def test_health_reports_serving(app: App) -> None:
    async with grpc.aio.insecure_channel(app.address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ["", *SERVICE_NAMES]:
            response = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert response.status == health_pb2.HealthCheckResponse.SERVING, service


async def test_reflection_lists_the_four_services(app: App) -> None:
    async with grpc.aio.insecure_channel(app.address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        call = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
        names = set()
        async for response in call:
            names |= {s.name for s in response.list_services_response.service}
    assert names >= SANDBOXD_SERVICES
    assert {n for n in names if n.startswith("sandboxd.")} == set(SERVICE_NAMES)
    assert "grpc.health.v1.Health" in names


async def test_acquire_context_manager_releases_on_exit(app: App, client: AsyncClient) -> None:
    await client.create_pool("p", IMAGE, min_ready=1, max_size=2)
    async with client.acquire("p", labels={"run": "ok"}, timeout=5) as sb:
        result = await sb.exec("echo inside")
        assert result.ok and result.text == "inside\n"
        info = await client.get_sandbox(sb.id)
        assert info.state == int(State.LEASED) and info.labels["run"] == "ok"
        lease_id = sb.lease_id
    assert app.control.leases.find(lease_id) is None

    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        async with client.acquire("p", timeout=5) as sb:
            lease_id, sandbox_id = sb.lease_id, sb.id
            raise Boom
    assert app.control.leases.find(lease_id) is None
    with pytest.raises(errors.NotFound):
        await client.heartbeat(lease_id)
    await wait_for(lambda: sandbox_id not in app.control._index, what="destroyed after the error")


async def test_acquire_group(app: App, client: AsyncClient) -> None:
    await client.create_pool("g", IMAGE, min_ready=4, max_size=8)
    async with client.acquire_group("g", n=4, labels={"group": "7"}, timeout=5) as group:
        assert len(group) == 4
        assert len({sb.id for sb in group}) == 4
        assert all(sb.lease_id == group.id for sb in group)
        results = await asyncio.gather(*(sb.exec(f"echo {i}") for i, sb in enumerate(group)))
        assert [r.text for r in results] == [f"{i}\n" for i in range(4)]
        listed = await client.list_sandboxes("g", labels={"group": "7"})
        assert {s.id for s in listed} == {sb.id for sb in group}
        group_id = group.id
    assert app.control.leases.find(group_id) is None


async def test_exec_stream_yields_output_then_a_result(app: App, client: AsyncClient) -> None:
    await client.create_pool("p", IMAGE, max_size=2)
    async with client.acquire("p", timeout=5) as sb:
        events = [e async for e in sb.exec_stream("echo one; echo two; nosuchcmd; exit 4")]
    kinds = [kind for kind, _ in events]
    assert kinds[-1] == "result"
    assert "result" not in kinds[:-1]
    stdout = b"".join(data for kind, data in events if kind == "stdout")
    stderr = b"".join(data for kind, data in events if kind == "stderr")
    assert stdout == b"one\ntwo\n"
    assert b"not found" in stderr
    result = events[-1][1]
    assert (result.outcome, result.exit_code) == ("EXITED", 4)
    assert result.stdout == b""  # already streamed


async def test_exec_outcomes_over_the_wire(app: App, client: AsyncClient) -> None:
    await client.create_pool("p", IMAGE, max_size=2)
    async with client.acquire("p", timeout=5) as sb:
        assert (await sb.exec("sleep 30", timeout=0.1)).outcome == "TIMED_OUT"
        capped = await sb.exec("yes", output_limit=100, timeout=10)
        assert capped.outcome == "OUTPUT_TRUNCATED" and len(capped.stdout) == 100
        await sb.exec("cd /workspace; export X=1", session="s")
        assert (await sb.exec("env", session="s")).text == "X=1\n"


async def test_files_round_trip_over_the_wire(app: App, client: AsyncClient, tmp_path: Path) -> None:
    local = tmp_path / "proj"
    (local / "pkg").mkdir(parents=True)
    (local / "main.py").write_bytes(b"print(1)\n")
    (local / "pkg" / "mod.py").write_bytes(b"X = 2\n" * 10_000)
    await client.create_pool("p", IMAGE, max_size=2)
    async with client.acquire("p", timeout=5) as sb:
        await sb.write_file("bin/tool", "#!/bin/sh\n", mode=0o755)
        assert await sb.read_file("bin/tool") == b"#!/bin/sh\n"
        got = await client.files.ReadFiles(files_pb2.ReadFilesRequest(sandbox_id=sb.id, paths=["bin/tool"]))
        assert got.files[0].mode == 0o755
        assert await sb.upload_dir(local, "proj") > 0
        data = await sb.download_dir("proj")
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        back = {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}  # type: ignore[union-attr]
    assert back == {"main.py": b"print(1)\n", "pkg/mod.py": b"X = 2\n" * 10_000}


async def test_pool_admin_over_the_wire(app: App, client: AsyncClient) -> None:
    await client.create_pool("p", IMAGE, min_ready=2, max_size=4, labels={"team": "rl"})
    await wait_for(lambda: app.control.get_pool("p").ready == 2, what="warm")
    pool = await client.get_pool("p")
    assert (pool.spec.min_ready, pool.spec.max_size, pool.status.ready) == (2, 4, 2)
    assert dict(pool.spec.labels) == {"team": "rl"}
    assert pool.spec.limits.memory_bytes == app.settings.limits.memory_bytes  # defaults resolved
    pool = await client.update_pool("p", min_ready=0)
    assert (pool.spec.min_ready, pool.spec.max_size) == (0, 4)
    assert [p.spec.name for p in await client.list_pools()] == ["p"]
    await client.delete_pool("p")
    assert await client.list_pools() == []


async def test_blocking_client(app: App) -> None:
    def use_blocking_client() -> tuple[str, str, list[str]]:
        with Client(app.address) as client:
            client.create_pool("sync", IMAGE, min_ready=1, max_size=2)
            with client.acquire("sync", timeout=5) as sb:
                out = sb.exec("echo from-thread").text
                sid = sb.id
            lease = client.lease("sync", timeout=5)
            released = client.release(lease.id)
            return out, sid, released

    out, sid, released = await asyncio.to_thread(use_blocking_client)
    assert out == "from-thread\n"
    assert len(released) == 1 and released[0] != sid
    assert len(app.control.leases) == 0
    await wait_for(lambda: sid not in app.control._index, what="released sandbox destroyed")
