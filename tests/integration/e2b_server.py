"""sandboxd's E2B API as the tests serve it to the unchanged ``e2b`` SDK:
inside ``sandboxd serve --e2b-port`` as a process of its own (in the test's
own loop it is ``tests.served``), and the SDK's settings that point it
there."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import docker
import pytest

from sandboxd.client import AsyncClient
from tests.integration.conftest import instance_containers, poll

__all__ = ["point_sdk", "sdk_env", "serve_process"]


def sdk_env(url: str, key: str) -> dict[str, str]:
    """The SDK's settings that send both its API and its sandboxes' calls to ``url``."""
    return {"E2B_API_URL": url, "E2B_SANDBOX_URL": url, "E2B_API_KEY": key}


def point_sdk(monkeypatch: pytest.MonkeyPatch, url: str, key: str) -> None:
    """This process's SDK pointed at ``url`` (none of its debug or domain settings left to override it)."""
    for name, value in sdk_env(url, key).items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("E2B_DEBUG", raising=False)
    monkeypatch.delenv("E2B_DOMAIN", raising=False)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.asynccontextmanager
async def serve_process(
    engine: docker.DockerClient, tmp_path: Path, instance: str, e2b_args: list[str], up_timeout: float = 60.0
) -> AsyncIterator[tuple[AsyncClient, str]]:
    """``sandboxd serve --e2b-port`` with ``e2b_args``, of instance
    ``instance``, as a process logging to ``tmp_path``/serve.log; a client of
    its gRPC API and its E2B API's URL. At the end it is stopped, and it must
    have exited 0 and left no container of its instance behind."""
    grpc_port, e2b_port = _free_port(), _free_port()
    log_path = tmp_path / "serve.log"
    cmd = [
        sys.executable, "-m", "sandboxd.cli", "serve", "--port", str(grpc_port), "--instance", instance,
        "--state-dir", str(tmp_path / "state"), "--e2b-port", str(e2b_port), *e2b_args,
    ]  # fmt: skip
    with log_path.open("wb") as log:
        proc = await asyncio.create_subprocess_exec(*cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        async with AsyncClient(f"127.0.0.1:{grpc_port}") as client:

            async def up() -> bool:
                try:
                    await client.list_pools()
                except Exception:
                    return proc.returncode is not None
                return True

            await poll(up, up_timeout, "the server to answer")
            assert proc.returncode is None, log_path.read_text()
            yield client, f"http://127.0.0.1:{e2b_port}"
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 60)
        left = await asyncio.to_thread(instance_containers, engine, instance)
        for c in left:
            await asyncio.to_thread(c.remove, force=True)
    assert proc.returncode == 0, log_path.read_text()
    assert not left, [c.name for c in left]
