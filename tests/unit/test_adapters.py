"""The framework adapters over gRPC on the fake backend."""

from __future__ import annotations

import pytest

from sandboxd.adapters.slime import CommandFailed, Sandbox
from sandboxd.adapters.verifiers import SandboxdRuntime
from sandboxd.app import App
from sandboxd.client import AsyncClient

pytestmark = pytest.mark.timeout(30)


async def test_slime_style_sandbox(app: App, client: AsyncClient) -> None:
    await client.create_pool("slime", "img", min_ready=1, max_size=2)
    async with Sandbox(client, "slime", labels={"run": "s"}) as sb:
        await sb.write_file("notes.txt", "hello")
        assert await sb.read_file("notes.txt") == "hello"
        out = await sb.exec("cat notes.txt", idempotent=True)
        assert (out.exit_code, out.stdout, out.outcome) == (0, "hello", "EXITED")
        failed = await sb.exec("false")
        assert failed.exit_code == 1
        with pytest.raises(CommandFailed, match="false"):
            await sb.exec("false", check=True)
        sandbox_id = sb.sandbox.id
    assert sandbox_id not in app.control._index, "leaving the context releases the sandbox"
    with pytest.raises(RuntimeError, match="async with"):
        await Sandbox(client, "slime").exec("true")


async def test_verifiers_style_runtime(app: App, client: AsyncClient) -> None:
    await client.create_pool("vf", "img", min_ready=2, max_size=4)
    runtime = SandboxdRuntime(client, "vf")
    a = await runtime.create_sandbox(labels={"task": "t1"})
    b = await runtime.create_sandbox()
    assert a != b
    await runtime.upload_file(a, "answer.txt", "42")
    result = await runtime.execute_command(a, "cat answer.txt", working_dir="/workspace")
    assert (result.stdout, result.exit_code) == ("42", 0)
    assert await runtime.read_file(a, "answer.txt") == b"42"
    await runtime.heartbeat(a)
    await runtime.delete_sandbox(a)
    assert a not in app.control._index
    await runtime.close()
    assert b not in app.control._index
