"""The metered route to the run's model: an OpenAI-compatible front in each sandbox's egress.

A sandbox of a pool that names a model endpoint gets one more listener in
its egress namespace (sandboxd.backends.network.netns, MODEL_PORT on the
egress address). The listener knows which sandbox it serves, so a call is
attributed by where it came from as well as by its key: the key must be one
of that sandbox's lease, in force now (``Authorize``, answered by the core).
The call goes on to the model server from sandboxd's own namespace, streamed
responses included, and what came back (sandboxd.backends.network.meter) is
handed to ``Record``. The sandbox never learns the server's address.
On Kubernetes one listener serves every Pod, each call's sandbox told by
its source address (``serve_shared``; sandboxd.backends.kubernetes.model_gateway).
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aiohttp
from aiohttp import web

from sandboxd.backends.network.meter import CallBuilder, ModelCall, describe_request

log = logging.getLogger(__name__)

MAX_REQUEST = 32 << 20
_HOP = {
    "connection",
    "keep-alive",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "authorization",
    "api-key",
    "content-length",
}
_RESPONSE_HOP = _HOP | {"content-encoding"}


@dataclass(frozen=True)
class Grant:
    """Who a call is for and where it goes: the answer to a key that may be used now."""

    lease_id: str
    sandbox_id: str
    upstream: str
    """The model server's OpenAI base URL (``http://10.0.0.5:8000/v1``)."""
    upstream_key: str = ""
    """Sent on as the bearer token ("" = none)."""


class KeyRefused(Exception):
    """A key that may not be used here (401: not valid or its lease ended; 403: another sandbox's)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


Authorize = Callable[[str, str], Grant]
"""(the sandbox a listener serves, the key a call presents) -> Grant, or KeyRefused."""
Record = Callable[[ModelCall], None]
Closer = Callable[[], Awaitable[None]]
Identify = Callable[[str], Awaitable[str]]
"""A call's source address -> the sandbox it came from ("" = none of this server's)."""


def _error(status: int, message: str, code: str) -> web.Response:
    # The OpenAI error shape, so that SDKs raise their own typed errors with this message.
    body = {"error": {"message": message, "type": "sandboxd_gateway", "code": code}}
    return web.json_response(body, status=status)


def _key_of(request: web.Request) -> str:
    auth = request.headers.get("Authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return request.headers.get("api-key", "").strip()


class ModelGateway:
    """Serves the model route on sandboxes' listeners; one upstream client session for all of them."""

    def __init__(
        self, authorize: Authorize, record: Record, *, timeout: float = 600.0, max_calls: int = 64
    ) -> None:
        self._authorize = authorize
        self._record = record
        # Calls one sandbox has open at once; more are answered 429 (its share of the model server).
        self._max_calls = max_calls
        self._timeout = aiohttp.ClientTimeout(total=timeout, sock_connect=10.0)
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # trust_env off: the host's own proxy settings must not carry sandboxes' calls elsewhere.
            self._session = aiohttp.ClientSession(
                timeout=self._timeout, auto_decompress=False, trust_env=False
            )
        return self._session

    async def serve(self, sandbox_id: str, sock: socket.socket) -> Closer:
        """Serves ``sock`` (a listening TCP socket, made in the sandbox's egress
        namespace) for ``sandbox_id``; returns what stops it."""

        async def only(_: str) -> str:
            return sandbox_id

        return await self.serve_shared(sock, only)

    async def serve_shared(self, sock: socket.socket, identify: Identify) -> Closer:
        """Serves ``sock`` for every sandbox whose calls reach it, each call's
        sandbox the one ``identify`` names for its source address (one
        listener for all Pods on Kubernetes); a source that is no sandbox's
        is answered 403. Returns what stops it."""
        in_flight: dict[str, int] = {}

        async def handle(request: web.Request) -> web.StreamResponse:
            sandbox_id = await identify(request.remote or "")
            if not sandbox_id:
                log.info("model gateway refused a call from %s: no sandbox of this server", request.remote)
                return _error(403, "the model gateway serves this server's sandboxes only", "not_a_sandbox")
            if in_flight.get(sandbox_id, 0) >= self._max_calls:
                message = f"more than {self._max_calls} model calls at once from this sandbox"
                return _error(429, message, "too_many_calls")
            in_flight[sandbox_id] = in_flight.get(sandbox_id, 0) + 1
            try:
                return await self._handle(sandbox_id, request)
            finally:
                in_flight[sandbox_id] -= 1
                if not in_flight[sandbox_id]:
                    del in_flight[sandbox_id]

        app = web.Application(client_max_size=MAX_REQUEST)
        app.router.add_route("*", "/{tail:.*}", handle)
        # Short: a lease's listener closes with its sandbox, and streams then in flight end with it.
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
        await runner.setup()
        sock.setblocking(False)
        site = web.SockSite(runner, sock)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        return runner.cleanup

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def _handle(self, sandbox_id: str, request: web.Request) -> web.StreamResponse:
        if request.path != "/v1" and not request.path.startswith("/v1/"):
            message = f"the model gateway serves /v1/... only, not {request.path[:80]!r}"
            return _error(404, message, "not_found")
        key = _key_of(request)
        if not key:
            message = "no API key: send the lease's key (OPENAI_API_KEY) as a bearer token"
            return _error(401, message, "no_key")
        try:
            grant = self._authorize(sandbox_id, key)
        except KeyRefused as e:
            log.info("model gateway refused a key in sandbox %s: %s", sandbox_id, e.message)
            return _error(e.status, e.message, "invalid_api_key" if e.status == 401 else "wrong_sandbox")
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return _error(413, f"request body over {MAX_REQUEST} bytes", "too_large")
        call = ModelCall(
            lease_id=grant.lease_id,
            sandbox_id=grant.sandbox_id,
            method=request.method,
            path=request.path[3:] or "/",
            started_at=time.time(),
        )
        describe_request(call, body)
        began = time.monotonic()
        try:
            return await self._forward(request, grant, body, call)
        finally:
            call.duration_seconds = time.monotonic() - began
            self._record(call)

    async def _forward(
        self, request: web.Request, grant: Grant, body: bytes, call: ModelCall
    ) -> web.StreamResponse:
        url = grant.upstream.rstrip("/") + call.path
        if request.query_string:
            url += "?" + request.query_string
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        if grant.upstream_key:
            headers["Authorization"] = f"Bearer {grant.upstream_key}"
        builder = CallBuilder(call)
        try:
            async with self._client().request(request.method, url, data=body, headers=headers) as up:
                call.status = up.status
                kept = {k: v for k, v in up.headers.items() if k.lower() not in _RESPONSE_HOP}
                if up.content_type == "text/event-stream":
                    return await self._stream(request, up, kept, builder)
                data = await up.read()
                builder.body(data)
                builder.finish()
                return web.Response(status=up.status, body=data, headers=kept)
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            call.error = f"model server unreachable: {type(e).__name__}: {e}"[:500]
            builder.finish()
            return _error(502, f"sandboxd gateway: {call.error}", "upstream_unreachable")

    async def _stream(
        self,
        request: web.Request,
        up: aiohttp.ClientResponse,
        headers: dict[str, str],
        builder: CallBuilder,
    ) -> web.StreamResponse:
        response = web.StreamResponse(status=up.status, headers=headers)
        await response.prepare(request)
        try:
            async for chunk in up.content.iter_any():
                builder.feed(chunk)
                await response.write(chunk)
            await response.write_eof()
        except (ConnectionError, aiohttp.ClientError) as e:
            # The client went away, or the server cut the stream: what came so far is recorded.
            builder.call.error = f"stream cut: {type(e).__name__}: {e}"[:500]
        finally:
            builder.finish()
        return response
