"""``sandboxd image build --context DIR``: an image from a Dockerfile and its
context, built through the engine and cached by the recipe's hash (the
image cache's build), its log on stderr and its tag on stdout."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

from sandboxd.errors import InvalidArgument, SandboxdError
from sandboxd.settings import Settings

if TYPE_CHECKING:
    from sandboxd.core.images import ImageCache


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of a recipe build on ``sandboxd image``."""
    parser.add_argument("--context", type=Path, help="build this directory's Dockerfile (a recipe image)")
    parser.add_argument("--dockerfile", default="Dockerfile", help="the Dockerfile's path inside --context")
    parser.add_argument("--build-arg", action="append", default=[], metavar="KEY=VALUE", help="repeatable")
    parser.add_argument("--repository", default="", help="the built image's repository (sandboxd-build)")
    parser.add_argument("--config", type=Path, help="TOML settings file (engine address, state_dir)")


def _build_args(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InvalidArgument("--build-arg", f"{pair!r} is not KEY=VALUE")
        out[key] = value
    return out


@contextlib.asynccontextmanager
async def standalone_cache(settings: Settings) -> AsyncIterator[ImageCache]:
    """An image cache of its own on the engine ``settings`` name, for builds
    only: it evicts nothing, as only the server knows what is used."""
    # Imported here: the other commands need none of the server's parts.
    from sandboxd.app import make_backend
    from sandboxd.clock import SystemClock
    from sandboxd.core.images import ImageCache

    backend = make_backend(settings)
    cache = ImageCache(
        backend,
        SystemClock(),
        settings.images,
        ledger_path=settings.state_dir / f"{settings.instance_id}-images.sqlite3",
        environ=os.environ,
        evicts=False,
    )
    try:
        await cache.start()
        yield cache
    finally:
        await cache.stop()
        await backend.close()


async def build_recipe(args: argparse.Namespace, settings: Settings) -> int:
    """Builds ``args.context``; prints the tag (0), or what failed, naming the step (1)."""
    from sandboxd.core.images.builds import DEFAULT_REPOSITORY

    try:
        build_args = _build_args(args.build_arg)
        async with standalone_cache(settings) as cache:
            tag = await cache.build(
                args.context,
                dockerfile=args.dockerfile,
                build_args=build_args,
                repository=args.repository or DEFAULT_REPOSITORY,
                on_log=lambda line: print(line, file=sys.stderr),
            )
    except SandboxdError as e:
        print(f"error: {e.message}", file=sys.stderr)
        return 1
    print(tag)
    return 0
