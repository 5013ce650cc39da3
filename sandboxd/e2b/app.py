"""The E2B-compatible server: the control API and envd on one aiohttp app
over sandboxd's client."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from aiohttp import web

from sandboxd.client import AsyncClient
from sandboxd.e2b import builds, envd, interpreter, lifecycle, metrics, snapshots, state, unserved
from sandboxd.e2b import control as rest
from sandboxd.e2b.control import Control, E2bSettings, Refused
from sandboxd.e2b.registry import Registry

__all__ = ["announce", "make_app", "serve", "start"]

CONTROL = web.AppKey("e2b_control", Control)

Route = Callable[[Control, web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def _refusals(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except Refused as e:
        return web.json_response({"code": e.status, "message": e.message}, status=e.status)


def _route(app: web.Application, fn: Route) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def handle(request: web.Request) -> web.StreamResponse:
        return await fn(app[CONTROL], request)

    return handle


def make_app(client: AsyncClient, settings: E2bSettings) -> web.Application:
    """The app serving E2B's API and envd against sandboxd's ``client``."""
    app = web.Application(middlewares=[_refusals], client_max_size=1 << 30)
    registry = Registry()
    app[envd.REGISTRY] = registry
    app[CONTROL] = Control(client, settings, registry)
    r = app.router
    r.add_post("/sandboxes", _route(app, snapshots.from_snapshots(rest.create)))
    r.add_post("/v2/sandboxes", _route(app, snapshots.from_snapshots(rest.create_v2)))
    r.add_get("/sandboxes", _route(app, rest.list_boxes))
    r.add_get("/v2/sandboxes", _route(app, rest.list_boxes))
    r.add_get("/sandboxes/metrics", _route(app, metrics.get_metrics_of))
    r.add_get("/sandboxes/{sandbox_id}", _route(app, rest.get_info))
    r.add_delete("/sandboxes/{sandbox_id}", _route(app, rest.kill))
    r.add_post("/sandboxes/{sandbox_id}/timeout", _route(app, rest.set_timeout))
    r.add_post("/sandboxes/{sandbox_id}/refreshes", _route(app, rest.refresh))
    r.add_get("/sandboxes/{sandbox_id}/metrics", _route(app, metrics.get_metrics))
    r.add_put("/sandboxes/{sandbox_id}/network", _route(app, lifecycle.update_network))
    r.add_post("/sandboxes/{sandbox_id}/connect", _route(app, lifecycle.connect))
    r.add_post("/v2/sandboxes/{sandbox_id}/connect", _route(app, lifecycle.connect))
    r.add_post("/sandboxes/{sandbox_id}/pause", _route(app, lifecycle.pause))
    r.add_post("/sandboxes/{sandbox_id}/resume", _route(app, lifecycle.resume))
    r.add_post("/sandboxes/{sandbox_id}/fork", _route(app, lifecycle.fork))
    r.add_get("/templates/aliases/{alias}", _route(app, rest.template_alias))
    builds.add_routes(app, lambda fn: _route(app, fn))
    unserved.add_routes(app)
    snapshots.add_routes(app, lambda fn: _route(app, fn))
    if settings.state_file is not None:
        state.attach(app, app[CONTROL], settings.state_file)
    envd.add_routes(app)
    interpreter.add_routes(app)

    async def close(app: web.Application) -> None:
        await app[CONTROL].close()

    app.on_cleanup.append(close)
    return app


async def start(
    client: AsyncClient, settings: E2bSettings, host: str, port: int
) -> tuple[web.AppRunner, int]:
    """Starts serving on ``host:port`` (0 = a free port) beside whatever
    else the loop runs; returns the runner (``cleanup()`` stops it and ends
    the sandboxes it holds) and the port bound."""
    runner = web.AppRunner(make_app(client, settings), handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    server = site._server
    sockets = getattr(server, "sockets", None) or []
    bound = sockets[0].getsockname()[1] if sockets else port
    return runner, int(bound)


def announce(host: str, port: int, target: str) -> None:
    """Prints where the API is and the settings that point the SDK at it."""
    print(
        f"E2B API on http://{host}:{port} -> sandboxd {target}; point the SDK at it with "
        f"E2B_API_URL=http://{host}:{port} E2B_SANDBOX_URL=http://{host}:{port}",
        flush=True,
    )


async def serve(target: str, settings: E2bSettings, host: str, port: int, token: str | None = None) -> None:
    """Serves until cancelled."""
    async with AsyncClient(target, token=token) as client:
        runner, bound = await start(client, settings, host, port)
        announce(host, bound, target)
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()
