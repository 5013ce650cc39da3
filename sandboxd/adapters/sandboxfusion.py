"""A SandboxFusion-compatible HTTP server (aiohttp): ``POST /run_code`` and
``GET /v1/ping``, so verl, SkyRL and PipelineRL code that speaks SandboxFusion
runs unchanged against sandboxd.

Statuses mean what SandboxFusion's ``parse_run_status`` makes them mean:
``SandboxError`` only for the service's own failures (a sandbox lost under a
command, an acquire that cannot be served), ``Failed`` for a compile error, a
non-zero exit or a time-out, ``Success`` otherwise. A wait for a sandbox past
``acquire_timeout`` answers HTTP 504, the one status verl retries. Sandboxes
are prepared ahead of requests and reused between them under the rules of
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
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from sandboxd import errors
from sandboxd.adapters.sandboxfusion_langs import LANGUAGE_NAMES, Runner, prepare_source, runner_for
from sandboxd.adapters.sandboxfusion_probes import LAUNCH_FAILED, clean_command, launch, setup_command
from sandboxd.adapters.sandboxfusion_warm import CLEAN_OUTCOMES, Slot, StepFailed, WarmSandboxes, run_step
from sandboxd.client import AsyncClient, ExecResult

__all__ = ["WARM", "RunCodeArgs", "command_result", "make_app", "parse_request", "run_status", "serve"]

log = logging.getLogger(__name__)


@dataclass
class RunCodeArgs:
    """A validated ``/run_code`` body, with SandboxFusion's defaults."""

    code: str
    language: str
    compile_timeout: float = 10.0
    run_timeout: float = 10.0
    memory_limit_MB: int = -1
    stdin: str | None = None
    files: dict[str, str] = field(default_factory=dict)
    fetch_files: list[str] = field(default_factory=list)


def _error(loc: str, msg: str, kind: str) -> dict[str, Any]:
    return {"loc": ["body", loc], "msg": msg, "type": kind}


def _number(value: Any) -> float | None:
    # pydantic's lax mode: numbers and numeric strings, never booleans.
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def parse_request(body: Any) -> RunCodeArgs | list[dict[str, Any]]:
    """The request, or the pydantic-style error list that FastAPI would answer 422 with."""
    if not isinstance(body, dict):
        return [{"loc": ["body"], "msg": "Input should be a valid dictionary", "type": "dict_type"}]
    problems: list[dict[str, Any]] = []
    code, language = body.get("code"), body.get("language")
    if not isinstance(code, str):
        problems.append(
            _error(
                "code",
                "Field required" if code is None else "Input should be a valid string",
                "missing" if code is None else "string_type",
            )
        )
    if language not in LANGUAGE_NAMES:
        problems.append(
            _error("language", f"Input should be one of {', '.join(LANGUAGE_NAMES)}", "literal_error")
        )
    args = RunCodeArgs(code=code if isinstance(code, str) else "", language=str(language))
    for name in ("compile_timeout", "run_timeout"):
        if name in body:
            number = _number(body[name])
            if number is None or not math.isfinite(number):
                problems.append(_error(name, "Input should be a valid number", "float_parsing"))
            else:
                setattr(args, name, number)
    if "memory_limit_MB" in body:
        mem = _number(body["memory_limit_MB"])
        if mem is None or not mem.is_integer():
            problems.append(_error("memory_limit_MB", "Input should be a valid integer", "int_parsing"))
        else:
            args.memory_limit_MB = int(mem)
    stdin = body.get("stdin")
    if stdin is not None and not isinstance(stdin, str):
        problems.append(_error("stdin", "Input should be a valid string", "string_type"))
    args.stdin = stdin if isinstance(stdin, str) else None
    files = body.get("files", {})
    if not isinstance(files, dict) or not all(isinstance(v, str | None) for v in files.values()):
        problems.append(_error("files", "Input should map names to base64 strings or null", "dict_type"))
    else:
        # A null entry is skipped, as SandboxFusion's restore_files does.
        args.files = {k: v for k, v in files.items() if isinstance(v, str)}
    fetch = body.get("fetch_files", [])
    if not isinstance(fetch, list) or not all(isinstance(f, str) for f in fetch):
        problems.append(_error("fetch_files", "Input should be a valid list of strings", "list_type"))
    else:
        args.fetch_files = fetch
    return problems or args


def command_result(result: ExecResult) -> dict[str, Any]:
    """A SandboxFusion ``CommandRunResult`` for one command's outcome."""
    text = {
        "stdout": result.stdout.decode(errors="replace"),
        "stderr": result.stderr.decode(errors="replace"),
    }
    if result.outcome == "TIMED_OUT":
        # SandboxFusion kills the command and reports no return code.
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


class RunCode:
    """Serves one ``/run_code`` request at a time per sandbox, over ``WarmSandboxes``."""

    def __init__(self, warm: WarmSandboxes, *, acquire_timeout: float, output_limit: int = 0) -> None:
        self.warm = warm
        self.acquire_timeout = acquire_timeout
        self.output_limit = output_limit

    async def _user(
        self, slot: Slot, command: str, top: str, timeout: float, stdin: str | None
    ) -> ExecResult:
        return await slot.sandbox.exec(
            # Confined where the sandbox is reused, so the clean-up cannot be subverted.
            launch(command) if slot.reusable else command,
            cwd=f"{top}/w",
            env={"HOME": f"{top}/h"},
            # sandboxd reads 0 as "no time-out"; SandboxFusion's 0 expires at once.
            timeout=max(timeout, 0.001),
            stdin=stdin or "",
            output_limit=self.output_limit,
        )

    async def handle(self, args: RunCodeArgs) -> web.Response:
        """Runs one validated request and answers SandboxFusion's response."""
        runner = runner_for(args.language, args.code)
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
        memory = args.memory_limit_MB << 20 if args.memory_limit_MB > 0 else 0
        try:
            slot = await self._take(await self.warm.memory_key(memory))
        except errors.DeadlineExceeded as e:
            # verl retries exactly this status; the body says why.
            return web.json_response(
                {"detail": f"no sandbox within {self.acquire_timeout:g}s: {e.message}"}, status=504
            )
        except errors.SandboxdError as e:
            return _response("SandboxError", f"could not acquire a sandbox: {e.message}")
        except StepFailed as e:
            return _response("SandboxError", f"could not prepare a sandbox: {e}")
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

    async def _take(self, memory: int) -> Slot:
        try:
            return await self.warm.take(memory, self.acquire_timeout)
        except errors.InvalidArgument:
            if not memory:
                raise
            # Above the pool's own limit: the pool's limit is the most there is.
            return await self.warm.take(0, self.acquire_timeout)

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
    output_limit: int = 0,
    reserve: int = 0,
) -> web.Application:
    """The aiohttp app serving ``POST /run_code`` and ``GET /v1/ping`` over sandboxes of ``pool``,
    with at least ``reserve`` sandboxes prepared ahead of requests; ``GET /sandboxd/stats``
    tells how requests were served."""
    warm = WarmSandboxes(client, pool, max_uses=max_uses, reserve=reserve)
    service = RunCode(warm, acquire_timeout=acquire_timeout, output_limit=output_limit)

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
            {**dataclasses.asdict(warm.stats), "idle": warm.idle(), "in_use": len(warm.in_use())}
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
    return app


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
) -> None:
    """Serves the SandboxFusion API on ``host:port`` against sandboxd at ``target`` until cancelled."""
    async with AsyncClient(target, token=token) as client:
        app = make_app(client, pool, acquire_timeout=acquire_timeout, max_uses=max_uses, reserve=reserve)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        print(f"SandboxFusion-compatible /run_code on http://{host}:{port} -> sandboxd {target} pool {pool}")
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()
