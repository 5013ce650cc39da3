"""The gateway that ``auth`` points at (``/gateway/<ns>/<id>/...``): file
upload, download and read, and the Connect RPC that runs one command."""

from __future__ import annotations

import contextlib
import datetime as dt
import hmac
import io
import posixpath
import tarfile
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import BodyPartReader, web

from sandboxd import errors
from sandboxd.client import AsyncClient, ExecResult

from . import connect
from .connect import ConnectError, StartResponse
from .refusals import Gone, Refused
from .registry import PrimeServer
from .sandbox import TERMINAL, PrimeSandbox, iso, utc_now

__all__ = ["GATEWAY", "USER_NS", "Gateway", "gateway_auth"]

GATEWAY = "/gateway"
"""Where the gateway is served."""
USER_NS = "sandboxd"
"""The namespace (``user_ns``) of every sandbox's gateway path."""
# Files up to this size go through WriteFiles; larger ones as a one-file tar
# stream (UploadDirectory), which is not bounded by a gRPC message.
_SMALL_UPLOAD = 16 << 20
_READ_MAX = 48 << 20


def gateway_auth(server: PrimeServer, request: web.Request, box: PrimeSandbox) -> dict[str, str]:
    """What ``auth`` answers: the gateway's URL and ``box``'s token for it."""
    base = server.settings.public_url.rstrip("/") or f"{request.scheme}://{request.host}"
    expires = utc_now() + dt.timedelta(hours=24)
    return {
        "token": box.token,
        "gateway_url": base + GATEWAY,
        "user_ns": USER_NS,
        "job_id": box.id,
        "expires_at": iso(expires) or "",
    }


class Gateway:
    """The gateway's handlers, over the sandboxes of one PrimeServer."""

    def __init__(self, server: PrimeServer) -> None:
        self.server = server

    @property
    def client(self) -> AsyncClient:
        """The sandboxd client the server speaks through."""
        return self.server.client

    def register(self, router: web.UrlDispatcher) -> None:
        """Adds the gateway's routes to ``router``."""
        gw = GATEWAY + "/{ns}/{job_id}"
        router.add_post(gw + "/upload", self.upload)
        router.add_get(gw + "/download", self.download)
        router.add_get(gw + "/read-file", self.read_file)
        router.add_post(f"{gw}/{connect.START_RPC}", self.start_command)

    def _box(self, request: web.Request) -> PrimeSandbox:
        box = self.server.find(request.match_info["job_id"])
        if box is None:
            raise Refused(404, "Sandbox not found")
        given = request.headers.get("Authorization", "").removeprefix("Bearer ")
        if not hmac.compare_digest(given, box.token):
            raise Refused(401, "invalid sandbox token")
        if box.status in TERMINAL:
            raise Gone()
        if box.status != "RUNNING":
            raise Refused(409, f"sandbox {box.id} is {box.status}")
        self.server.touch(box)
        return box

    async def upload(self, request: web.Request) -> web.Response:
        """``upload``: writes the form's ``file`` part to ``path``."""
        box = self._box(request)
        path = request.query.get("path", "")
        if not path:
            raise Refused(422, "path is required")
        data: bytes | None = None
        async for part in await request.multipart():
            if isinstance(part, BodyPartReader) and part.name == "file":
                data = bytes(await part.read())
        if data is None:
            raise Refused(422, "the form has no 'file' part")
        try:
            if len(data) <= _SMALL_UPLOAD:
                await self.client.write_files(box.sandbox, {path: data})
            else:
                await self.client.upload_dir(
                    box.sandbox, _one_file_tar(posixpath.basename(path), data), posixpath.dirname(path) or "."
                )
        except errors.SandboxdError as e:
            raise _refusal(e) from e
        return web.json_response(
            {"success": True, "path": path, "size": len(data), "timestamp": iso(utc_now())}
        )

    async def _read(self, box: PrimeSandbox, path: str) -> bytes:
        try:
            return (await self.client.read_files(box.sandbox, [path], max_bytes=_READ_MAX))[path]
        except errors.NotFound as e:
            raise Refused(404, f"File not found: {path}") from e
        except errors.ResourceExhausted as e:
            raise Refused(413, f"{path} is larger than {_READ_MAX} bytes") from e
        except errors.SandboxdError as e:
            raise _refusal(e) from e

    async def download(self, request: web.Request) -> web.Response:
        """``download``: the file at ``path``, raw."""
        box = self._box(request)
        data = await self._read(box, request.query.get("path", ""))
        return web.Response(body=data, content_type="application/octet-stream")

    async def read_file(self, request: web.Request) -> web.Response:
        """``read-file``: the file at ``path`` as text, or a window of it."""
        box = self._box(request)
        data = await self._read(box, request.query.get("path", ""))
        q = request.query
        if "offset" not in q and "length" not in q:
            return web.json_response({"content": data.decode(errors="replace"), "size": len(data)})
        try:
            offset, length = int(q.get("offset", "0")), int(q.get("length", str(len(data))))
        except ValueError:
            raise Refused(422, "offset and length are numbers") from None
        # A negative offset counts from the end (the SDK reads job output tails so).
        start = max(0, len(data) + offset) if offset < 0 else min(offset, len(data))
        window = data[start : start + max(0, length)]
        return web.json_response(
            {
                "content": window.decode(errors="replace"),
                "size": len(window),
                "total_size": len(data),
                "offset": start,
                "truncated": len(window) < len(data),
            }
        )

    async def start_command(self, request: web.Request) -> web.StreamResponse:
        """Connect server-streaming ``CommandSession/Start``: runs one command
        and streams start, output and end events (or an error end)."""
        response = web.StreamResponse(status=200, headers={"Content-Type": connect.CONTENT_TYPE})
        await response.prepare(request)
        messages = self._run_command(request)
        error: ConnectError | None = None
        try:
            async for message in messages:
                await response.write(connect.message_frame(message))
        except ConnectError as e:
            error = e
        except ConnectionError:
            return response  # the caller went away; closing the stream below kills the command
        finally:
            # Closed now, not when collected: that cancels the exec, so the command dies with the call.
            await messages.aclose()  # type: ignore[attr-defined]
        with contextlib.suppress(ConnectionError):
            await response.write(connect.end_frame(error))
            await response.write_eof()
        return response

    async def _run_command(self, request: web.Request) -> AsyncIterator[Any]:
        try:
            box = self._box(request)
        except Refused as e:
            code = {401: "unauthenticated", 404: "not_found"}.get(e.status, "unavailable")
            raise ConnectError(code, e.detail) from e
        except Gone as e:
            raise ConnectError("not_found", "sandbox_terminated") from e
        start = connect.parse_start_request(await request.read())
        if start.HasField("pty") or start.stdin:
            raise ConnectError("unimplemented", "ptys and streamed stdin are not served here")
        spec = start.command
        user = spec.user if spec.HasField("user") else ""
        if user not in ("", "root"):
            raise ConnectError(
                "invalid_argument", f"user {user!r} does not exist in this sandbox ('' or 'root')"
            )
        timeout = 0.0
        header = request.headers.get("Connect-Timeout-Ms", "")
        if header.isdigit():
            # Answer a little before the caller's deadline, tree already killed.
            timeout = max(0.01, int(header) / 1000 - 0.1)
        argv = [spec.cmd, *spec.args]
        env = {**box.env, **dict(spec.envs)}
        yield StartResponse(event={"start": {"pid": 0}})
        result: ExecResult | None = None
        cwd = spec.cwd if spec.HasField("cwd") else ""
        events = self.client.exec_stream(box.sandbox, argv, cwd=cwd, env=env, timeout=timeout, user=user)
        try:
            async for kind, value in events:
                if kind == "result":
                    result = value
                elif value:
                    yield StartResponse(event={"data": {kind: value}})
        except errors.SandboxdError as e:
            raise ConnectError(connect.connect_code(e), e.message) from e
        finally:
            await events.aclose()  # type: ignore[attr-defined]
        assert result is not None
        self.server.touch(box)
        if result.outcome == "TIMED_OUT":
            raise ConnectError("deadline_exceeded", f"the command timed out: {result.detail}")
        if result.outcome == "OUTPUT_TRUNCATED":
            raise ConnectError("resource_exhausted", f"the command's output was cut: {result.detail}")
        if result.outcome == "SANDBOX_LOST":
            await self.server.end(box, "ERROR", "SANDBOX_LOST", result.detail, "lost")
            raise ConnectError("not_found", f"the sandbox was lost: {result.detail}")
        # Killed by a limit (OOM, pids, ...) or a signal: what a shell reports.
        exit_code = result.exit_code if result.exit_code >= 0 else 137
        yield StartResponse(event={"end": {"exit_code": exit_code, "exited": True, "status": "exited"}})


def _refusal(e: errors.SandboxdError) -> Refused:
    if isinstance(e, errors.InvalidArgument):
        return Refused(400, e.message)
    if isinstance(e, errors.NotFound):
        return Refused(404, e.message)
    if isinstance(e, errors.ResourceExhausted):
        return Refused(507, e.message)
    # The sandbox's user may not write there: the same answer however large
    # the file (and never retried, as a 5xx would be).
    if isinstance(e, errors.PermissionDenied):
        return Refused(403, e.message)
    return Refused(502, e.message)


def _one_file_tar(name: str, data: bytes) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size, info.mode = len(data), 0o644
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()
