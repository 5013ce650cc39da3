"""The ``sandboxd`` command: serve, example, loop, image. Settings come from a
TOML file, flags and the environment (DOCKER_HOST) here, and nowhere else."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import os
import resource
import signal
import sys
from pathlib import Path
from typing import Any

from sandboxd import cli_egress, cli_images, cli_snapshots
from sandboxd.e2b import cli as e2b_api
from sandboxd.settings import Settings, load_settings


def _settings(args: argparse.Namespace) -> Settings:
    overrides: dict[str, Any] = {}
    for flag, key in [
        ("host", "server.host"),
        ("port", "server.port"),
        ("instance", "instance_id"),
        ("state_dir", "state_dir"),
        ("backend", "backend.kind"),
        ("kubeconfig", "backend.kubeconfig"),
        ("namespace", "backend.namespace"),
    ]:
        value = getattr(args, flag, None)
        if value is not None:
            overrides[key] = str(value) if flag == "state_dir" else value
    # Settings see the environment only here, at the entry point.
    return load_settings(args.config, overrides, os.environ)


_NR_OPEN = 1 << 20
"""The kernel's default ceiling on a process's descriptors (fs.nr_open)."""


def _raise_open_files_limit() -> None:
    """Lifts the soft limit on open descriptors to the hard one, as Go's
    runtime does: every sandbox holds a few (its shells' pipes or engine
    streams), and a service manager's default soft limit of 1,024 runs out
    near 300 sandboxes."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # An unlimited hard limit still stops at the kernel's nr_open.
    target = _NR_OPEN if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


async def _serve(settings: Settings, args: argparse.Namespace) -> None:
    from sandboxd.app import build_app

    _raise_open_files_limit()
    app = build_app(settings)
    await app.start()
    stop_e2b = None
    if args.e2b_port is not None:
        from sandboxd.cli_e2b import start_beside

        try:
            stop_e2b = await start_beside(app, args)
        except BaseException:
            await app.stop()  # e.g. an E2B state file it cannot load: the server stops cleanly
            raise
    # Everything allocated so far lives as long as the server: keep it out of
    # the collector's full passes, which otherwise stall every RPC at once.
    gc.collect()
    gc.freeze()
    print(f"sandboxd listening on {app.address}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    print("sandboxd: shutting down (leased sandboxes are kept for the next start)", flush=True)
    if stop_e2b is not None:
        await stop_e2b()
    await app.stop()


async def _loop(args: argparse.Namespace, settings: Settings) -> int:
    """``sandboxd loop``: against --target, or an embedded server started here
    (the loop itself only speaks the client API)."""
    from sandboxd.loop.cli import main as loop_main

    if args.target:
        return await loop_main(args, args.target, token=args.token)
    from sandboxd.app import build_app
    from sandboxd.images.build import ensure_default_image

    image = ensure_default_image()
    settings.server.port = 0
    app = build_app(settings)
    await app.start()
    try:
        return await loop_main(args, app.address, image=image)
    finally:
        await app.stop(grace=5)


def _bench(argv: list[str]) -> int:
    """The load harness lives in the source tree's benchmarks/ (not installed)."""
    try:
        from benchmarks.load import main as bench_main
    except ImportError as e:
        print(
            f"sandboxd bench: cannot import benchmarks.load ({e}); run it from a sandboxd source "
            "checkout (the repository root), with the dev extras installed: pip install -e '.[dev]'",
            file=sys.stderr,
        )
        return 2
    return bench_main(argv)


async def _preflight(args: argparse.Namespace) -> int:
    from sandboxd.client import AsyncClient

    kinds = {
        1: "image missing",
        2: "limits invalid",
        3: "quota too small",
        4: "capacity too small",
        5: "backend unhealthy",
        6: "pool too small",
        7: "lifetime too short",
        8: "runtime unavailable",
    }
    limits = {k: v for k, v in [("memory_bytes", args.memory), ("cpu_millis", args.cpu)] if v}
    async with AsyncClient(args.target, token=args.token) as client:
        report = await client.preflight(
            concurrent=args.concurrent,
            pool=args.pool or "",
            image=args.image or "",
            limits=limits,
            duration=args.duration,
            runtime=args.runtime or "",
        )
    cap = report.capacity
    print(
        f"capacity: {cap.memory_bytes / 2**30:.1f} GiB, {cap.cpus} CPUs; "
        f"needed: {cap.memory_needed_bytes / 2**30:.1f} GiB, {cap.cpus_needed:g} CPUs"
    )
    if cap.HasField("quota_sandboxes_left") or cap.HasField("quota_memory_left_bytes"):
        left = [f"{cap.quota_sandboxes_left} sandboxes"] if cap.HasField("quota_sandboxes_left") else []
        if cap.HasField("quota_memory_left_bytes"):
            left.append(f"{cap.quota_memory_left_bytes / 2**30:.1f} GiB of memory limits")
        print(f"backend quotas leave: {', '.join(left)}")
    print(
        f"predicted time to warm {args.concurrent}: {report.predicted_warm_seconds:.1f}s"
        + (f" (measured start {report.measured_start_seconds:.2f}s)" if report.measured_start_seconds else "")
    )
    for p in report.problems:
        print(f"PROBLEM [{kinds.get(p.kind, p.kind)}] {p.message}" + (f" ({p.field})" if p.field else ""))
    print("ok: nothing found that would stop the run" if report.ok else f"{len(report.problems)} problem(s)")
    return 0 if report.ok else 1


def main(argv: list[str] | None = None) -> int:
    """The ``sandboxd`` command line (``argv`` None: the process's own); returns the exit status."""
    parser = argparse.ArgumentParser(prog="sandboxd", description="Sandbox orchestration for RL rollouts.")
    parser.add_argument("--log-level", default="INFO")
    sub = parser.add_subparsers(dest="command", required=True)

    def server_flags(p: argparse.ArgumentParser) -> None:
        p.add_argument("--config", type=Path, help="TOML settings file")
        p.add_argument("--host")
        p.add_argument("--port", type=int)
        p.add_argument("--instance", help="instance id (labels this server's sandboxes)")
        p.add_argument("--state-dir", dest="state_dir", type=Path)
        p.add_argument("--backend", choices=["docker", "kubernetes", "fake"])
        p.add_argument("--kubeconfig", help="kubeconfig file (kubernetes backend; default: in-cluster)")
        p.add_argument("--namespace", help="namespace of the sandbox Pods (kubernetes backend)")

    serve_parser = sub.add_parser("serve", help="run the gRPC control plane")
    server_flags(serve_parser)
    e2b_api.add_serve_flags(serve_parser)
    ex = sub.add_parser("example", help="start a server and run an example rollout workload against it")
    server_flags(ex)
    ex.add_argument("--groups", type=int, default=2, help="GRPO groups to run")
    ex.add_argument("--group-size", type=int, default=4, help="rollouts per group")
    lp = sub.add_parser("loop", help="run the reference generator/trainer RL loop")
    server_flags(lp)
    lp.add_argument("--target", help="a running server (default: start one on the local Docker engine)")
    lp.add_argument("--token", help="tenant bearer token")
    lp.add_argument("--pool", default="loop")
    lp.add_argument("--steps", type=int, default=30)
    lp.add_argument("--workers", type=int, default=4)
    lp.add_argument("--seed", type=int, default=0)
    lp.add_argument("--policy", choices=["auto", "torch", "numpy"], default="auto")
    rc = sub.add_parser("run-code", help="serve a SandboxFusion-compatible /run_code endpoint over a pool")
    rc.add_argument("--target", default="127.0.0.1:50051")
    rc.add_argument("--token", help="tenant bearer token")
    rc.add_argument("--pool", required=True)
    rc.add_argument("--host", default="127.0.0.1")
    rc.add_argument("--port", type=int, default=8080)
    rc.add_argument(
        "--acquire-timeout", type=float, default=8.0, help="wait for a sandbox and a run slot, then 504"
    )
    rc.add_argument("--max-uses", type=int, default=50, help="requests per sandbox, then destroyed")
    rc.add_argument(
        "--reserve", type=int, default=4, help="sandboxes prepared ahead of requests, at least (demand adds)"
    )
    rc.add_argument("--image", default="", help="create --pool of this image if it does not exist")
    rc.add_argument(
        "--memory-mb", type=int, default=1024, help="memory per sandbox of a pool it creates (verl's default)"
    )
    rc.add_argument("--max-size", type=int, default=64, help="sandboxes of a pool it creates, at most")
    rc.add_argument(
        "--max-running",
        type=int,
        default=0,
        help="requests whose programs run at once (default 0: the sandbox host's CPUs; -1: no limit)",
    )
    pa = sub.add_parser("prime-api", help="serve the Prime sandbox API (prime-sandboxes SDK) over pools")
    pa.add_argument("--target", default="127.0.0.1:50051")
    pa.add_argument("--token", help="tenant bearer token")
    pa.add_argument("--host", default="127.0.0.1")
    pa.add_argument("--port", type=int, default=8000)
    pa.add_argument("--image-pool", action="append", default=[], metavar="IMAGE=POOL", help="IMAGE's pool")
    pa.add_argument("--template-pool", default="", help="a pool serving any image, acquired from by image")
    pa.add_argument("--api-key", action="append", default=[], help="an accepted PRIME_API_KEY (repeatable)")
    pa.add_argument("--min-ready", type=int, default=0, help="warm sandboxes of each pool made on first use")
    pa.add_argument("--max-ready", type=int, default=0, help="such pools follow demand up to this many warm")
    pa.add_argument("--max-size", type=int, default=64, help="sandboxes of each pool made on first use")
    pa.add_argument("--public-url", default="", help="the URL clients reach this server at")
    pf = sub.add_parser("preflight", help="check a planned run against a server before spending compute")
    pf.add_argument("--target", default="127.0.0.1:50051")
    pf.add_argument("--token", help="tenant bearer token")
    pf.add_argument("--concurrent", type=int, required=True, help="rollouts at once")
    pf.add_argument("--duration", type=float, default=0.0, help="expected run seconds")
    pf.add_argument("--pool", help="an existing pool")
    pf.add_argument("--image", help="or: the image of a pool to be created")
    pf.add_argument("--memory", type=int, help="memory bytes per sandbox (with --image)")
    pf.add_argument("--cpu", type=int, help="CPU millicores per sandbox (with --image)")
    pf.add_argument("--runtime", choices=["runc", "gvisor"], help="isolation runtime (with --image)")
    st = sub.add_parser("status", help="show a server's pools live (WatchPool)")
    st.add_argument("--target", default="127.0.0.1:50051")
    st.add_argument("--token", help="tenant bearer token")
    st.add_argument("--pool", default="", help="one pool (default: all)")
    st.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")
    st.add_argument("--once", action="store_true", help="print one table and exit")
    st.add_argument("--run", action="append", default=[], help="also show this rollout run's figures")
    cli_snapshots.add_parser(sub)
    cli_egress.add_parser(sub)
    e2b_api.add_parser(sub)
    image = sub.add_parser("image", help="the default sandbox image, or one from a recipe (--context)")
    image.add_argument("action", choices=["build", "tag"])
    image.add_argument("--force", action="store_true")
    cli_images.add_arguments(image)
    sub.add_parser(
        "bench",
        add_help=False,
        help="load test: simulated rollouts on sandboxd and a docker baseline "
        "(python -m benchmarks.load; its flags follow)",
    )

    args, rest = parser.parse_known_args(argv)
    if args.command == "bench":
        return _bench(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )

    if args.command == "loop":
        return asyncio.run(_loop(args, _settings(args)))
    if args.command == "run-code":
        from sandboxd.adapters.sandboxfusion import serve

        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(
                serve(
                    args.target,
                    args.pool,
                    args.host,
                    args.port,
                    args.token,
                    acquire_timeout=args.acquire_timeout,
                    max_uses=args.max_uses,
                    reserve=args.reserve,
                    image=args.image,
                    memory_mb=args.memory_mb,
                    max_size=args.max_size,
                    max_running=args.max_running,
                )
            )
        return 0
    if args.command == "e2b-api":
        from sandboxd.cli_e2b import standalone_builder, standalone_image_builder

        return e2b_api.run_cli(args, standalone_builder(args.config), standalone_image_builder(args.config))
    if args.command == "prime-api":
        from sandboxd.adapters.prime import run_cli

        with contextlib.suppress(KeyboardInterrupt):
            return run_cli(args)
        return 0
    if args.command == "preflight":
        return asyncio.run(_preflight(args))
    if args.command == "status":
        from sandboxd.telemetry.status import run_status

        with contextlib.suppress(KeyboardInterrupt):
            return asyncio.run(
                run_status(
                    args.target,
                    pool=args.pool,
                    once=args.once,
                    interval=args.interval,
                    token=args.token,
                    runs=args.run,
                )
            )
        return 0
    if args.command == "snapshot":
        return asyncio.run(cli_snapshots.run(args))
    if args.command == "egress-proxy":
        with contextlib.suppress(KeyboardInterrupt):
            return asyncio.run(cli_egress.run(args))
        return 0
    if args.command == "image" and args.action == "build" and args.context is not None:
        return asyncio.run(cli_images.build_recipe(args, _settings(args)))
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
            asyncio.run(_serve(settings, args))
        return 0
    from sandboxd.example import run_example

    return asyncio.run(run_example(settings, groups=args.groups, group_size=args.group_size))


if __name__ == "__main__":
    sys.exit(main())
