"""A SandboxFusion-compatible HTTP server (aiohttp): ``POST /run_code`` and
``GET /v1/ping``, so verl, SkyRL and PipelineRL code that speaks SandboxFusion
runs unchanged against sandboxd.

Statuses mean what SandboxFusion's ``parse_run_status`` makes them mean:
``SandboxError`` only for the service's own failures (a sandbox lost under a
command, an acquire that cannot be served, a language whose toolchain the
image lacks, a memory limit above the pool's), ``Failed`` for a compile
error, a non-zero exit or a time-out, ``Success`` otherwise. At most as
many requests run their programs at once as the sandbox host has CPUs (the
others queue, their time limits not yet started: sandboxfusion_admission); a
wait for a sandbox and a run slot past ``acquire_timeout`` answers HTTP 504,
the one status verl retries. Output is kept as SandboxFusion keeps it: the first MiB of each
stream, the program running on to its own end and status. Sandboxes are
prepared ahead of requests and reused between them under the rules of
sandboxd.adapters.sandboxfusion_warm.

    sandboxd run-code --target 127.0.0.1:50051 --pool code-judge --port 8080
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import logging
import math
from typing import Any

from aiohttp import web

from sandboxd import errors
from sandboxd.adapters.sandboxfusion_admission import RunSlots, host_cpus
from sandboxd.adapters.sandboxfusion_langs import (
    LANGUAGES,
    UNPACKAGED,
    Runner,
    prepare_source,
    runner_for,
)
from sandboxd.adapters.sandboxfusion_probes import LAUNCH_FAILED, clean_command, launch, setup_command
from sandboxd.adapters.sandboxfusion_request import RunCodeArgs, parse_request
from sandboxd.adapters.sandboxfusion_warm import (
    CLEAN_OUTCOMES,
    STEP_TIMEOUT,
    Slot,
    StepFailed,
    WarmSandboxes,
    run_step,
)
from sandboxd.client import AsyncClient, ExecResult

__all__ = [
    "CAPTURE_BYTES",
    "POOL_MEMORY_MB",
    "SLOTS",
    "WARM",
    "RunCodeArgs",
    "command_result",
    "ensure_pool",
    "make_app",
    "parse_request",
    "run_status",
    "serve",
]

log = logging.getLogger(__name__)

CAPTURE_BYTES = 1 << 20
"""Bytes of each of a command's streams kept: SandboxFusion's (its
get_output_non_blocking reads ``fd.read(1024 * 1024)`` of each once the
process ended). The rest is dropped and the program runs on."""
POOL_MEMORY_MB = 1024
"""Memory limit of the pool ``sandboxd run-code --image`` creates: verl's default
``memory_limit_MB``, which a smaller pool would refuse."""
# What an exec may write past the launcher's two capped streams before
# sandboxd itself stops it: only a program that writes around the launcher
# (to its stdout by /proc) gets there.
_OUTPUT_SLACK = 1 << 20
# The smallest memory limit an acquire may set (sandboxd's own floor).
_MIN_MEMORY = 16 << 20
# Exit statuses above this are deaths by a signal (128 + n), as a sandbox's
# death gives its processes: only those are checked against the sandbox.
_SIGNALLED = 128
# Ends that cannot come from a lost sandbox, or already say it was lost.
_NOT_CHECKED = frozenset({"SANDBOX_LOST", "KILLED", "TIMED_OUT"})


def command_result(result: ExecResult) -> dict[str, Any]:
    """A SandboxFusion ``CommandRunResult`` for one command's outcome."""
    text = {
        "stdout": result.stdout.decode(errors="replace"),
        "stderr": result.stderr.decode(errors="replace"),
    }
    if result.outcome in ("TIMED_OUT", "OUTPUT_TRUNCATED"):
        # SandboxFusion kills the command and reports no return code. A program
        # that writes past sandboxd's own output bound (around the launcher, which
        # drops what is past the capture cap) is stopped there and answered the
        # way SandboxFusion answers a program that never stops writing: its pipe
        # fills, it blocks, and its time runs out.
        return {"status": "TimeLimitExceeded", "execution_time": result.duration, "return_code": None, **text}
    if result.outcome in ("SANDBOX_LOST", "KILLED"):
        return {
            "status": "Error",
            "execution_time": None,
            "return_code": None,
            "stdout": text["stdout"],
            "stderr": result.detail or f"sandbox failure: {result.outcome}",
        }
    # Exits, output caps and memory, pid, file or disk limits are the
    # program's doing: it finished, with the status its end gave it.
    code = result.exit_code if result.outcome == "EXITED" or result.exit_code else 137
    return {"status": "Finished", "execution_time": result.duration, "return_code": code, **text}


def run_status(compile_result: dict[str, Any] | None, run_result: dict[str, Any] | None) -> tuple[str, str]:
    """SandboxFusion's ``parse_run_status``: (status, message)."""
    results = [r for r in (compile_result, run_result) if r is not None]
    for r in results:
        if r["status"] == "Error":
            return "SandboxError", r.get("stderr") or ""
    if any(r["status"] == "TimeLimitExceeded" for r in results):
        return "Failed", ""
    if any(r.get("return_code") not in (None, 0) for r in results):
        return "Failed", ""
    return "Success", ""


def _response(
    status: str,
    message: str,
    compile_result: Any = None,
    run_result: Any = None,
    files: dict[str, str] | None = None,
) -> web.Response:
    return web.json_response(
        {
            "status": status,
            "message": message,
            "compile_result": compile_result,
            "run_result": run_result,
            "executor_pod_name": None,
            "files": files or {},
        }
    )


WARM = web.AppKey("warm", WarmSandboxes)
SLOTS = web.AppKey("slots", RunSlots)


class RunCode:
    """Serves one ``/run_code`` request at a time per sandbox, over ``WarmSandboxes``."""

    def __init__(
        self,
        warm: WarmSandboxes,
        *,
        acquire_timeout: float,
        capture: int = CAPTURE_BYTES,
        slots: RunSlots | None = None,
    ) -> None:
        self.warm = warm
        self.acquire_timeout = acquire_timeout
        self.capture = capture
        self.slots = slots or RunSlots(-1)
        """Admission of programs to the host's CPUs (sandboxfusion_admission)."""

    async def _user(
        self, slot: Slot, command: str, top: str, timeout: float, stdin: str | None
    ) -> ExecResult:
        result = await slot.sandbox.exec(
            # Confined where the sandbox is reused, so the clean-up cannot be subverted.
            launch(command, confine=slot.reusable, capture=self.capture),
            cwd=f"{top}/w",
            env={"HOME": f"{top}/h"},
            # sandboxd reads 0 as "no time-out"; SandboxFusion's 0 expires at once.
            timeout=max(timeout, 0.001),
            stdin=stdin or "",
            # The launcher passes on at most ``capture`` bytes of each stream.
            output_limit=2 * self.capture + _OUTPUT_SLACK,
        )
        if result.outcome in _NOT_CHECKED or (result.outcome == "EXITED" and result.exit_code <= _SIGNALLED):
            return result
        return await self._unless_lost(slot, result)

    @staticmethod
    async def _unless_lost(slot: Slot, result: ExecResult) -> ExecResult:
        """``result`` of a command killed by a signal or a limit, or SANDBOX_LOST if the
        sandbox itself is gone. A killed container takes its processes with it, and
        the engine may tell that as their exit status (137) before it knows the
        container stopped: one more exec, only after such an end, tells which."""
        try:
            probe = await slot.sandbox.exec(["true"], timeout=STEP_TIMEOUT, cwd="/")
        except errors.SandboxdError as e:
            detail = e.message
        else:
            if probe.outcome != "SANDBOX_LOST":
                return result
            detail = probe.detail or "the sandbox stopped"
        return dataclasses.replace(
            result,
            outcome="SANDBOX_LOST",
            exit_code=-1,
            detail=f"the sandbox was lost under the program: {detail}",
        )

    def _unavailable(self, language: str, tool: str, image: str = "") -> web.Response:
        why = UNPACKAGED.get(language)
        message = (
            f"language {language!r} is not available here: the sandbox image"
            f"{f' {image}' if image else ''} has no {tool!r}{f' ({why})' if why else ''}"
        )
        return _response("SandboxError", message)

    async def handle(self, args: RunCodeArgs) -> web.Response:
        """Runs one validated request and answers SandboxFusion's response."""
        runner = runner_for(args.language, args.code, args.files)
        if isinstance(runner, str):
            if args.language == "scala":
                compile_error = {
                    "status": "Error",
                    "execution_time": None,
                    "return_code": 1,
                    "stdout": None,
                    "stderr": runner,
                }
                return _response("SandboxError", runner, compile_result=compile_error)
            return _response("SandboxError", runner)
        # Known once a sandbox of the pool's image was prepared: then no sandbox is taken.
        if runner.tool and self.warm.has_tool(runner.tool) is False:
            return self._unavailable(args.language, runner.tool)
        # One deadline for every wait of the request: for a sandbox, then a run slot.
        deadline = asyncio.get_running_loop().time() + self.acquire_timeout
        memory = await self._memory(args.memory_limit_MB)
        if isinstance(memory, web.Response):
            return memory
        try:
            slot = await self.warm.take(memory, self.acquire_timeout)
        except errors.DeadlineExceeded as e:
            # verl retries exactly this status; the body says why.
            return web.json_response(
                {"detail": f"no sandbox within {self.acquire_timeout:g}s: {e.message}"}, status=504
            )
        except errors.InvalidArgument as e:
            # With a memory limit: the pool's own was not known here; the server's
            # refusal names it.
            what = f"memory_limit_MB {args.memory_limit_MB}" if memory else "the request"
            return _response("SandboxError", f"{what} cannot be served: {e.message}")
        except errors.SandboxdError as e:
            return _response("SandboxError", f"could not acquire a sandbox: {e.message}")
        except StepFailed as e:
            return _response("SandboxError", f"could not prepare a sandbox: {e}")
        image = slot.sandbox.info.image
        if runner.tool and self.warm.has_tool(runner.tool, image) is False:
            self.warm.put_back(slot)
            return self._unavailable(args.language, runner.tool, image)
        admitted = False
        try:
            async with self.slots.hold(deadline):
                admitted = True
                return await self._served(slot, runner, args)
        except errors.ResourceExhausted as e:
            if admitted:
                raise
            return web.json_response(
                {"detail": f"no run slot within {self.acquire_timeout:g}s: {e.message}"},
                status=504,
                headers={"Retry-After": str(math.ceil(e.retry_after or 1))},
            )
        finally:
            if not admitted:
                # Refused or cancelled in the queue: nothing of the request reached the sandbox.
                self.warm.put_back(slot)

    async def _served(self, slot: Slot, runner: Runner, args: RunCodeArgs) -> web.Response:
        """The answer of a request that holds its sandbox and run slot."""
        top = slot.new_top()
        clean = cleaned = False
        try:
            response, clean, cleaned = await self._run(slot, runner, args, top)
            return response
        except (errors.SandboxdError, StepFailed) as e:
            message = e.message if isinstance(e, errors.SandboxdError) else str(e)
            return _response("SandboxError", f"sandbox failure: {message}")
        finally:
            self.warm.give_back(slot, clean=clean, top=top, cleaned=cleaned)

    async def _memory(self, memory_mb: int) -> int | web.Response:
        """The memory limit a request's sandbox is acquired with (0: the pool's own), or
        the answer to a request above the pool's limit: never silently less than asked."""
        if memory_mb <= 0:
            return 0
        # sandboxd sets no limit below 16 MiB; a request below it gets 16 MiB.
        memory = max(memory_mb << 20, _MIN_MEMORY)
        ceiling = await self.warm.memory_ceiling()
        if ceiling and memory > ceiling:
            return _response(
                "SandboxError",
                f"memory_limit_MB {memory_mb} is above the memory limit of pool {self.warm.pool!r} "
                f"({ceiling >> 20} MiB): ask for at most {ceiling >> 20} (-1: the pool's own), "
                "or serve a pool with more",
            )
        # The pool's own limit is served by the pool's own sandboxes (and reserve).
        return 0 if memory == ceiling else memory

    async def _run(
        self, slot: Slot, runner: Runner, args: RunCodeArgs, top: str
    ) -> tuple[web.Response, bool, bool]:
        """The answer, whether every command exited by itself, and whether the sandbox
        was already cleaned up and found as it came."""
        files = {**args.files}
        for name, content in ((runner.source, prepare_source(args.language, args.code)), *runner.extra):
            files[name] = base64.b64encode(content.encode()).decode()
        await run_step(slot.sandbox, setup_command(top), json.dumps(files))
        outcomes: list[ExecResult] = []
        compile_result: dict[str, Any] | None = None
        run_result: dict[str, Any] | None = None
        if runner.compile is not None:
            compiled = await self._user(slot, runner.compile, top, args.compile_timeout, None)
            outcomes.append(compiled)
            compile_result = command_result(compiled)
        if compile_result is None or (
            compile_result["status"] == "Finished" and compile_result["return_code"] == 0
        ):
            ran = await self._user(slot, runner.run, top, args.run_timeout, args.stdin)
            outcomes.append(ran)
            run_result = command_result(ran)
        status, message = run_status(compile_result, run_result)
        if status == "SandboxError":
            return _response(status, message, compile_result, run_result), False, False
        # A command the launcher could not confine ran nothing, or a program chose
        # its status: either way the sandbox is not trusted again.
        clean = all(r.outcome in CLEAN_OUTCOMES and r.exit_code != LAUNCH_FAILED for r in outcomes)
        if not args.fetch_files:
            # The clean-up runs after the answer.
            return _response(status, message, compile_result, run_result), clean, False
        infra = slot.infra if slot.reusable else None
        after = await run_step(slot.sandbox, clean_command(top, args.fetch_files, infra))
        fetched = after.get("files") or {}
        response = _response(status, message, compile_result, run_result, fetched)
        return response, clean and self.warm.passes(slot, after), True


def make_app(
    client: AsyncClient,
    pool: str,
    *,
    acquire_timeout: float = 8.0,
    max_uses: int = 50,
    capture: int = CAPTURE_BYTES,
    reserve: int = 0,
    max_running: int = 0,
) -> web.Application:
    """The aiohttp app serving ``POST /run_code`` and ``GET /v1/ping`` over sandboxes of ``pool``,
    with at least ``reserve`` sandboxes prepared ahead of requests, keeping ``capture`` bytes
    of each output stream, running at most ``max_running`` requests' programs at once (0: as
    many as the sandbox host has CPUs; < 0: no limit); ``GET /sandboxd/stats`` tells how
    requests were served."""
    tools = sorted({r.tool for r in LANGUAGES.values() if r.tool})
    warm = WarmSandboxes(client, pool, max_uses=max_uses, reserve=reserve, tools=tools)
    slots = RunSlots(max_running, lambda: host_cpus(client, pool))
    service = RunCode(warm, acquire_timeout=acquire_timeout, capture=capture, slots=slots)

    async def run_code(request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            return web.json_response(
                {"detail": [{"loc": ["body"], "msg": "JSON decode error", "type": "json_invalid"}]},
                status=422,
            )
        parsed = parse_request(body)
        if isinstance(parsed, list):
            return web.json_response({"detail": parsed}, status=422)
        return await service.handle(parsed)

    async def ping(_: web.Request) -> web.Response:
        return web.json_response("pong")

    async def stats(_: web.Request) -> web.Response:
        return web.json_response(
            {
                **dataclasses.asdict(warm.stats),
                "idle": warm.idle(),
                "in_use": len(warm.in_use()),
                "admission": {
                    **dataclasses.asdict(slots.stats),
                    "limit": slots.limit,
                    "running": slots.running,
                    "queued": slots.queued,
                },
            }
        )

    async def start(_: web.Application) -> None:
        # The reserve fills before the first request.
        warm.start()

    async def close(_: web.Application) -> None:
        await warm.close()

    app = web.Application(client_max_size=64 << 20)
    app.router.add_post("/run_code", run_code)
    app.router.add_get("/v1/ping", ping)
    app.router.add_get("/sandboxd/stats", stats)
    app.on_startup.append(start)
    app.on_cleanup.append(close)
    app[WARM] = warm
    app[SLOTS] = slots
    return app


async def ensure_pool(
    client: AsyncClient,
    pool: str,
    image: str = "",
    *,
    memory_mb: int = POOL_MEMORY_MB,
    min_ready: int = 4,
    max_size: int = 64,
) -> int:
    """Creates ``pool`` of ``image`` with a memory limit of ``memory_mb`` if it does not
    exist (and ``image`` is given); returns the pool's memory limit in bytes (0: unknown).
    A limit below verl's default memory_limit_MB is logged: such requests would be refused."""
    try:
        found = await client.get_pool(pool)
    except errors.SandboxdError as e:
        if not image:
            # Made (or reachable) later, or never: until then requests answer SandboxError.
            log.warning("pool %s: %s (pass --image to create it)", pool, e.message)
            return 0
        if not isinstance(e, errors.NotFound):
            raise
        found = await client.create_pool(
            pool, image, min_ready=min_ready, max_size=max_size, limits={"memory_bytes": memory_mb << 20}
        )
    limit = int(found.spec.limits.memory_bytes)
    if limit and limit < POOL_MEMORY_MB << 20:
        log.warning(
            "pool %s has a memory limit of %d MiB: requests with verl's default memory_limit_MB "
            "(%d) will answer SandboxError",
            pool,
            limit >> 20,
            POOL_MEMORY_MB,
        )
    return limit


async def serve(
    target: str,
    pool: str,
    host: str,
    port: int,
    token: str | None = None,
    *,
    acquire_timeout: float = 8.0,
    max_uses: int = 50,
    reserve: int = 0,
    image: str = "",
    memory_mb: int = POOL_MEMORY_MB,
    max_size: int = 64,
    max_running: int = 0,
) -> None:
    """Serves the SandboxFusion API on ``host:port`` against sandboxd at ``target`` until
    cancelled; with ``image``, creates ``pool`` first if it does not exist (``memory_mb``
    of memory per sandbox, at most ``max_size`` sandboxes); ``max_running`` as make_app's."""
    async with AsyncClient(target, token=token) as client:
        await ensure_pool(
            client, pool, image, memory_mb=memory_mb, min_ready=reserve, max_size=max(max_size, reserve)
        )
        app = make_app(
            client,
            pool,
            acquire_timeout=acquire_timeout,
            max_uses=max_uses,
            reserve=reserve,
            max_running=max_running,
        )
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        print(f"SandboxFusion-compatible /run_code on http://{host}:{port} -> sandboxd {target} pool {pool}")
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()
