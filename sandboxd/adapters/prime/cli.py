"""``sandboxd prime-api``: the flags checked, then the Prime API served
against a sandboxd server until interrupted."""

from __future__ import annotations

import argparse
import asyncio
import sys

from aiohttp import web

from sandboxd.client import AsyncClient

from .app import make_app
from .settings import PrimeSettings

__all__ = ["run_cli", "serve"]


async def serve(target: str, settings: PrimeSettings, host: str, port: int, token: str | None = None) -> None:
    """Runs the API on host:port against the sandboxd server at ``target``."""
    async with AsyncClient(target, token=token) as client:
        # A client that goes away cancels its handler, and so kills its command.
        runner = web.AppRunner(make_app(client, settings), handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        print(f"Prime sandbox API on http://{host}:{port} -> sandboxd {target}", flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()


def run_cli(args: argparse.Namespace) -> int:
    """``sandboxd prime-api``: checks the flags, then serves until interrupted."""
    pools: dict[str, str] = {}
    for item in args.image_pool:
        image, sep, pool = item.rpartition("=")
        if not sep or not image or not pool:
            print(f"sandboxd prime-api: --image-pool wants IMAGE=POOL, got {item!r}", file=sys.stderr)
            return 2
        pools[image] = pool
    loopback = args.host in ("localhost", "::1") or args.host.startswith("127.")
    if not args.api_key and not loopback:
        print("sandboxd prime-api: listening beyond loopback needs at least one --api-key", file=sys.stderr)
        return 2
    settings = PrimeSettings(
        image_pools=pools,
        template_pool=args.template_pool,
        min_ready=args.min_ready,
        max_ready=args.max_ready,
        max_size=args.max_size,
        api_keys=frozenset(args.api_key),
        public_url=args.public_url,
    )
    asyncio.run(serve(args.target, settings, args.host, args.port, args.token))
    return 0
