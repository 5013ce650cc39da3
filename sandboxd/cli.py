"""The ``sandboxd`` command: serve, example, image. Settings come from a TOML
file and flags here, and nowhere else."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from pathlib import Path
from typing import Any

from sandboxd.settings import Settings, load_settings


def _settings(args: argparse.Namespace) -> Settings:
    overrides: dict[str, Any] = {}
    for flag, key in [
        ("host", "server.host"),
        ("port", "server.port"),
        ("instance", "instance_id"),
        ("state_dir", "state_dir"),
        ("backend", "backend.kind"),
    ]:
        value = getattr(args, flag, None)
        if value is not None:
            overrides[key] = str(value) if flag == "state_dir" else value
    return load_settings(args.config, overrides)


async def _serve(settings: Settings) -> None:
    from sandboxd.app import build_app

    app = build_app(settings)
    await app.start()
    print(f"sandboxd listening on {app.address}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    print("sandboxd: shutting down (leased sandboxes are kept for the next start)", flush=True)
    await app.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sandboxd", description="Sandbox orchestration for RL rollouts.")
    parser.add_argument("--log-level", default="INFO")
    sub = parser.add_subparsers(dest="command", required=True)

    def server_flags(p: argparse.ArgumentParser) -> None:
        p.add_argument("--config", type=Path, help="TOML settings file")
        p.add_argument("--host")
        p.add_argument("--port", type=int)
        p.add_argument("--instance", help="instance id (labels this server's sandboxes)")
        p.add_argument("--state-dir", dest="state_dir", type=Path)
        p.add_argument("--backend", choices=["docker", "fake"])

    server_flags(sub.add_parser("serve", help="run the gRPC control plane"))
    ex = sub.add_parser("example", help="start a server and run an example rollout workload against it")
    server_flags(ex)
    ex.add_argument("--groups", type=int, default=2, help="GRPO groups to run")
    ex.add_argument("--group-size", type=int, default=4, help="rollouts per group")
    image = sub.add_parser("image", help="the default sandbox image")
    image.add_argument("action", choices=["build", "tag"])
    image.add_argument("--force", action="store_true")

    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )

    if args.command == "image":
        from sandboxd.images.build import default_image_tag, ensure_default_image

        if args.action == "tag":
            print(default_image_tag())
            return 0
        print(ensure_default_image(force=args.force))
        return 0
    settings = _settings(args)
    if args.command == "serve":
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(_serve(settings))
        return 0
    from sandboxd.example import run_example

    return asyncio.run(run_example(settings, groups=args.groups, group_size=args.group_size))


if __name__ == "__main__":
    sys.exit(main())
