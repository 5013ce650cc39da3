"""A gVisor sandbox removed while the control plane still has engine
streams open in it. Docker (20.10, runsc) never ends an exec stream of a
container it has removed, so the backend cuts them itself: a command in
flight is answered, and neither its kill nor the server's shutdown waits
on a stream that will not end."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import docker
import pytest

from sandboxd.backends.base import GVISOR
from sandboxd.client import AsyncClient, ExecResult
from sandboxd.errors import SandboxdError
from tests.integration.conftest import NO_GVISOR, gvisor_registered, make_settings, running_app

pytestmark = [pytest.mark.docker, pytest.mark.timeout(240)]


@pytest.mark.parametrize("kind", ["root", "session"])
async def test_a_command_in_a_released_gvisor_sandbox_is_answered(
    tmp_path: Path, engine: docker.DockerClient, image: str, kind: str
) -> None:
    if not gvisor_registered(engine):
        pytest.skip(NO_GVISOR)
    kwargs: dict[str, Any] = {"user": "root"} if kind == "root" else {"session": "s"}
    started = time.monotonic()
    async with running_app(make_settings(tmp_path), engine) as app, AsyncClient(app.address) as client:
        await client.create_pool("gv", image, min_ready=1, max_size=2, runtime=GVISOR)
        async with client.acquire("gv") as sb:
            answer: ExecResult | Exception | None = None
            try:
                async for event, value in sb.exec_stream("echo started; sleep 120", timeout=150, **kwargs):
                    if event == "stdout" and value == b"started\n":
                        await sb.release()
                    elif event == "result":
                        answer = value
            except SandboxdError as e:
                answer = e
            assert answer is not None
            if isinstance(answer, ExecResult):
                assert answer.outcome == "SANDBOX_LOST", answer
        await client.delete_pool("gv", force=True)
    # Far below the command's 120 s: nothing waited for the stream to end.
    assert time.monotonic() - started < 100
