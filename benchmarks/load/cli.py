"""``python -m benchmarks.load`` (also ``sandboxd bench``): run a profile on
sandboxd, on the naive baseline and on the floor (the same commands as plain
processes on the host), or compare two result files.

    python -m benchmarks.load --profile step-sync --rollouts 128 [--quick]
    python -m benchmarks.load --profile swe-like --driver sandboxd --target 127.0.0.1:50051
    python -m benchmarks.load compare a.json b.json

Writes a JSON result (default benchmarks/results/load.json), a sidecar with
raw samples and the pool timeline (<stem>.series.json), and PNG plots
(<stem>_latency_cdf.png, <stem>_pool.png); prints a table, then the result
JSON as the last line of stdout. The exit status is 0 when every goal holds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import json
import math
import os
import platform
import secrets
import signal
import socket
import sys
import time
import tomllib
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from benchmarks.load.baseline import BaselineDriver
from benchmarks.load.dists import ProfileError
from benchmarks.load.episode import plan_episode
from benchmarks.load.floor import FloorDriver
from benchmarks.load.profile import PRESETS, Profile, load_profile
from benchmarks.load.report import build_report, compare, render
from benchmarks.load.runner import SampledDriver, Sampler, play_profile
from benchmarks.load.sandboxd_driver import SandboxdDriver

RESULTS = Path(__file__).resolve().parent.parent / "results"
DEFAULT_OUTPUT = RESULTS / "load.json"
MAX_WARM_POOL = 128
"""Largest warm floor the harness asks for by default (a 2-core machine holds ~128 idle containers)."""


def log(msg: str) -> None:
    line = f"[load {time.strftime('%H:%M:%S')}] {msg}"
    try:
        from tqdm import tqdm  # keeps a running progress bar intact
    except ImportError:
        print(line, file=sys.stderr, flush=True)
    else:
        tqdm.write(line, file=sys.stderr)


# -- loopback only ----------------------------------------------------------------


def is_loopback_host(host: str) -> bool:
    """Whether every address ``host`` resolves to is a loopback address."""
    host = host.strip("[]")
    try:
        infos = socket.getaddrinfo(host, None)
    except socket.gaierror:
        return False
    return bool(infos) and all(ipaddress.ip_address(str(i[4][0]).split("%")[0]).is_loopback for i in infos)


def check_target(target: str, allow_remote: bool) -> None:
    host = target.rsplit(":", 1)[0] if ":" in target else target
    if not allow_remote and not is_loopback_host(host):
        raise SystemExit(
            f"--target {target}: not a loopback address; the harness only talks to loopback unless "
            "--allow-remote names the cluster under test"
        )


def check_engine(allow_remote: bool) -> None:
    url = os.environ.get("DOCKER_HOST", "")
    if not url or url.startswith(("unix://", "npipe://")) or allow_remote:
        return
    host = urlparse(url).hostname or ""
    if not is_loopback_host(host):
        raise SystemExit(f"DOCKER_HOST={url} is not local; the baseline only talks to a local engine")


# -- one driver ----------------------------------------------------------------------


def _cpu() -> tuple[int, int]:
    values = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return sum(values[:8]) - idle, sum(values[:8])


async def run_driver(
    driver: SampledDriver,
    profile: Profile,
    *,
    run_id: str,
    warm_timeout: float,
    progress: bool,
    setup: Callable[[float], Any],
    teardown: Callable[[], Any],
    wait_idle: float = 0.0,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(summary, series) of one driver: set up, play, tear down and count leaks,
    whatever fails on the way (a failure is an error of type harness:...)."""
    out: dict[str, Any] = {"errors": {}}
    out["background_cpu_pct"] = await asyncio.to_thread(wait_for_idle, wait_idle)
    if out["background_cpu_pct"] > 25:
        log(f"warning: the host is {out['background_cpu_pct']:.0f}% busy before {driver.name} starts")
    sampler = Sampler(driver)
    busy0 = _cpu()
    own0 = time.process_time()
    sampler.start()
    try:
        out["setup"] = await setup(warm_timeout)
        out.update(
            await play_profile(driver, profile, run_id=run_id, progress=progress, sampler=sampler, log=log)
        )
    except Exception as e:
        out["errors"] = {**out.get("errors", {}), f"harness:{type(e).__name__}": 1}
        out["failure"] = f"{type(e).__name__}: {e}"
        log(f"{driver.name} failed: {out['failure']}\n{traceback.format_exc(limit=4)}")
    finally:
        await sampler.stop()
        try:
            out.update(await teardown())
        except Exception as e:
            out["errors"] = {**out["errors"], f"harness:teardown:{type(e).__name__}": 1}
            out["teardown_failure"] = f"{type(e).__name__}: {e}"
            out.setdefault("leaked", None)
        busy1 = _cpu()
        total = busy1[1] - busy0[1]
        out["host_cpu_busy_pct"] = round(100.0 * (busy1[0] - busy0[0]) / total, 1) if total else None
        out["harness_cpu_s"] = round(time.process_time() - own0, 2)
    series = {
        "samples_ms": out.pop("samples_ms", {}),
        "timeline": sampler.timeline(),
        "step_s": out.get("step_s", []),
        "step_start_s": out.get("step_start_s", []),
    }
    out["timeline_samples"] = len(series["timeline"])
    return out, series


def host_busy_pct(seconds: float = 1.0) -> float:
    """Host-wide CPU busy share over ``seconds`` (every process, ours included). Blocking."""
    b0, t0 = _cpu()
    time.sleep(seconds)
    b1, t1 = _cpu()
    return round(100.0 * (b1 - b0) / (t1 - t0), 1) if t1 > t0 else math.nan


def wait_for_idle(limit: float, threshold: float = 25.0) -> float:
    """Waits up to ``limit`` seconds for the host to be under ``threshold`` % busy
    (other workloads skew every number); returns the last reading. Blocking."""
    deadline = time.monotonic() + limit
    busy = host_busy_pct()
    while busy > threshold and time.monotonic() < deadline:
        log(f"host {busy:.0f}% busy before we start; waiting (--wait-idle)")
        busy = host_busy_pct(2.0)
    return busy


def planned_snapshots(profile: Profile) -> int:
    return sum(
        t.snapshot
        for step in range(profile.run.steps)
        for r in range(profile.run.rollouts)
        for t in plan_episode(profile, r, step).turns
    )


async def run_all(args: argparse.Namespace, profile: Profile) -> tuple[dict[str, Any], dict[str, Any]]:
    run_id = secrets.token_hex(4)
    drivers: dict[str, dict[str, Any]] = {}
    series: dict[str, Any] = {}
    shape = profile.run
    snaps = planned_snapshots(profile) if profile.episode.snapshot_probability else 0
    image = args.image
    if image is None:
        from sandboxd.images.build import ensure_default_image

        image = await asyncio.to_thread(ensure_default_image)
    sandboxd_snapshots = False
    snapshot_note = "no sandboxd run"
    if args.driver in ("all", "both", "sandboxd"):
        min_ready = args.min_ready if args.min_ready is not None else min(shape.in_flight, MAX_WARM_POOL)
        max_size = (
            args.max_size if args.max_size is not None else max(shape.in_flight, min_ready, shape.group_size)
        )
        sd = SandboxdDriver(
            run_id=run_id,
            image=image,
            min_ready=min_ready,
            max_size=max_size,
            target=args.target,
            pool=args.pool,
            lease_ttl=shape.max_seconds + 300.0,
            acquire_timeout=min(300.0, shape.max_seconds),
            backend=args.server_backend,
            log=log,
        )
        log(
            f"sandboxd: {profile.name}, {shape.rollouts} rollouts x {shape.steps} steps; "
            f"pool min_ready {min_ready}, max_size {max_size}"
        )
        drivers["sandboxd"], series["sandboxd"] = await run_driver(
            sd, profile, run_id=run_id, warm_timeout=args.warm_timeout, progress=args.progress,
            setup=sd.setup, teardown=sd.teardown, wait_idle=args.wait_idle,
        )  # fmt: skip
        sandboxd_snapshots = sd.snapshots
        snapshot_note = sd.snapshot_note
        drivers["sandboxd"]["snapshots"] = {
            "supported": sd.snapshots, "planned": snaps, "note": snapshot_note,
            "taken": len(series["sandboxd"]["samples_ms"].get("snapshot", [])),
        }  # fmt: skip
    if args.driver in ("all", "both", "baseline"):
        check_engine(args.allow_remote)
        threads = args.baseline_threads or min(max(shape.in_flight, 4), 256)
        bl = BaselineDriver(
            run_id=run_id, image=image, threads=threads, snapshots=sandboxd_snapshots, log=log
        )
        log(f"baseline: docker run/exec/rm per rollout, {threads} threads")
        drivers["baseline"], series["baseline"] = await run_driver(
            bl, profile, run_id=run_id, warm_timeout=args.warm_timeout, progress=args.progress,
            setup=bl.setup, teardown=bl.teardown, wait_idle=args.wait_idle,
        )  # fmt: skip
        drivers["baseline"]["snapshots"] = {
            "supported": bl.snapshots, "planned": snaps,
            "note": ("docker commit, mirroring sandboxd" if bl.snapshots
                     else "skipped: sandboxd took none"),
            "taken": len(series["baseline"]["samples_ms"].get("snapshot", [])),
        }  # fmt: skip
    if args.driver in ("all", "floor"):
        fl = FloorDriver(snapshots=sandboxd_snapshots, log=log)
        log("floor: every command a plain process on the host")
        drivers["floor"], series["floor"] = await run_driver(
            fl, profile, run_id=run_id, warm_timeout=args.warm_timeout, progress=args.progress,
            setup=fl.setup, teardown=fl.teardown, wait_idle=args.wait_idle,
        )  # fmt: skip
        drivers["floor"]["snapshots"] = {
            "supported": fl.snapshots, "planned": snaps,
            "note": ("tar of the directory, mirroring sandboxd" if fl.snapshots
                     else "skipped: sandboxd took none"),
            "taken": len(series["floor"]["samples_ms"].get("snapshot", [])),
        }  # fmt: skip
    header = {
        "profile": profile.name,
        "mode": shape.mode,
        "rollouts": shape.rollouts,
        "steps": shape.steps,
        "group_size": shape.group_size,
        "quick": args.quick,
        "seed": shape.seed,
        "run_id": run_id,
        "image": image,
        "target": args.target or "own server on 127.0.0.1",
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine_info(),
        "config": asdict(profile),
    }
    return build_report(header, drivers), series


def machine_info() -> dict[str, Any]:
    cpu = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu": cpu,
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "python": platform.python_version(),
        "kernel": platform.release(),
    }


# -- entry point -----------------------------------------------------------------------


def replot(result: Path) -> list[str]:
    """(Re)draws the PNGs of a result from its series sidecar."""
    from benchmarks.load.plots import plot_all

    report = json.loads(result.read_text())
    stem = result.with_suffix("")
    series = json.loads(stem.with_name(stem.name + ".series.json").read_text())
    for name, d in series.items():
        d.setdefault("between_steps_s", report.get("drivers", {}).get(name, {}).get("between_steps_s", []))
    return plot_all(series, stem, f"{report.get('profile')} x{report.get('rollouts')}")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.load", description=(__doc__ or "").split("\n")[0])
    p.add_argument("--profile", default="step-sync", help=f"a preset ({', '.join(PRESETS)}) or a TOML file")
    p.add_argument("--quick", action="store_true", help="the profile's [quick] overrides (small, short)")
    p.add_argument("--rollouts", type=int, help="override run.rollouts")
    p.add_argument("--group-size", type=int, help="override run.group_size")
    p.add_argument("--steps", type=int, help="override run.steps")
    p.add_argument("--seed", type=int, help="override run.seed")
    p.add_argument("--max-seconds", type=float, help="override run.max_seconds (per driver)")
    p.add_argument("--max-requests", type=int, help="override run.max_requests (per driver)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override any profile key, VALUE in TOML syntax (episode.think_seconds=0.5)",
    )
    p.add_argument(
        "--driver",
        choices=["all", "both", "sandboxd", "baseline", "floor"],
        default="all",
        help="all: sandboxd, baseline and floor; both: sandboxd and baseline",
    )
    p.add_argument("--target", help="a running sandboxd (host:port); default: start one on loopback")
    p.add_argument(
        "--allow-remote", action="store_true", help="allow a non-loopback --target (the cluster under test)"
    )
    p.add_argument("--pool", help="use this existing pool on --target instead of creating one")
    p.add_argument("--image", help="sandbox image (default: the default sandboxd image, built if missing)")
    p.add_argument("--min-ready", type=int, help="warm floor of the pool (default: min(in-flight, 128))")
    p.add_argument("--max-size", type=int, help="pool max_size (default: the rollouts in flight)")
    p.add_argument("--warm-timeout", type=float, default=600.0, help="longest wait for the pool to warm")
    p.add_argument(
        "--baseline-threads", type=int, help="thread pool of the baseline (default: rollouts in flight)"
    )
    p.add_argument("--server-backend", choices=["docker", "fake"], default="docker", help=argparse.SUPPRESS)
    p.add_argument(
        "--wait-idle",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="before each driver, wait up to this long for the host to be under 25%% busy",
    )
    p.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="result JSON path")
    p.add_argument("--no-plots", dest="plots", action="store_false")
    p.add_argument("--no-progress", dest="progress", action="store_false")
    return p


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    pairs = {
        "run.rollouts": args.rollouts,
        "run.group_size": args.group_size,
        "run.steps": args.steps,
        "run.seed": args.seed,
        "run.max_seconds": args.max_seconds,
        "run.max_requests": args.max_requests,
    }
    out = {k: v for k, v in pairs.items() if v is not None}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or "." not in key:
            raise ProfileError(f"--set {item}", "expected SECTION.KEY=VALUE")
        try:
            out[key.strip()] = tomllib.loads(f"v = {value}")["v"]
        except tomllib.TOMLDecodeError as e:
            raise ProfileError(f"--set {item}", f"VALUE is not TOML: {e}") from e
    return out


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["compare"]:
        cp = argparse.ArgumentParser(prog="python -m benchmarks.load compare")
        cp.add_argument("a", type=Path)
        cp.add_argument("b", type=Path)
        cargs = cp.parse_args(argv[1:])
        print(compare(cargs.a, cargs.b))
        return 0
    if argv[:1] == ["plot"]:
        pp = argparse.ArgumentParser(prog="python -m benchmarks.load plot")
        pp.add_argument("result", type=Path, help="a result JSON; its <stem>.series.json must be beside it")
        pargs = pp.parse_args(argv[1:])
        for path in replot(pargs.result):
            print(path)
        return 0
    if argv[:1] == ["run"]:
        argv = argv[1:]
    p = parser()
    args = p.parse_args(argv)
    try:
        profile = load_profile(args.profile, quick=args.quick, overrides=_overrides(args))
    except ProfileError as e:
        p.error(str(e))
    if args.target:
        check_target(args.target, args.allow_remote)
    if args.pool and not args.target:
        p.error("--pool needs --target (a server of your own)")

    async def go() -> tuple[dict[str, Any], dict[str, Any]]:
        task = asyncio.current_task()
        assert task is not None
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        return await run_all(args, profile)

    report, series = asyncio.run(go())
    out: Path = args.output
    out.parent.mkdir(parents=True, exist_ok=True)
    stem = out.with_suffix("")
    series_path = stem.with_name(stem.name + ".series.json")
    series_path.write_text(json.dumps(series, separators=(",", ":")) + "\n")
    report["series_file"] = series_path.name
    if args.plots:
        try:
            from benchmarks.load.plots import plot_all

            report["plots"] = [
                Path(x).name for x in plot_all(series, stem, f"{profile.name} x{profile.run.rollouts}")
            ]
        except ImportError as e:
            log(f"no plots ({e}); install the dev extras for matplotlib")
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(render(report))
    print(json.dumps(report, separators=(",", ":")))
    return 0 if report["goals_met"] or args.driver not in ("all", "both") else 1
