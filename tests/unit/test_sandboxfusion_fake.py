"""``/run_code`` end to end on the fake backend: the real server, client and
run-code app, with a backend that answers the run-code steps and runs the
launched commands in the fake shell. What only the fake can stage quickly: a
sandbox killed under a program (also as the engine's race tells it, exit
137 before the container is known to be gone), acquires that cannot be
served, the toolchain check, memory limits, a request still running when the
app closes, and releases refused over a tenant's call rate. The launcher itself
runs on this host (it is plain Python): the output cap."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import shlex
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from sandboxd import errors
from sandboxd.adapters.sandboxfusion import (
    CAPTURE_BYTES,
    POOL_MEMORY_MB,
    WARM,
    command_result,
    ensure_pool,
    make_app,
)
from sandboxd.adapters.sandboxfusion_langs import LANGUAGES
from sandboxd.adapters.sandboxfusion_probes import _LAUNCH, _PYTHON, _STEP, LANDLOCK_ABI, launch
from sandboxd.adapters.sandboxfusion_warm import WarmSandboxes
from sandboxd.backends.base import ExecEvent, ExecOutcome, ExecResult, ExecSpec, OutputChunk
from sandboxd.backends.fake import FakeBackend
from sandboxd.client import AsyncClient
from sandboxd.client import ExecResult as ClientResult
from sandboxd.v1.common_pb2 import SANDBOX_STATE_LEASED
from tests.unit.conftest import MakeApp, wait_for

pytestmark = pytest.mark.timeout(30)

IMAGE = "judge:unit"


class JudgeBackend(FakeBackend):
    """A fake whose sandboxes have ``tools`` and answer the run-code steps; a kill
    (``kill``) cuts a running command short, reported as SANDBOX_LOST or, with
    ``lost_as_exit``, as the engine may report it first: the command exited 137."""

    def __init__(self, *, tools: set[str], lost_as_exit: bool = False) -> None:
        super().__init__()
        self.tools = tools
        self.lost_as_exit = lost_as_exit
        self.commands: list[str] = []
        """Every request command launched, in order."""
        self.tool_lookups = 0
        """Baseline steps that asked which tools the image has."""
        self.user_started = asyncio.Event()
        self.last_handle = ""
        self.scripts: dict[str, str] = {}
        """The sandbox of the last request command."""
        self._killed: dict[str, asyncio.Event] = {}

    def kill(self, handle: str) -> None:
        super().kill(handle)
        self._killed.setdefault(handle, asyncio.Event()).set()

    def _step(self, handle: str, argv: tuple[str, ...], stdin: bytes) -> dict[str, Any]:
        mode = argv[5]
        if mode == "baseline":
            asked = json.loads(argv[7])
            self.tool_lookups += bool(asked)
            tools = sorted(t for t in asked if t in self.tools)
            return {"digest": "d0", "unreadable": 0, "infra": [], "landlock": LANDLOCK_ABI, "tools": tools}
        if mode == "setup":
            files = json.loads(stdin or b"{}")
            self.scripts[handle] = base64.b64decode(files.get("main.sh", "")).decode()
            return {}
        return {"survivors": 0, "files": {}, "removed": True, "digest": "d0"}

    async def exec(self, handle: str, spec: ExecSpec) -> AsyncIterator[ExecEvent]:
        argv = spec.argv
        box = self.sandboxes.get(handle)
        if argv[:4] == tuple(_PYTHON) and argv[4] == _STEP and box is not None and box.running:
            yield OutputChunk(1, json.dumps(self._step(handle, argv, spec.stdin)).encode())
            yield ExecResult(ExecOutcome.EXITED, 0, 0.0)
            return
        if argv[:4] != tuple(_PYTHON) or argv[4] != _LAUNCH:
            async for event in super().exec(handle, spec):
                yield event
            return
        self.commands.append(argv[5])
        self.last_handle = handle
        # The fake shell runs a bash request's script itself (it has no bash).
        shell = self.scripts.get(handle, "") if argv[5] == LANGUAGES["bash"].run else argv[5]
        self.user_started.set()
        killed = self._killed.setdefault(handle, asyncio.Event())
        events: list[ExecEvent] = []

        async def collect() -> None:
            async for event in FakeBackend.exec(self, handle, replace(spec, argv=(), shell=shell)):
                events.append(event)

        command = asyncio.ensure_future(collect())
        kill = asyncio.ensure_future(killed.wait())
        await asyncio.wait({command, kill}, return_when=asyncio.FIRST_COMPLETED)
        kill.cancel()
        if not command.done():
            command.cancel()
            await asyncio.gather(command, kill, return_exceptions=True)
            if self.lost_as_exit:
                # The command's stream ended with its death by the container's kill.
                yield ExecResult(ExecOutcome.EXITED, 137, 0.0)
            else:
                yield ExecResult(
                    ExecOutcome.SANDBOX_LOST, -1, 0.0, detail="the sandbox stopped", sandbox_gone=True
                )
            return
        await asyncio.gather(kill, return_exceptions=True)
        for event in events:
            yield event


@dataclass
class Served:
    url: str
    app: web.Application
    backend: JudgeBackend
    client: AsyncClient
    http: aiohttp.ClientSession

    async def run(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        async with self.http.post(f"{self.url}/run_code", json=body) as r:
            answer: dict[str, Any] = await r.json()
            return r.status, answer


@contextlib.asynccontextmanager
async def _serve(
    make_app_: MakeApp, backend: JudgeBackend, *, pool: str = "judge", **kwargs: Any
) -> AsyncIterator[Served]:
    app = await make_app_(backend=backend)
    async with AsyncClient(app.address) as client, aiohttp.ClientSession() as http:
        wapp = make_app(client, pool, **kwargs)
        runner = web.AppRunner(wapp)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            yield Served(f"http://127.0.0.1:{port}", wapp, backend, client, http)
        finally:
            await runner.cleanup()


@pytest.fixture
async def served(make_app: MakeApp, request: pytest.FixtureRequest) -> AsyncIterator[Served]:
    lost_as_exit = bool(getattr(request, "param", False))
    backend = JudgeBackend(tools={"python", "bash"}, lost_as_exit=lost_as_exit)
    async with _serve(make_app, backend, acquire_timeout=5.0) as s:
        limits = {"memory_bytes": 512 << 20}
        await s.client.create_pool("judge", IMAGE, min_ready=1, max_size=4, limits=limits)
        yield s


async def test_a_program_runs_on_the_fake(served: Served) -> None:
    status, answer = await served.run({"code": "echo hi; exit 3", "language": "bash"})
    assert status == 200 and answer["status"] == "Failed", answer
    assert answer["run_result"]["return_code"] == 3 and answer["run_result"]["stdout"] == "hi\n"


@pytest.mark.parametrize("served", [False, True], ids=["lost", "lost-told-as-exit-137"], indirect=True)
async def test_a_sandbox_lost_under_the_program_is_sandbox_error(served: Served) -> None:
    call = asyncio.ensure_future(served.run({"code": "sleep 30", "language": "bash", "run_timeout": 60}))
    await asyncio.wait_for(served.backend.user_started.wait(), 10)
    sandbox_id = served.app[WARM].in_use()[0]
    served.backend.kill(
        next(h for h, b in served.backend.sandboxes.items() if b.spec.sandbox_id == sandbox_id)
    )
    status, answer = await asyncio.wait_for(call, 20)
    assert status == 200 and answer["status"] == "SandboxError", answer
    # Never the program's failure: no exit status of a program that did not end by itself.
    assert answer["run_result"]["status"] == "Error" and answer["run_result"]["return_code"] is None, answer
    assert "lost" in answer["message"] or "stopped" in answer["message"], answer
    # The lost sandbox is not kept: the next request runs in another.
    await wait_for(lambda: served.app[WARM].destroyed >= 1, what="the lost sandbox to be let go")
    _, again = await served.run({"code": "echo ok", "language": "bash"})
    assert again["status"] == "Success", again


async def test_an_acquire_that_cannot_be_served_is_sandbox_error(make_app: MakeApp) -> None:
    backend = JudgeBackend(tools={"bash"})
    async with _serve(make_app, backend, pool="missing", acquire_timeout=2.0) as served:
        status, answer = await served.run({"code": "echo hi", "language": "bash"})
        assert status == 200 and answer["status"] == "SandboxError", answer
        assert "could not acquire" in answer["message"] and answer["run_result"] is None, answer


async def test_a_queue_wait_past_the_budget_is_504(make_app: MakeApp) -> None:
    backend = JudgeBackend(tools={"bash"})
    async with _serve(make_app, backend, pool="one", acquire_timeout=0.3) as served:
        await served.client.create_pool("one", IMAGE, min_ready=1, max_size=1)
        lease = await served.client.lease("one", timeout=5)
        try:
            status, answer = await served.run({"code": "echo hi", "language": "bash"})
            assert status == 504 and "no sandbox within" in answer["detail"], answer
        finally:
            await lease.release()
        # Once the pool has room again the same request is served.
        status, answer = await served.run({"code": "echo hi", "language": "bash"})
        assert status == 200 and answer["status"] == "Success", answer


async def test_a_language_without_its_toolchain_is_sandbox_error(served: Served) -> None:
    warm = served.app[WARM]
    for _ in range(2):
        status, answer = await served.run({"code": 'println("x")', "language": "julia"})
        assert status == 200 and answer["status"] == "SandboxError", answer
        assert "julia" in answer["message"] and "Debian" in answer["message"], answer
        assert answer["run_result"] is None and answer["compile_result"] is None
    assert not any("julia" in c for c in served.backend.commands), served.backend.commands
    # Known from the first sandbox prepared: the second request took none.
    leased, taken = warm.stats.leased, warm.stats.from_reserve + warm.stats.waited + warm.stats.reused
    _, answer = await served.run({"code": "x", "language": "swift"})
    assert answer["status"] == "SandboxError" and "swiftc" in answer["message"], answer
    assert (warm.stats.leased, warm.stats.from_reserve + warm.stats.waited + warm.stats.reused) == (
        leased,
        taken,
    )
    # The image was asked once for its tools, however many of its sandboxes were prepared.
    _, ok = await served.run({"code": "echo ok", "language": "bash"})
    assert ok["status"] == "Success", ok
    assert served.backend.tool_lookups == 1


async def test_memory_above_the_pools_limit_is_refused_not_clamped(served: Served) -> None:
    status, above = await served.run({"code": "echo hi", "language": "bash", "memory_limit_MB": 1024})
    assert status == 200 and above["status"] == "SandboxError", above
    assert "1024" in above["message"] and "512 MiB" in above["message"], above
    assert not served.backend.commands, "nothing ran"
    for mb, expect in ((512, 512 << 20), (256, 256 << 20), (-1, 512 << 20), (4, 16 << 20)):
        served.backend.commands.clear()
        _, answer = await served.run({"code": "echo hi", "language": "bash", "memory_limit_MB": mb})
        assert answer["status"] == "Success", (mb, answer)
        box = served.backend.sandboxes[served.backend.last_handle]
        # Per-acquire limits are set on the sandbox; the pool's own are its spec's.
        limit = box.limits.memory_bytes if box.limits else box.spec.limits.memory_bytes
        assert limit == expect, (mb, limit)


async def test_the_run_code_pool_covers_verls_default_memory(make_app: MakeApp) -> None:
    backend = JudgeBackend(tools={"bash"})
    async with _serve(make_app, backend, pool="created") as served:
        assert POOL_MEMORY_MB == 1024
        limit = await ensure_pool(served.client, "created", IMAGE, min_ready=1, max_size=2)
        assert limit == 1024 << 20
        # Existing: left as it is.
        assert await ensure_pool(served.client, "created", IMAGE, memory_mb=4096) == 1024 << 20
        _, answer = await served.run({"code": "echo hi", "language": "bash", "memory_limit_MB": 1024})
        assert answer["status"] == "Success", answer


def _launched(code: str, capture: int) -> subprocess.CompletedProcess[bytes]:
    command = f"{sys.executable} -c {shlex.quote(code)}"
    return subprocess.run(launch(command, confine=False, capture=capture), capture_output=True, timeout=20)


def test_the_launcher_keeps_the_first_part_and_the_programs_own_end() -> None:
    # 3 MiB on stdout and 2 MiB on stderr, then its own status: SandboxFusion
    # keeps the first MiB of each and reports the program's exit.
    code = (
        "import sys\nsys.stdout.write('a' * (3 << 20)); sys.stdout.flush()\n"
        "sys.stderr.write('b' * (2 << 20)); sys.stderr.flush()\nprint('end', file=sys.stderr)\nsys.exit(3)"
    )
    done = _launched(code, CAPTURE_BYTES)
    assert done.returncode == 3
    assert done.stdout == b"a" * CAPTURE_BYTES and done.stderr == b"b" * CAPTURE_BYTES
    small = _launched("print('hi'); import sys; sys.exit(0)", CAPTURE_BYTES)
    assert (small.returncode, small.stdout, small.stderr) == (0, b"hi\n", b"")
    # A death by a signal is the shell's 128 + n, as before the relay.
    killed = _launched("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", CAPTURE_BYTES)
    assert killed.returncode == 128 + 11


def test_the_launcher_answers_when_the_program_ends_not_its_children() -> None:
    # A background child that keeps the pipes open does not hold the answer.
    code = "import os, time\nif os.fork() == 0:\n    time.sleep(20)\nprint('parent done')"
    done = _launched(code, CAPTURE_BYTES)
    assert done.returncode == 0 and done.stdout == b"parent done\n"


def test_output_past_sandboxds_own_bound_is_a_time_limit_not_137() -> None:
    cut = ClientResult(outcome="OUTPUT_TRUNCATED", exit_code=-1, stdout=b"a", stderr=b"", duration=1.0)
    answer = command_result(cut)
    assert answer["status"] == "TimeLimitExceeded" and answer["return_code"] is None, answer


async def test_close_releases_the_sandbox_of_a_request_still_running(served: Served) -> None:
    # The HTTP server waits a while for requests at shutdown, then closes the app
    # under those still running: their sandboxes must not outlive it, on the server.
    call = asyncio.ensure_future(served.run({"code": "sleep 3", "language": "bash", "run_timeout": 10}))
    await asyncio.wait_for(served.backend.user_started.wait(), 10)
    assert served.app[WARM].in_use()
    await served.app[WARM].close()
    leased = await served.client.list_sandboxes("judge", state=SANDBOX_STATE_LEASED)
    assert not leased, [s.id for s in leased]
    # The request still gets its answer (the fake backend lets the command finish).
    status, answer = await asyncio.wait_for(call, 20)
    assert status == 200 and answer["status"] == "Success", answer
    assert served.app[WARM].destroyed == 1


async def test_close_retries_releases_refused_over_the_tenants_call_rate(make_app: MakeApp) -> None:
    # A busy tenant's releases at shutdown are refused RESOURCE_EXHAUSTED (with a
    # retry hint): each must be retried, not left to its lease's TTL.
    app = await make_app(
        backend=JudgeBackend(tools={"bash"}), tenants={"t": {"token": "tk", "requests_per_second": 4}}
    )
    async with AsyncClient(app.address, token="tk") as client:
        await client.create_pool("judge", IMAGE, min_ready=2, max_size=4)
        warm = WarmSandboxes(client, "judge", reserve=2)
        warm.start()
        await wait_for(lambda: warm.idle() == 2, timeout=20, what="the reserve to be prepared")
        with pytest.raises(errors.ResourceExhausted):
            for _ in range(20):
                await client.list_pools()
        await warm.close()
        assert warm.destroyed == 2
        assert not app.control.leases.all(), app.control.leases.all()
