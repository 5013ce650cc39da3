"""``sandboxd e2b-api``: its flags, and serving until interrupted."""

from __future__ import annotations

import argparse
import asyncio
import contextlib

__all__ = ["add_parser", "run_cli"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("e2b-api", help="serve the E2B API and envd (the e2b SDK) over pools")
    p.add_argument("--target", default="127.0.0.1:50051")
    p.add_argument("--token", help="tenant bearer token of keys without --tenant")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=3000)
    p.add_argument(
        "--template", action="append", default=[], metavar="TEMPLATE=POOL", help="a template's pool"
    )
    p.add_argument("--api-key", action="append", default=[], help="an accepted E2B_API_KEY (repeatable)")
    p.add_argument(
        "--tenant", action="append", default=[], metavar="API_KEY=TOKEN", help="a key's tenant token"
    )
    p.add_argument("--acquire-timeout", type=float, default=60.0)


def _pairs(values: list[str], flag: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for v in values:
        name, sep, value = v.partition("=")
        if not sep or not name or not value:
            raise SystemExit(f"{flag} takes NAME=VALUE, not {v!r}")
        out[name] = value
    return out


def run_cli(args: argparse.Namespace) -> int:
    # Imported here so that the CLI's other commands do not load the server.
    from sandboxd.e2b.app import serve
    from sandboxd.e2b.control import E2bSettings

    tenants = _pairs(args.tenant, "--tenant")
    settings = E2bSettings(
        template_pools=_pairs(args.template, "--template"),
        api_keys=frozenset(args.api_key) | frozenset(tenants),
        tenant_tokens=tenants,
        acquire_timeout=args.acquire_timeout,
    )
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.target, settings, args.host, args.port, args.token))
    return 0
