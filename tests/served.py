"""An aiohttp application served in the test's own loop on a free loopback
port, as the tests of sandboxd's HTTP front ends serve them."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from aiohttp import web

__all__ = ["served"]


@contextlib.asynccontextmanager
async def served(app: web.Application, *, handler_cancellation: bool = False) -> AsyncIterator[str]:
    """``app`` served on 127.0.0.1 at a free port; its URL. Cleaned up at the end."""
    runner = web.AppRunner(app, handler_cancellation=handler_cancellation)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
