"""The in-sandbox API (envd) the SDK reaches at its sandbox URL: /health,
/files, and the process and filesystem Connect services.

Every sandbox is served at the same URL (``E2B_SANDBOX_URL``): the SDK names
the sandbox in the ``E2b-Sandbox-Id`` header of each call and proves it may
use it with ``X-Access-Token``, the sandbox's envd access token from create
or connect."""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hmac
import re
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import BodyPartReader, web

from sandboxd.e2b import filesystem
from sandboxd.e2b.connect import (
    STREAM_CONTENT_TYPE,
    ConnectError,
    end_frame,
    error_response,
    frame,
    parse_stream_request,
    parse_unary_request,
    stream_timeout,
)
from sandboxd.e2b.processes import Proc, find_process, input_bytes, start_process
from sandboxd.e2b.pty import pty_size
from sandboxd.e2b.registry import RUNNING, Box, Registry
from sandboxd.e2b.watch import Watcher, watch_request

__all__ = ["REGISTRY", "add_routes", "sandbox_of"]

REGISTRY = web.AppKey("e2b_registry", Registry)
_SIGNALS = {"SIGNAL_SIGKILL", "SIGNAL_SIGTERM", 9, 15}


def sandbox_of(request: web.Request, port_traffic: bool = False) -> Box:
    """The running sandbox an envd call names (``E2b-Sandbox-Id``) and may
    use (``X-Access-Token``); a call to a port of the sandbox
    (``port_traffic``) may prove it with the sandbox's traffic token
    instead (``E2B-Traffic-Access-Token``), which is what E2B's own port
    routing checks."""
    sandbox_id = request.headers.get("E2b-Sandbox-Id", "")
    if not sandbox_id:
        raise ConnectError(
            "invalid_argument", "the E2b-Sandbox-Id header names the sandbox; set E2B_SANDBOX_URL"
        )
    box = request.app[REGISTRY].by_id(sandbox_id)
    token = request.headers.get("X-Access-Token", "")
    traffic = request.headers.get("E2B-Traffic-Access-Token", "") if port_traffic else ""
    allowed = box is not None and (
        hmac.compare_digest(token, box.access_token)
        or bool(traffic and hmac.compare_digest(traffic, box.traffic_token))
    )
    if box is None or not allowed:
        raise ConnectError("not_found", f"sandbox {sandbox_id} not found")
    if box.state != RUNNING:
        raise ConnectError("unavailable", f"sandbox {sandbox_id} is paused; connect to resume it")
    return box


def _user(request: web.Request) -> str:
    """The E2B user of a call: its Basic authorization's name, or /files'
    ``username`` parameter; "" = the sandbox's default user."""
    given = request.query.get("username", "")
    auth = request.headers.get("Authorization", "")
    if not given and auth.startswith("Basic "):
        try:
            given = base64.b64decode(auth.removeprefix("Basic "), validate=True).decode().split(":", 1)[0]
        except (binascii.Error, UnicodeDecodeError) as e:
            raise ConnectError("invalid_argument", f"unreadable Authorization header: {e}") from e
    return given


Unary = Callable[[Box, str, dict[str, Any]], Awaitable[dict[str, Any]]]


def _unary(handler: Unary) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def serve(request: web.Request) -> web.Response:
        try:
            message = await parse_unary_request(request)
            answer = await handler(sandbox_of(request), _user(request), message)
        except ConnectError as e:
            return error_response(e)
        return web.json_response(answer)

    return serve


async def _follow(request: web.Request, proc: Proc, timeout: float) -> web.StreamResponse:
    """Streams ``proc``'s events from now to its end. ``timeout`` (a Connect
    stream's deadline) ends the stream, not the command; a Start stream has
    none here, its deadline being the exec's own timeout."""
    queue = proc.subscribe()
    response = web.StreamResponse(status=200, headers={"Content-Type": STREAM_CONTENT_TYPE})
    try:
        await response.prepare(request)
        await response.write(frame({"event": {"start": {"pid": proc.pid}}}))
        async with asyncio.timeout(timeout or None):
            while True:
                item = await queue.get()
                if isinstance(item, ConnectError):
                    await response.write(end_frame(item))
                    break
                await response.write(frame(item))
                if "end" in item["event"]:
                    await response.write(end_frame())
                    break
    except TimeoutError:
        await response.write(
            end_frame(ConnectError("deadline_exceeded", "connection to the command timed out"))
        )
    finally:
        # A client that goes away (disconnect) leaves the command running.
        proc.unsubscribe(queue)
    with contextlib.suppress(ConnectionResetError):
        await response.write_eof()
    return response


async def start(request: web.Request) -> web.StreamResponse:
    try:
        message = await parse_stream_request(request)
        timeout = stream_timeout(request)
        box = sandbox_of(request)
        proc = start_process(box, message, _user(request), timeout)
    except ConnectError as e:
        return error_response(e)
    return await _follow(request, proc, 0.0)


async def connect(request: web.Request) -> web.StreamResponse:
    try:
        message = await parse_stream_request(request)
        timeout = stream_timeout(request)
        proc = find_process(sandbox_of(request), message)
    except ConnectError as e:
        return error_response(e)
    return await _follow(request, proc, timeout)


_KEEPALIVE = 5.0
"""Seconds between a quiet watch stream's keepalives, which also find a
client that has gone (its write fails) and end the watch."""


async def watch_dir(request: web.Request) -> web.StreamResponse:
    try:
        message = await parse_stream_request(request)
        timeout = stream_timeout(request)
        box = sandbox_of(request)
        path, recursive = watch_request(message)
        watcher = Watcher(box, _user(request), path, recursive)
        await watcher.start()
    except ConnectError as e:
        return error_response(e)
    response = web.StreamResponse(status=200, headers={"Content-Type": STREAM_CONTENT_TYPE})
    try:
        await response.prepare(request)
        await response.write(frame({"start": {}}))
        async with asyncio.timeout(timeout or None):
            while True:
                try:
                    item = await asyncio.wait_for(watcher.events.get(), _KEEPALIVE)
                except TimeoutError:
                    await response.write(frame({"keepalive": {}}))
                    continue
                if isinstance(item, ConnectError):
                    await response.write(end_frame(item))
                    break
                await response.write(frame({"filesystem": item}))
    except TimeoutError:
        await response.write(end_frame())
    except ConnectionResetError:
        return response
    finally:
        watcher.cancel()
    with contextlib.suppress(ConnectionResetError):
        await response.write_eof()
    return response


async def create_watcher(box: Box, user: str, message: dict[str, Any]) -> dict[str, Any]:
    path, recursive = watch_request(message)
    watcher = Watcher(box, user, path, recursive)
    await watcher.start()
    box.watchers[watcher.id] = watcher
    return {"watcherId": watcher.id}


def _watcher(box: Box, message: dict[str, Any]) -> Watcher:
    watcher_id = message.get("watcherId", "")
    watcher = box.watchers.get(watcher_id) if isinstance(watcher_id, str) else None
    if watcher is None:
        raise ConnectError("not_found", f"watcher {watcher_id!r} not found")
    return watcher


async def get_watcher_events(box: Box, _user: str, message: dict[str, Any]) -> dict[str, Any]:
    watcher = _watcher(box, message)
    try:
        return {"events": watcher.drain()}
    except ConnectError:
        box.watchers.pop(watcher.id, None)
        raise


async def remove_watcher(box: Box, _user: str, message: dict[str, Any]) -> dict[str, Any]:
    _watcher(box, message).cancel()
    box.watchers.pop(message["watcherId"], None)
    return {}


async def list_processes(box: Box, _user: str, _message: dict[str, Any]) -> dict[str, Any]:
    return {
        "processes": [
            {"config": p.config, "pid": p.pid, **({"tag": p.tag} if p.tag else {})}
            for p in box.processes.values()
        ]
    }


async def send_signal(box: Box, _user: str, message: dict[str, Any]) -> dict[str, Any]:
    signal = message.get("signal", "")
    if signal not in _SIGNALS:
        raise ConnectError("invalid_argument", "signal must be SIGNAL_SIGKILL or SIGNAL_SIGTERM")
    await find_process(box, message).kill()
    return {}


async def send_input(box: Box, _user: str, message: dict[str, Any]) -> dict[str, Any]:
    await find_process(box, message).send_input(input_bytes(message))
    return {}


async def update(box: Box, _user: str, message: dict[str, Any]) -> dict[str, Any]:
    """Update: a PTY session's new terminal size (``pty.resize``)."""
    proc = find_process(box, message)
    await proc.resize(*pty_size(message))
    return {}


async def close_stdin(box: Box, _user: str, message: dict[str, Any]) -> dict[str, Any]:
    await find_process(box, message).close_stdin()
    return {}


async def health(request: web.Request) -> web.Response:
    sandbox_id = request.headers.get("E2b-Sandbox-Id", "")
    box = request.app[REGISTRY].by_id(sandbox_id)
    # 502 is how the SDK learns the sandbox is gone (is_running -> False).
    return web.Response(status=204 if box is not None and box.state == RUNNING else 502)


_FILENAME = re.compile(r'filename="((?:[^"\\]|\\.)*)"')


def part_path(disposition: str) -> str:
    """A multipart file's path: its raw ``filename``, which the SDK sets to
    the whole path (aiohttp's ``part.filename`` keeps only its last part)."""
    found = _FILENAME.search(disposition)
    if found is None:
        return ""
    return urllib.parse.unquote(re.sub(r"\\(.)", r"\1", found.group(1)))


def _files_error(e: ConnectError) -> web.Response:
    # As envd answers: a file the filesystem refuses (permission, read-only)
    # is 500, which the SDK raises as SandboxException; envd's 401 means a
    # wrong access token (AuthenticationException), never the file's mode.
    status = {"not_found": 404, "invalid_argument": 400, "aborted": 502}.get(e.code, 500)
    return web.json_response({"code": status, "message": e.message}, status=status)


async def get_file(request: web.Request) -> web.StreamResponse:
    try:
        box = sandbox_of(request)
        path = request.query.get("path", "")
        if not path:
            raise ConnectError("invalid_argument", "path is required")
        data = await filesystem.read_file(box, _user(request), path)
    except ConnectError as e:
        return _files_error(e)
    return web.Response(body=data, content_type="application/octet-stream")


async def post_file(request: web.Request) -> web.Response:
    try:
        box = sandbox_of(request)
        user = _user(request)
        path = request.query.get("path", "")
        if request.headers.get("Content-Encoding", "identity") != "identity":
            raise ConnectError("invalid_argument", "compressed uploads are not served")
        written: list[dict[str, Any]] = []
        if request.content_type == "multipart/form-data":
            reader = await request.multipart()
            while (part := await reader.next()) is not None:
                if not isinstance(part, BodyPartReader):
                    raise ConnectError("invalid_argument", "nested multipart bodies are not served")
                target = part_path(part.headers.get("Content-Disposition", "")) or path
                if not target:
                    raise ConnectError("invalid_argument", "each file part needs a filename (its path)")
                written.append(await filesystem.write_file(box, user, target, bytes(await part.read())))
        else:
            if not path:
                raise ConnectError("invalid_argument", "path is required")
            written.append(await filesystem.write_file(box, user, path, await request.read()))
    except ConnectError as e:
        return _files_error(e)
    return web.json_response(written)


def add_routes(app: web.Application) -> None:
    app.router.add_get("/health", health)
    app.router.add_get("/files", get_file)
    app.router.add_post("/files", post_file)
    app.router.add_post("/process.Process/Start", start)
    app.router.add_post("/process.Process/Connect", connect)
    app.router.add_post("/process.Process/List", _unary(list_processes))
    app.router.add_post("/process.Process/SendSignal", _unary(send_signal))
    app.router.add_post("/process.Process/SendInput", _unary(send_input))
    app.router.add_post("/process.Process/CloseStdin", _unary(close_stdin))
    app.router.add_post("/process.Process/Update", _unary(update))
    app.router.add_post("/filesystem.Filesystem/Stat", _unary(filesystem.stat))
    app.router.add_post("/filesystem.Filesystem/ListDir", _unary(filesystem.list_dir))
    app.router.add_post("/filesystem.Filesystem/MakeDir", _unary(filesystem.make_dir))
    app.router.add_post("/filesystem.Filesystem/Move", _unary(filesystem.move))
    app.router.add_post("/filesystem.Filesystem/Remove", _unary(filesystem.remove))
    app.router.add_post("/filesystem.Filesystem/WatchDir", watch_dir)
    app.router.add_post("/filesystem.Filesystem/CreateWatcher", _unary(create_watcher))
    app.router.add_post("/filesystem.Filesystem/GetWatcherEvents", _unary(get_watcher_events))
    app.router.add_post("/filesystem.Filesystem/RemoveWatcher", _unary(remove_watcher))
