"""The run-code app's warm sandboxes at close: every sandbox it leased is
released before close() returns, whatever step it was in (a clean-up, a
preparation, a lease being granted, a heartbeat that failed) and however its
release went (refused at first by a busy server). The server's own test
harness checks for leftover containers the moment the app is closed, as an
operator's shutdown would. The client is a stand-in here: what is under test
is the bookkeeping of WarmSandboxes, and these schedules (a task cancelled in
the very loop turn it was created, a release answered UNAVAILABLE) cannot be
forced on a real server (test_sandboxfusion_fake runs the same paths on one,
the Docker suite on the real engine)."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import pytest

from sandboxd import errors
from sandboxd.adapters.sandboxfusion_probes import LANDLOCK_ABI
from sandboxd.adapters.sandboxfusion_warm import WarmSandboxes
from sandboxd.client import ExecResult
from tests.unit.conftest import wait_for

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
        self.id = f"lease-{sandbox.id}"

    def __getitem__(self, i: int) -> _Sandbox:
        return self._sandbox

    async def heartbeat(self, ttl: float = 0.0) -> None:
        self._client.heartbeats += 1
        if self._client.refuse_heartbeats:
            raise errors.TransientBackendError("the server is busy")

    async def release(self) -> None:
        # A real release is an RPC: it takes loop turns.
        for _ in range(3):
            await asyncio.sleep(0)
        if self._client.refuse_releases:
            self._client.refuse_releases -= 1
            raise errors.TransientBackendError("the server is busy")
        if self._sandbox.id in self._client.released:
            raise errors.NotFound(f"lease {self.id} not found")
        self._client.released.append(self._sandbox.id)


class _Client:
    """Leases numbered sandboxes; a step waits on ``hold`` once ``blocking`` is set."""

    def __init__(self) -> None:
        self.leased: list[str] = []
        self.released: list[str] = []
        self.blocking = False
        self.hold = asyncio.Event()
        self.step_started = asyncio.Event()
        self.refuse_releases = 0
        """Releases answered UNAVAILABLE before one is served."""
        self.refuse_heartbeats = False
        self.heartbeats = 0
        self.grant: asyncio.Event | None = None
        """When set, a lease is granted only once this event is."""
        self.asked = asyncio.Event()

    async def lease(self, pool: str, **_: Any) -> _Lease:
        self.asked.set()
        if self.grant is not None:
            await self.grant.wait()
        sid = f"sb-{len(self.leased)}"
        self.leased.append(sid)
        return _Lease(self, _Sandbox(sid, self))

    async def wait_background(self) -> None:
        return None

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


async def test_close_releases_a_sandbox_given_back_as_it_closes() -> None:
    # The request's end and the app's close in one loop turn: the clean-up task
    # is cancelled before its first step, so none of its own code runs.
    client = _Client()
    warm = WarmSandboxes(client, "p", reserve=0)  # type: ignore[arg-type]
    slot = await warm.take(0, timeout=5)
    warm.give_back(slot, clean=True, top="/tmp/sf-x")
    await warm.close()
    assert sorted(client.released) == sorted(client.leased) == ["sb-0"]


async def test_close_releases_a_lease_granted_in_the_turn_it_cancels_its_preparation() -> None:
    client = _Client()
    client.grant = asyncio.Event()
    warm = WarmSandboxes(client, "p", reserve=1)  # type: ignore[arg-type]
    warm.start()
    await asyncio.wait_for(client.asked.wait(), 5)
    client.grant.set()
    # One loop turn, not a wait for a condition: the reserve's acquire returns and
    # starts the preparation task, whose first step comes after close()'s cancel.
    await asyncio.sleep(0)
    await warm.close()
    assert client.leased == ["sb-0"] and client.released == ["sb-0"]


async def test_close_retries_a_release_the_server_could_not_answer() -> None:
    client = _Client()
    warm = WarmSandboxes(client, "p", reserve=0)  # type: ignore[arg-type]
    slot = await warm.take(0, timeout=5)
    warm.put_back(slot)
    client.refuse_releases = 2
    await warm.close()
    assert client.released == client.leased == ["sb-0"] and client.refuse_releases == 0


async def test_close_releases_a_sandbox_still_serving_a_request() -> None:
    # A request the HTTP server stopped waiting for at shutdown still holds its sandbox.
    client = _Client()
    warm = WarmSandboxes(client, "p", reserve=0)  # type: ignore[arg-type]
    slot = await warm.take(0, timeout=5)
    await warm.close()
    assert client.released == client.leased == ["sb-0"]
    # Its end, later, releases nothing twice.
    warm.give_back(slot, clean=True, top="/tmp/sf-x")
    assert warm.destroyed == 1


async def test_an_idle_sandbox_whose_heartbeat_fails_is_released_not_forgotten() -> None:
    client = _Client()
    warm = WarmSandboxes(client, "p", reserve=1, lease_ttl=0.3)  # type: ignore[arg-type]
    warm.start()
    await wait_for(lambda: warm.idle() == 1, what="the reserve to be prepared")
    client.refuse_heartbeats = True
    await wait_for(lambda: "sb-0" in client.released, what="the sandbox to be released")
    await warm.close()
    assert sorted(client.released) == sorted(client.leased)
