"""``e2b-code-interpreter``'s ``run_code`` and its contexts, served at the
sandbox URL: the interpreter SDK sends its calls (``/execute``,
``/contexts``) to ``E2B_SANDBOX_URL`` with ``E2b-Sandbox-Port: 49999``, the
port E2B's code-interpreter server listens on in its template.

Each context is a stateful Python kernel in the sandbox: a small driver
(standard library only, so any image with ``python3`` serves it) that runs
under a stdin command of its own, reads one JSON request a line, runs the
cell in a namespace that persists across cells, and writes its output as
marked JSON lines: ``stdout``/``stderr`` as they are written, the value of a
cell's last expression as its main ``result`` (its ``repr`` as text), an
``error`` with name, value and traceback, and the execution count. Output a
cell's subprocesses write straight to the terminal is reported as stdout.
A client that goes away mid-cell interrupts it (KeyboardInterrupt), as E2B's
server does, so the context stays usable."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import secrets
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from sandboxd import errors
from sandboxd.e2b.connect import ConnectError
from sandboxd.e2b.envd import sandbox_of
from sandboxd.e2b.processes import Proc
from sandboxd.e2b.registry import Box

__all__ = ["JUPYTER_PORT", "Kernel", "add_routes"]

JUPYTER_PORT = "49999"
INTERRUPT_GRACE = 30.0
"""Seconds an interrupted cell has to end before its kernel is ended."""
MARK = "\x1eE2B"
"""Starts each line of the driver's protocol; other output lines are stdout."""

DRIVER = r"""
import ast, io, json, os, signal, sys, time, traceback
# Started in the background of a shell, which ignores SIGINT for it: an interrupt must raise.
signal.signal(signal.SIGINT, signal.default_int_handler)
out = os.fdopen(os.dup(1), "w", buffering=1)
def emit(d):
    out.write("\x1eE2B" + json.dumps(d) + "\n")
    out.flush()
class Stream(io.TextIOBase):
    def __init__(self, kind):
        self.kind, self.held = kind, ""
    def writable(self):
        return True
    def write(self, s):
        self.held += s
        if "\n" in self.held:
            cut = self.held.rindex("\n") + 1
            text, self.held = self.held[:cut], self.held[cut:]
            emit({"type": self.kind, "text": text, "timestamp": time.time_ns() // 1000})
        return len(s)
    def flush(self):
        if self.held:
            text, self.held = self.held, ""
            emit({"type": self.kind, "text": text, "timestamp": time.time_ns() // 1000})
sys.stdout, sys.stderr = Stream("stdout"), Stream("stderr")
ns = {"__name__": "__main__"}
count = 0
emit({"type": "ready", "pid": os.getpid(), "cwd": os.getcwd()})
while True:
    line = sys.stdin.readline()
    if not line:
        break
    req = json.loads(line)
    count += 1
    saved = {k: os.environ.get(k) for k in req.get("env_vars") or {}}
    os.environ.update(req.get("env_vars") or {})
    try:
        tree = ast.parse(req["code"], "<cell>", "exec")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        exec(compile(tree, "<cell>", "exec"), ns)
        if last is not None:
            value = eval(compile(last, "<cell>", "eval"), ns)
            if value is not None:
                emit({"type": "result", "text": repr(value), "is_main_result": True})
    except BaseException as e:
        tb = "".join(traceback.format_exception(type(e), e, e.__traceback__))
        emit({"type": "error", "name": type(e).__name__, "value": str(e), "traceback": tb})
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    emit({"type": "number_of_executions", "execution_count": count})
    emit({"type": "end", "id": req["id"]})
"""


@dataclass
class Kernel:
    """One context: its driver's process and what has been read of its output."""

    id: str
    proc: Proc
    queue: asyncio.Queue[dict[str, Any] | ConnectError]
    cwd: str = ""
    pid: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _partial: str = ""
    _lines: list[str] = field(default_factory=list)

    def view(self) -> dict[str, str]:
        """The Context answer."""
        return {"id": self.id, "language": "python", "cwd": self.cwd}

    async def _line(self) -> str:
        while not self._lines:
            item = await self.queue.get()
            if isinstance(item, ConnectError):
                raise item
            event = item["event"]
            if "end" in event:
                raise ConnectError("aborted", f"the kernel of context {self.id} has ended")
            data = event.get("data", {})
            text = self._partial + base64.b64decode(data.get("stdout") or data.get("stderr") or "").decode(
                errors="replace"
            )
            *lines, self._partial = text.split("\n")
            self._lines.extend(lines)
        return self._lines.pop(0)

    async def message(self) -> dict[str, Any]:
        """The driver's next output: a protocol message, or a stdout line."""
        line = await self._line()
        if line.startswith(MARK):
            parsed: dict[str, Any] = json.loads(line[len(MARK) :])
            return parsed
        return {"type": "stdout", "text": line + "\n", "timestamp": 0}

    async def ready(self) -> None:
        while (msg := await self.message())["type"] != "ready":
            continue
        self.pid, self.cwd = int(msg["pid"]), str(msg["cwd"])

    async def interrupt_and_drain(self, request_id: str) -> None:
        """Interrupts the running cell and reads its output to its end; a
        cell that does not end (it catches the interrupt) costs the context
        its kernel, so the next cell does not wait behind it."""
        box = self.proc.box
        try:
            async with asyncio.timeout(INTERRUPT_GRACE):
                with contextlib.suppress(errors.SandboxdError):
                    await box.client.exec(box.sandbox_id, ["kill", "-INT", str(self.pid)], timeout=10.0)
                while not ((msg := await self.message())["type"] == "end" and msg.get("id") == request_id):
                    continue
        except (TimeoutError, ConnectError):
            box.kernels.pop(self.id, None)
            self.close()

    def close(self) -> None:
        self.proc.cancel()


async def start_kernel(box: Box, cwd: str) -> Kernel:
    """A new context's kernel, started and ready."""
    argv = ["python3", "-u", "-c", DRIVER]
    proc = Proc(box, box.new_pid(), {"cmd": "python3", "args": argv[1:]}, "", True)
    kernel = Kernel("c" + secrets.token_hex(8), proc, proc.subscribe())
    proc.start(argv, {}, cwd, "", 0.0)
    try:
        await kernel.ready()
    except ConnectError:
        kernel.close()
        raise
    box.kernels[kernel.id] = kernel
    return kernel


def _http_error(e: ConnectError) -> web.Response:
    # The interpreter SDK raises NotFoundException for 404, TimeoutException
    # for 502 (a sandbox gone), SandboxException otherwise.
    status = {"not_found": 404, "invalid_argument": 400, "aborted": 502, "unavailable": 502}.get(e.code, 500)
    return web.Response(status=status, text=e.message)


def _checked_port(request: web.Request) -> None:
    port = request.headers.get("E2b-Sandbox-Port", "")
    if port != JUPYTER_PORT:
        raise ConnectError("not_found", f"nothing listens on port {port or '(none)'} of this sandbox")


async def _json(request: web.Request) -> dict[str, Any]:
    try:
        value = await request.json()
    except ValueError as e:
        raise ConnectError("invalid_argument", f"body is not JSON: {e}") from e
    if not isinstance(value, dict):
        raise ConnectError("invalid_argument", "body must be a JSON object")
    return value


def _language(given: Any) -> None:
    if given not in (None, "python", "python3"):
        raise ConnectError("invalid_argument", f"language {given!r} is not served: only python")


async def _kernel_for(box: Box, context_id: Any) -> Kernel:
    if context_id is None:
        default = box.kernels.get(box.default_kernel)
        if default is None:
            default = await start_kernel(box, "")
            box.default_kernel = default.id
        return default
    kernel = box.kernels.get(context_id) if isinstance(context_id, str) else None
    if kernel is None:
        raise ConnectError("not_found", f"context {context_id!r} not found")
    return kernel


async def execute(request: web.Request) -> web.StreamResponse:
    """POST /execute: runs a cell, streaming its output as JSON lines."""
    try:
        _checked_port(request)
        box = sandbox_of(request, port_traffic=True)
        given = await _json(request)
        code, envs = given.get("code"), given.get("env_vars") or {}
        if not isinstance(code, str):
            raise ConnectError("invalid_argument", "code must be a string")
        if not isinstance(envs, dict) or not all(isinstance(v, str) for v in envs.values()):
            raise ConnectError("invalid_argument", "env_vars must map strings to strings")
        _language(given.get("language"))
        kernel = await _kernel_for(box, given.get("context_id"))
    except ConnectError as e:
        return _http_error(e)
    request_id = secrets.token_hex(8)
    async with kernel.lock:
        try:
            await kernel.proc.send_input(
                (json.dumps({"id": request_id, "code": code, "env_vars": envs}) + "\n").encode()
            )
        except ConnectError as e:
            return _http_error(e)
        response = web.StreamResponse(status=200, headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        finished = False
        try:
            while True:
                msg = await kernel.message()
                if msg["type"] == "end" and msg.get("id") == request_id:
                    finished = True
                    break
                if msg["type"] in ("stdout", "stderr", "result", "error", "number_of_executions"):
                    await response.write((json.dumps(msg) + "\n").encode())
        except ConnectError as e:
            box.kernels.pop(kernel.id, None)
            await response.write(
                (
                    json.dumps({"type": "error", "name": "KernelDied", "value": e.message, "traceback": ""})
                    + "\n"
                ).encode()
            )
            finished = True
        finally:
            if not finished:
                await asyncio.shield(kernel.interrupt_and_drain(request_id))
    with contextlib.suppress(ConnectionResetError):
        await response.write_eof()
    return response


async def create_context(request: web.Request) -> web.Response:
    try:
        _checked_port(request)
        box = sandbox_of(request, port_traffic=True)
        given = await _json(request)
        _language(given.get("language"))
        cwd = given.get("cwd") or ""
        if not isinstance(cwd, str):
            raise ConnectError("invalid_argument", "cwd must be a string")
        kernel = await start_kernel(box, cwd)
    except ConnectError as e:
        return _http_error(e)
    return web.json_response(kernel.view())


async def list_contexts(request: web.Request) -> web.Response:
    try:
        _checked_port(request)
        box = sandbox_of(request, port_traffic=True)
    except ConnectError as e:
        return _http_error(e)
    return web.json_response([k.view() for k in box.kernels.values()])


async def remove_context(request: web.Request) -> web.Response:
    try:
        _checked_port(request)
        box = sandbox_of(request, port_traffic=True)
        kernel = await _kernel_for(box, request.match_info["context_id"])
    except ConnectError as e:
        return _http_error(e)
    box.kernels.pop(kernel.id, None)
    kernel.close()
    return web.Response(status=200)


async def restart_context(request: web.Request) -> web.Response:
    """A fresh kernel under the same context id (its variables are gone)."""
    try:
        _checked_port(request)
        box = sandbox_of(request, port_traffic=True)
        old = await _kernel_for(box, request.match_info["context_id"])
        async with old.lock:
            old.close()
            fresh = await start_kernel(box, old.cwd)
            box.kernels.pop(fresh.id, None)
            fresh.id = old.id
            box.kernels[old.id] = fresh
    except ConnectError as e:
        return _http_error(e)
    return web.Response(status=200)


def add_routes(app: web.Application) -> None:
    """The interpreter's routes, beside envd's on the sandbox URL."""
    app.router.add_post("/execute", execute)
    app.router.add_post("/contexts", create_context)
    app.router.add_get("/contexts", list_contexts)
    app.router.add_delete("/contexts/{context_id}", remove_context)
    app.router.add_post("/contexts/{context_id}/restart", restart_context)
