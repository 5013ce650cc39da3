"""``python -m benchmarks.scale --rollouts 960 --group 8 [--quick]``: the
960-rollout scene on this host, sandboxd against the naive docker-run burst,
each on a throwaway engine of its own (engine.py), one after the other.

Writes benchmarks/results/scale.json (also printed as the last line of
stdout) and a plot of pool state and engine latency over time
(benchmarks/results/scale.png). Every phase has a time bound; the whole run
is bounded by their sum, and both engines are killed and removed at the end,
whatever happened. Goals: ``hung == 0`` and ``orphans == 0``; the exit
status is 0 when both hold.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import docker

from benchmarks.scale.config import Scene
from benchmarks.scale.naive import run_naive
from benchmarks.scale.sandboxd_scene import run_sandboxd

RESULTS = Path(__file__).resolve().parent.parent / "results"
BUDGET_S = 720.0
"""The run's bound; the clean-up of the driver it cuts short (server stop,
engine kill) fits in the rest of 15 minutes."""
KEYS = (
    "admitted", "refused", "hung", "orphans", "warm_rate_per_s", "step_s",
    "naive_step_s", "naive_errors", "engine_degraded_s", "recycled", "reset_p50_ms",
)  # fmt: skip


def log(msg: str) -> None:
    print(f"[scale {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def warm_rate(sd: dict[str, Any]) -> float | None:
    """READY sandboxes per second from the start of the warm-up until READY
    first reached its final level (a Prewarm asking more than the host holds
    waits out its deadline after that)."""
    pool = sd.get("series", {}).get("pool", [])
    start, final = sd.get("warm_start_t"), sd.get("warm_ready")
    fallback: float | None = sd.get("warm_rate_per_s")
    if not pool or start is None or not final:
        return fallback
    reached = next((s["t"] for s in pool if s["t"] >= start and s["ready"] >= final), None)
    if reached is None or reached <= start:
        return fallback
    return round(float(final) / (float(reached) - float(start)), 3)


def summarize(
    scene: Scene, sd: dict[str, Any], nv: dict[str, Any], image: str, off: dict[str, Any] | None = None
) -> dict[str, Any]:
    head = {
        "admitted": sd.get("admitted"),
        "refused": sd.get("refused"),
        "hung": sd.get("hung"),
        "orphans": sd.get("orphans"),
        "warm_rate_per_s": warm_rate(sd),
        "step_s": sd.get("step_s"),
        "naive_step_s": nv.get("step_s"),
        "naive_errors": nv.get("errors"),
        "engine_degraded_s": sd.get("engine_degraded_s"),
        "recycled": sd.get("recycled"),
        "reset_p50_ms": sd.get("reset_p50_ms"),
    }
    goals = {
        "hung": {"goal": "== 0", "value": head["hung"], "met": head["hung"] == 0},
        "orphans": {"goal": "== 0", "value": head["orphans"], "met": head["orphans"] == 0},
    }
    if sd.get("recycle", "off") != "off":
        # Recycled sandboxes are starts the host no longer waits for: the step fits.
        n = scene.rollouts
        goals["admitted"] = {"goal": f"== {n}", "value": head["admitted"], "met": head["admitted"] == n}
        goals["refused"] = {"goal": "== 0", "value": head["refused"], "met": head["refused"] == 0}
    return {
        **head,
        "goals": goals,
        "goals_met": all(g["met"] for g in goals.values()),
        "scene": asdict(scene),
        "image": image,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {
            "nproc": len(os.sched_getaffinity(0)),
            "kernel": platform.release(),
            "loadavg_1m": round(os.getloadavg()[0], 2),
        },
        "sandboxd": {k: v for k, v in sd.items() if k != "series"},
        "naive": {k: v for k, v in nv.items() if k != "series"},
        **({"sandboxd_recycle_off": {k: v for k, v in off.items() if k != "series"}} if off else {}),
    }


def plot(sd: dict[str, Any], nv: dict[str, Any], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_pool, ax_naive, ax_lat) = plt.subplots(3, 1, figsize=(11, 10), sharex=False)
    pool = sd.get("series", {}).get("pool", [])
    ts = [s["t"] for s in pool]
    for key in ("ready", "leased", "starting", "waiting", "in_doubt"):
        ax_pool.plot(ts, [s[key] for s in pool], label=key, lw=1.4)
    for a, b in itertools.pairwise(pool):
        if a["degraded"]:
            ax_pool.axvspan(a["t"], b["t"], color="tab:red", alpha=0.15, lw=0)
    for key, name in (("warm_start_t", "warm"), ("step_start_t", "step")):
        if sd.get(key) is not None:
            ax_pool.axvline(sd[key], color="k", lw=0.8, ls=":")
            ax_pool.text(sd[key], ax_pool.get_ylim()[1] * 0.95, f" {name}", fontsize=8, va="top")
    ax_pool.set_title("sandboxd: pool state (red: engine degraded)")
    ax_pool.set_ylabel("sandboxes / waiters")
    ax_naive.set_xlabel("seconds since the driver's engine started")
    state = nv.get("series", {}).get("state", [])
    for key in ("running", "done", "failed"):
        ax_naive.plot([s["t"] for s in state], [s[key] for s in state], label=key, lw=1.4)
    ax_naive.set_title("naive docker-run burst: rollouts")
    ax_naive.set_ylabel("rollouts")
    for name, d, color in (("sandboxd", sd, "tab:blue"), ("naive", nv, "tab:red")):
        lat = d.get("series", {}).get("engine_latency", [])
        ok = [s for s in lat if s["latency_s"] is not None]
        ax_lat.plot([s["t"] for s in ok], [s["latency_s"] for s in ok], ".", ms=3, color=color, label=name)
        lost = [s["t"] for s in lat if s["latency_s"] is None]
        if lost:
            ax_lat.plot(lost, [10.0] * len(lost), "x", color=color, label=f"{name}: no answer in 10 s")
    ax_lat.set_yscale("log")
    ax_lat.set_title("engine latency (container listing, once a second; each driver on its own engine)")
    ax_lat.set_ylabel("seconds (log)")
    ax_lat.set_xlabel("seconds since the driver's engine started")
    for ax in (ax_pool, ax_naive, ax_lat):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="upper right")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


async def run(
    scene: Scene, image: str, only: str, budget: float, recycle: str = "same-tenant"
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], str]:
    """The drivers one after the other, within ``budget`` seconds (then the
    one running is cut short and cleans up); returns their results (sandboxd
    as ``recycle`` says, the naive burst, sandboxd with recycling off when
    ``recycle`` is "both") and why the run ended."""
    host = docker.from_env(timeout=120)
    sd: dict[str, Any] = {}
    nv: dict[str, Any] = {}
    off: dict[str, Any] = {}

    async def drivers() -> None:
        if only in ("both", "sandboxd"):
            await run_sandboxd(scene, image, host, log, sd, "same-tenant" if recycle == "both" else recycle)
        if only in ("both", "naive"):
            await run_naive(scene, image, host, log, nv)
        if only in ("both", "sandboxd") and recycle == "both":
            await run_sandboxd(scene, image, host, log, off, "off")

    stopped_by = "completed"
    try:
        await asyncio.wait_for(drivers(), budget)
    except TimeoutError:
        stopped_by = f"budget ({budget:g}s)"
        log(f"the run's budget of {budget:g}s ran out; what ran was cut short and cleaned up")
    finally:
        host.close()
    return sd, nv, off, stopped_by


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.scale", description=(__doc__ or "").split("\n")[0])
    p.add_argument("--rollouts", type=int, help="rollouts of the step (default 960; 48 with --quick)")
    p.add_argument("--group", type=int, default=8, help="sandboxes each group acquires at once")
    p.add_argument("--quick", action="store_true", help="a small scene with short bounds (smoke test)")
    p.add_argument("--driver", choices=["both", "sandboxd", "naive"], default="both")
    p.add_argument("--image", help="sandbox image (default: the default sandboxd image, built if missing)")
    p.add_argument(
        "--recycle",
        choices=["same-tenant", "off", "both"],
        default="same-tenant",
        help="the pool's recycle setting; off: every released sandbox destroyed (the behaviour before "
        "recycling); both: same-tenant, then off in the same run (default %(default)s)",
    )
    p.add_argument(
        "--budget",
        type=float,
        default=BUDGET_S,
        metavar="SECONDS",
        help="the whole run's bound before clean-up (default %(default)gs)",
    )
    p.add_argument("--output", type=Path, default=RESULTS / "scale.json")
    p.add_argument("--no-plot", dest="plot", action="store_false")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    rollouts = args.rollouts or (48 if args.quick else 960)
    if rollouts <= 0 or args.group <= 0 or rollouts % args.group:
        parser().error("--rollouts must be a positive multiple of --group")
    scene = Scene.quick(rollouts, args.group) if args.quick else Scene().sized(rollouts, args.group)
    image = args.image
    if image is None:
        from sandboxd.images.build import ensure_default_image

        image = ensure_default_image()
    log(f"{rollouts} rollouts in groups of {args.group}; at most {args.budget:g}s, then clean-up")

    async def go() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], str]:
        task = asyncio.current_task()
        assert task is not None
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        return await run(scene, image, args.driver, args.budget, args.recycle)

    t0 = time.perf_counter()
    sd, nv, off, stopped_by = asyncio.run(go())
    report = summarize(scene, sd, nv, image, off)
    report["stopped_by"] = stopped_by
    report["wall_s"] = round(time.perf_counter() - t0, 1)
    out: Path = args.output
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.plot:
        try:
            png = out.with_suffix(".png")
            plot(sd, nv, png, f"{rollouts} rollouts, groups of {args.group}: sandboxd vs naive docker run")
            report["plot"] = png.name
        except ImportError as e:
            log(f"no plot ({e}); install the dev extras for matplotlib")
    out.write_text(json.dumps(report, indent=2) + "\n")
    for key in KEYS:
        log(f"{key}: {report[key]}")
    print(json.dumps(report, separators=(",", ":")))
    return 0 if report["goals_met"] else 1
