"""The framework adapters over gRPC on the fake backend."""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Callable
from pathlib import Path

import pytest

from sandboxd import errors
from sandboxd.adapters.rllm import CommandFailed as RllmCommandFailed
from sandboxd.adapters.rllm import SandboxdSandbox
from sandboxd.adapters.slime import CommandFailed, ExecOutput, Sandbox
from sandboxd.adapters.verifiers import SandboxdRuntime
from sandboxd.app import App
from sandboxd.backends.fake import FakeBackend
from sandboxd.client import AsyncClient, Client
from tests.unit.conftest import MakeApp

pytestmark = pytest.mark.timeout(30)


async def test_slime_style_sandbox(app: App, client: AsyncClient) -> None:
    await client.create_pool("slime", "img", min_ready=1, max_size=2)
    sb = Sandbox(client, "slime", labels={"run": "s"})
    assert sb.sandbox_id == ""
    async with sb:
        assert sb.sandbox_id == sb.sandbox.id
        await sb.write_file("notes.txt", "hello")
        assert await sb.read_file("notes.txt") == "hello"
        out = await sb.exec("cat notes.txt", idempotent=True)
        exit_code, stdout, stderr = out  # slime unpacks a tuple
        assert (exit_code, stdout, stderr) == (0, "hello", "")
        assert isinstance(out, tuple) and isinstance(out, ExecOutput)
        assert (out.exit_code, out.stdout, out.outcome) == (0, "hello", "EXITED")
        failed = await sb.exec("false")
        assert failed.exit_code == 1 and failed[0] == 1
        with pytest.raises(CommandFailed, match="false"):
            await sb.exec("false", check=True)
        sandbox_id = sb.sandbox.id
    assert sandbox_id not in app.control._index, "leaving the context releases the sandbox"
    with pytest.raises(RuntimeError, match="async with"):
        await Sandbox(client, "slime").exec("true")


async def test_slime_users_paths_and_missing_files(app: App, client: AsyncClient, tmp_path: Path) -> None:
    await client.create_pool("slime", "img", min_ready=1, max_size=2)
    local = tmp_path / "host.bin"
    local.write_bytes(b"\x00host")
    async with Sandbox(client, "slime") as sb:
        assert (await sb.exec("whoami"))[1] == "root\n", "slime's default user is root"
        assert (await sb.exec("whoami", user=""))[1] == "sandbox\n"
        with pytest.raises(ValueError, match="'agent'"):
            await sb.exec("whoami", user="agent")
        await sb.write_file("/tmp/.launch.sh", "echo hi\n", user="root")
        await sb.write_file("/tmp/from-host", local)
        await sb.write_file("/tmp/b", b"\x01")
        assert await sb.read_file("/tmp/.launch.sh") == "echo hi\n"
        assert await sb.read_file("/tmp/from-host", user="root") == "\x00host"
        assert await sb.read_file("/tmp/missing") == ""
        assert await sb.read_file("missing.txt") == ""


async def test_verifiers_style_runtime(app: App, client: AsyncClient, tmp_path: Path) -> None:
    await client.create_pool("vf", "img", min_ready=2, max_size=4)
    runtime = SandboxdRuntime(client, "vf")
    a = await runtime.create_sandbox(labels={"task": "t1"})
    b = await runtime.create_sandbox()
    assert a != b
    local = tmp_path / "answer.txt"
    local.write_text("42")
    # The Prime SDK's meaning: the third argument is a local path, not content.
    await runtime.upload_file(a, "answer.txt", str(local))
    with pytest.raises(FileNotFoundError):
        await runtime.upload_file(a, "answer.txt", "42")
    await runtime.upload_bytes(a, "/tmp/raw.bin", b"7", "raw.bin")
    result = await runtime.execute_command(a, "cat answer.txt", working_dir="/workspace")
    assert (result.stdout, result.exit_code) == ("42", 0)
    assert (await runtime.read_file(a, "/tmp/raw.bin")).content == "7"
    await runtime.download_file(a, "answer.txt", str(tmp_path / "out" / "a.txt"))
    assert (tmp_path / "out" / "a.txt").read_text() == "42"
    await runtime.heartbeat(a)
    await runtime.delete_sandbox(a)
    assert a not in app.control._index
    await runtime.close()
    assert b not in app.control._index


def _rllm_session(address: str, local: Path) -> tuple[str, str, str, bool, str]:
    """rLLM's call shapes, as its evaluators and harnesses make them (blocking)."""
    with Client(address) as client:
        sb = SandboxdSandbox("task-1", "python:3.11-slim", pool="rl", client=client)
        out = sb.exec("echo ok", timeout=10)
        sb.upload_file(str(local), "/tmp/rllm/solve.sh")
        root = sb.exec("whoami", user="root")
        try:
            sb.exec("exit 3", timeout=10)
            failure = ""
        except RuntimeError as e:  # rLLM's _safe_exec catches RuntimeError
            failure = str(e)
        alive = sb.is_alive()
        sb.close()
        sb.close()
        return out, root, failure, alive and not sb.is_alive(), sb.sandbox_id


async def test_rllm_sandbox(app: App, client: AsyncClient, tmp_path: Path) -> None:
    await client.create_pool("rl", "img", min_ready=1, max_size=2)
    local = tmp_path / "solve.sh"
    local.write_text("echo solved\n")
    out, root, failure, alive_then_dead, sandbox_id = await asyncio.to_thread(
        _rllm_session, app.address, local
    )
    assert (out, root) == ("ok\n", "root\n")
    assert "Command failed (exit 3) in sandbox task-1: exit 3" in failure
    assert alive_then_dead
    assert sandbox_id not in app.control._index


def _rllm_unknown_user(address: str) -> None:
    with Client(address) as client:
        sb = SandboxdSandbox("t", pool="rl", client=client)
        try:
            sb.exec("true", user="agent")
        finally:
            sb.close()


async def test_rllm_unknown_user_fails_like_docker_exec(app: App, client: AsyncClient) -> None:
    await client.create_pool("rl", "img", min_ready=1, max_size=2)
    with pytest.raises(RllmCommandFailed, match="unable to find user agent"):
        await asyncio.to_thread(_rllm_unknown_user, app.address)
    assert not isinstance(
        RllmCommandFailed("x", exit_code=1, stdout="", stderr="", outcome=""), errors.SandboxdError
    )


def _rllm_exec_on(address: str, kill: Callable[[str], None]) -> None:
    with Client(address) as client:
        sb = SandboxdSandbox("doomed", pool="rl", client=client)
        try:
            kill(sb.sandbox_id)
            sb.exec("echo never")
        finally:
            sb.close()


async def test_a_lost_sandbox_is_the_infrastructures_failure(make_app: MakeApp) -> None:
    backend = FakeBackend()
    app = await make_app(backend=backend)
    async with AsyncClient(app.address) as client:
        await client.create_pool("rl", "img", min_ready=1, max_size=2)
        await client.create_pool("slime", "img", min_ready=1, max_size=2)

        def kill(sandbox_id: str) -> None:
            backend.kill(next(h for h, b in backend.sandboxes.items() if b.spec.sandbox_id == sandbox_id))

        # rLLM's _safe_exec catches RuntimeError: a lost sandbox is not one.
        with pytest.raises(errors.SandboxLost):
            await asyncio.to_thread(_rllm_exec_on, app.address, kill)
        async with Sandbox(client, "slime") as sb:
            kill(sb.sandbox_id)
            with pytest.raises(errors.SandboxLost):
                await sb.exec("echo never")


@pytest.mark.parametrize("name", ["miniswe", "prime", "rllm", "slime", "verifiers"])
def test_adapter_modules_export_what_they_claim(name: str) -> None:
    module = importlib.import_module(f"sandboxd.adapters.{name}")
    for exported in module.__all__:
        assert getattr(module, exported, None) is not None, f"{name}.{exported}"
    assert "minisweagent" not in getattr(module, "__dict__", {}), "frameworks are imported only when used"
