"""The run-code app's warm sandboxes at close: every sandbox it leased is
released before close() returns, whatever step it was in (a clean-up, a
preparation, a lease being granted). The server's own test harness checks
for leftover containers the moment the app is closed, as an operator's
shutdown would. The client is a stand-in here: what is under test is the
bookkeeping of WarmSandboxes, not the server (the Docker suite runs it
against a real one)."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import pytest

from sandboxd.adapters.sandboxfusion_probes import LANDLOCK_ABI
from sandboxd.adapters.sandboxfusion_warm import WarmSandboxes
from sandboxd.client import ExecResult

pytestmark = pytest.mark.timeout(10)

# What the baseline step and the clean-up step answer, in one (each reads its own keys).
STEP_ANSWER = {
    "landlock": LANDLOCK_ABI,
    "unreadable": [],
    "digest": "d0",
    "infra": [],
    "survivors": 0,
    "removed": True,
}


class _Sandbox:
    def __init__(self, sid: str, steps: _Client) -> None:
        self.id = sid
        self.info = SimpleNamespace(image="img")
        self._steps = steps

    async def exec(self, argv: list[str], **_: Any) -> ExecResult:
        answer = await self._steps.step(self.id)
        return ExecResult(
            outcome="EXITED", exit_code=0, stdout=json.dumps(answer).encode(), stderr=b"", duration=0.0
        )


class _Lease:
    def __init__(self, client: _Client, sandbox: _Sandbox) -> None:
        self._client = client
        self._sandbox = sandbox

    def __getitem__(self, i: int) -> _Sandbox:
        return self._sandbox

    async def heartbeat(self, ttl: float = 0.0) -> None:
        return None

    async def release(self) -> None:
        # A real release is an RPC: it takes loop turns.
        for _ in range(3):
            await asyncio.sleep(0)
        self._client.released.append(self._sandbox.id)


class _Client:
    """Leases numbered sandboxes; a step waits on ``hold`` once ``blocking`` is set."""

    def __init__(self) -> None:
        self.leased: list[str] = []
        self.released: list[str] = []
        self.blocking = False
        self.hold = asyncio.Event()
        self.step_started = asyncio.Event()

    async def lease(self, pool: str, **_: Any) -> _Lease:
        sid = f"sb-{len(self.leased)}"
        self.leased.append(sid)
        return _Lease(self, _Sandbox(sid, self))

    async def step(self, sid: str) -> dict[str, Any]:
        if self.blocking:
            self.step_started.set()
            await self.hold.wait()
        return STEP_ANSWER


async def test_close_releases_a_sandbox_whose_clean_up_it_cut_short() -> None:
    client = _Client()
    warm = WarmSandboxes(client, "p", reserve=0)  # type: ignore[arg-type]
    slot = await warm.take(0, timeout=5)
    client.blocking = True
    warm.give_back(slot, clean=True, top="/tmp/sf-x")
    await asyncio.wait_for(client.step_started.wait(), 5)
    await warm.close()
    assert sorted(client.released) == sorted(client.leased) == ["sb-0"]


async def test_close_releases_a_sandbox_it_was_preparing() -> None:
    client = _Client()
    client.blocking = True
    warm = WarmSandboxes(client, "p", reserve=1)  # type: ignore[arg-type]
    warm.start()
    await asyncio.wait_for(client.step_started.wait(), 5)
    await warm.close()
    assert client.leased and sorted(client.released) == sorted(client.leased)
