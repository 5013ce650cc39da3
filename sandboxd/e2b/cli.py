"""``sandboxd e2b-api`` and ``sandboxd serve --e2b-port``: their flags, the
settings they make, and serving until interrupted."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

from sandboxd.e2b.templates import Recipe, Template, TemplatesError, load_templates, parse_template_flags

if TYPE_CHECKING:  # the server's modules load only when it is started
    from sandboxd.e2b.control import E2bSettings, ImageBuilder

__all__ = ["Builder", "add_parser", "add_serve_flags", "run_cli", "settings_from"]

STATE_FILE = "e2b-state.json"
"""The file ``e2b-api --state-dir`` keeps built templates and E2B snapshots in."""

Builder = Callable[[list[Recipe]], Awaitable[dict[str, Template]]]
"""Builds a templates file's recipes into templates (the image cache's
builds, which only the server side can reach)."""


def _flags(p: argparse.ArgumentParser, prefix: str) -> None:
    """The flags shared by ``e2b-api`` and ``serve`` (there prefixed ``--e2b-``)."""
    p.add_argument(
        f"--{prefix}template",
        dest="e2b_template",
        action="append",
        default=[],
        metavar="NAME=POOL[:IMAGE]",
        help="a template's pool, and one of the pool's images (repeatable)",
    )
    p.add_argument(
        f"--{prefix}templates",
        dest="e2b_templates",
        type=Path,
        metavar="FILE",
        help="TOML file of [templates.NAME] tables: pool, and image or a build context",
    )
    p.add_argument(
        f"--{prefix}api-key",
        dest="e2b_api_key",
        action="append",
        default=[],
        help="an accepted E2B_API_KEY (repeatable; none = any key)",
    )
    p.add_argument(
        f"--{prefix}tenant",
        dest="e2b_tenant",
        action="append",
        default=[],
        metavar="API_KEY=TOKEN",
        help="the sandboxd tenant token a key's calls carry",
    )
    p.add_argument(f"--{prefix}acquire-timeout", dest="e2b_acquire_timeout", type=float, default=60.0)
    p.add_argument(
        f"--{prefix}build-pool",
        dest="e2b_build_pool",
        default="",
        metavar="POOL",
        help="serve the SDK's template builder: built templates' sandboxes come from this pool "
        '(one serving any image: images = ["*"])',
    )


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``sandboxd e2b-api``: the E2B API as its own process, over --target."""
    p = sub.add_parser("e2b-api", help="serve the E2B API and envd (the e2b SDK) over pools")
    p.add_argument("--target", default="127.0.0.1:50051")
    p.add_argument("--token", help="tenant bearer token of keys without --tenant")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=3000)
    p.add_argument("--config", type=Path, help="TOML settings naming the engine that builds recipes")
    p.add_argument(
        "--state-dir",
        dest="e2b_state_dir",
        type=Path,
        help=f"keep built templates and E2B snapshots across restarts in {STATE_FILE} here "
        "(none: in memory, snapshots deleted at exit)",
    )
    _flags(p, "")


def add_serve_flags(p: argparse.ArgumentParser) -> None:
    """``sandboxd serve --e2b-port N``: the E2B API inside the server."""
    p.add_argument("--e2b-port", type=int, help="also serve the E2B API on this port (0 = any free one)")
    p.add_argument("--e2b-host", default="127.0.0.1", help="address of the E2B API (with --e2b-port)")
    p.add_argument("--e2b-token", help="tenant bearer token of the E2B API's keys without --e2b-tenant")
    _flags(p, "e2b-")


def _pairs(values: list[str], flag: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for v in values:
        name, sep, value = v.partition("=")
        if not sep or not name or not value:
            raise SystemExit(f"{flag} takes NAME=VALUE, not {v!r}")
        out[name] = value
    return out


async def settings_from(
    args: argparse.Namespace, build: Builder | None, build_image: ImageBuilder | None = None
) -> E2bSettings:
    """The E2bSettings the flags say, recipes built by ``build``, the SDK's
    template builds by ``build_image`` (with --build-pool). Raises
    SystemExit with the reason for flags that cannot be used."""
    from sandboxd.e2b.control import E2bSettings

    try:
        templates: dict[str, Template] = {}
        recipes: list[Recipe] = []
        if args.e2b_templates is not None:
            templates, recipes = load_templates(args.e2b_templates)
        flagged = parse_template_flags(args.e2b_template)
    except TemplatesError as e:
        raise SystemExit(f"error: {e}") from e
    if recipes:
        if build is None:
            raise SystemExit("error: this command cannot build templates: give images instead")
        templates.update(await build(recipes))
    templates.update(flagged)  # a flag overrides the file
    tenants = _pairs(args.e2b_tenant, "--tenant")
    build_pool = getattr(args, "e2b_build_pool", "")
    if build_pool and build_image is None:
        raise SystemExit("error: --build-pool needs a server that builds images")
    state_dir: Path | None = getattr(args, "e2b_state_dir", None)
    state_file = None if state_dir is None else state_dir / STATE_FILE
    return E2bSettings(
        templates=templates,
        api_keys=frozenset(args.e2b_api_key) | frozenset(tenants),
        tenant_tokens=tenants,
        acquire_timeout=args.e2b_acquire_timeout,
        build_image=build_image if build_pool else None,
        build_pool=build_pool,
        state_file=state_file,
    )


async def _main(args: argparse.Namespace, build: Builder | None, build_image: ImageBuilder | None) -> None:
    from sandboxd.e2b.app import serve
    from sandboxd.e2b.state import StateError

    settings = await settings_from(args, build, build_image)
    try:
        await serve(args.target, settings, args.host, args.port, args.token)
    except StateError as e:
        raise SystemExit(f"error: {e}") from e


def run_cli(
    args: argparse.Namespace, build: Builder | None = None, build_image: ImageBuilder | None = None
) -> int:
    """``sandboxd e2b-api``: serves until interrupted."""
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_main(args, build, build_image))
    return 0
