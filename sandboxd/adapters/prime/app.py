"""The aiohttp application: the REST routes and the gateway over one
PrimeServer, with API-key checks and errors answered as the SDK expects."""

from __future__ import annotations

import hmac
from collections.abc import AsyncIterator

from aiohttp import web
from aiohttp.typedefs import Handler

from sandboxd.client import AsyncClient

from .gateway import Gateway
from .refusals import Gone, Refused
from .registry import PrimeServer
from .rest import API, SandboxRoutes
from .settings import PrimeSettings

__all__ = ["PRIME_SERVER", "make_app"]

PRIME_SERVER = web.AppKey("prime_server", PrimeServer)
"""The app's PrimeServer (its sandboxes and pools)."""


def make_app(client: AsyncClient, settings: PrimeSettings | None = None) -> web.Application:
    """The aiohttp application: Prime's REST API and gateway over ``client``."""
    server = PrimeServer(client, settings or PrimeSettings())
    keys = server.settings.api_keys

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path.startswith(API + "/") and keys:
            given = request.headers.get("Authorization", "").removeprefix("Bearer ")
            if not any(hmac.compare_digest(given, k) for k in keys):
                return web.json_response({"detail": "API key unauthorized"}, status=401)
        try:
            return await handler(request)
        except Refused as e:
            return web.json_response({"detail": e.detail}, status=e.status)
        except Gone:
            return web.json_response({"error": "sandbox_terminated"}, status=410)

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        await server.start()
        yield
        await server.close()

    app = web.Application(middlewares=[guard], client_max_size=1 << 30)
    app[PRIME_SERVER] = server
    app.cleanup_ctx.append(lifecycle)
    SandboxRoutes(server).register(app.router)
    Gateway(server).register(app.router)
    return app
