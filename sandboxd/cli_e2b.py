"""The E2B API's server-side parts: a templates file's build recipes and the
SDK's template builds (``--build-pool``) built through the image cache (the
same builds as ``sandboxd image build``), and the API served inside
``sandboxd serve`` (``--e2b-port``).

The E2B front end (sandboxd.e2b) speaks to sandboxd only through the public
client, as every rollout-side package does; inside ``serve`` it keeps doing
so over a loopback connection to the server's own port, so both ways of
running it behave the same and it never reaches into the server's state."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

from sandboxd.app import App
from sandboxd.cli_images import standalone_cache
from sandboxd.client import AsyncClient
from sandboxd.core.images import ImageCache
from sandboxd.e2b.cli import Builder, settings_from
from sandboxd.e2b.templates import Recipe, Template
from sandboxd.settings import load_settings

if TYPE_CHECKING:  # the E2B server's modules load only when it is started
    from sandboxd.e2b.control import ImageBuilder

__all__ = [
    "build_recipes",
    "cache_builder",
    "cache_image_builder",
    "standalone_builder",
    "standalone_image_builder",
    "start_beside",
]


async def build_recipes(cache: ImageCache, recipes: list[Recipe]) -> dict[str, Template]:
    """Each recipe's template: its pool and the tag its build gave (a recipe
    built before answers at once). Build logs go to stderr; a failure raises
    sandboxd's error naming the failing step."""
    out: dict[str, Template] = {}
    for recipe in recipes:

        def log(line: str, name: str = recipe.name) -> None:
            print(f"template {name}: {line}", file=sys.stderr)

        tag = await cache.build(
            recipe.context, dockerfile=recipe.dockerfile, build_args=recipe.build_args, on_log=log
        )
        out[recipe.name] = Template(recipe.pool, tag)
    return out


def cache_builder(cache: ImageCache) -> Builder:
    """A Builder on a running server's image cache."""

    async def build(recipes: list[Recipe]) -> dict[str, Template]:
        return await build_recipes(cache, recipes)

    return build


def cache_image_builder(cache: ImageCache) -> ImageBuilder:
    """The SDK's template builds on a running server's image cache."""

    async def build(context: Path, on_log: Callable[[str], None]) -> str:
        return await cache.build(context, on_log=on_log)

    return build


def standalone_builder(config: Path | None) -> Builder:
    """A Builder for ``sandboxd e2b-api``'s templates file, on an image cache
    of its own on the engine the settings file ``config`` names (else
    DOCKER_HOST, else the local one), as ``sandboxd image build``'s."""

    async def build(recipes: list[Recipe]) -> dict[str, Template]:
        async with standalone_cache(load_settings(config, None, os.environ)) as cache:
            return await build_recipes(cache, recipes)

    return build


def standalone_image_builder(config: Path | None) -> ImageBuilder:
    """The SDK's template builds for ``sandboxd e2b-api`` (--build-pool)."""

    async def build(context: Path, on_log: Callable[[str], None]) -> str:
        async with standalone_cache(load_settings(config, None, os.environ)) as cache:
            return await cache.build(context, on_log=on_log)

    return build


async def start_beside(app: App, args: argparse.Namespace) -> Callable[[], Awaitable[None]]:
    """Starts the E2B API of ``serve``'s ``--e2b-*`` flags beside a started
    ``app``; returns what stops it (ending the E2B sandboxes it holds)."""
    from sandboxd.e2b.app import announce, start
    from sandboxd.e2b.state import StateError

    if app.settings.server.tls_cert_file:
        raise SystemExit(
            "error: --e2b-port speaks to the server over loopback without TLS; with server TLS on, "
            "run `sandboxd e2b-api --target` against it instead"
        )
    cache = app.control.images
    build = cache_builder(cache) if cache is not None else None
    settings = await settings_from(args, build, cache_image_builder(cache) if cache is not None else None)
    # The server keeps its state in its state directory: the E2B API's built templates and snapshots too.
    state_file = app.settings.state_dir / f"{app.settings.instance_id}-e2b.json"
    settings = dataclasses.replace(settings, state_file=state_file)
    client = AsyncClient(app.address, token=args.e2b_token)
    try:
        runner, port = await start(client, settings, args.e2b_host, args.e2b_port)
    except StateError as e:
        await client.close()
        raise SystemExit(f"error: {e}") from e
    except BaseException:
        await client.close()
        raise
    announce(args.e2b_host, port, app.address)

    async def stop() -> None:
        await runner.cleanup()
        await client.close()

    return stop
