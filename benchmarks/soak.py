"""A bounded soak: the load harness's ``soak`` profile against a sandboxd server
of its own on the local engine, for a fixed time, while the server's memory,
threads and open files are sampled.

    python -m benchmarks.soak                       # 10 minutes, 100 rollouts in flight
    python -m benchmarks.soak --minutes 1 --concurrency 16   # a short look

What it proves, side by side in one report: zero errors (every operation's
failure is counted by typed reason), zero leaks (containers of the run's
instance, and sandboxes still leased, after the server stops), and a flat
control plane: resident memory after warm-up compared with the end of the run
(the growth and a least-squares slope over the second half are reported; flat
means the last minute's median is within FLAT_GROWTH of the first minute's
after warm-up, and the server's threads and file descriptors end where they
began). Writes benchmarks/results/soak.json (+ soak.png) and prints the JSON
as the last line of stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.load.cli import MAX_WARM_POOL, machine_info, run_driver
from benchmarks.load.profile import load_profile
from benchmarks.load.report import build_report
from benchmarks.load.sandboxd_driver import SandboxdDriver

RESULTS = Path(__file__).resolve().parent / "results"
SAMPLE_SECONDS = 5.0
WARMUP_SECONDS = 60.0
"""Memory before this (pools filling, caches warming) is not held against flatness."""
FLAT_GROWTH = 0.10
"""Flat: the last minute's median RSS at most this much above the first minute's after warm-up."""


def log(msg: str) -> None:
    print(f"[soak] {msg}", file=sys.stderr, flush=True)


def read_process(pid: int) -> dict[str, float] | None:
    """Resident memory (MiB), threads and open descriptors of ``pid``; None once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return {
        "rss_mib": round(int(fields["VmRSS"].split()[0]) / 1024, 1),
        "threads": int(fields["Threads"]),
        "fds": fds,
    }


class ProcessSampler:
    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.samples: list[dict[str, float]] = []
        self._task: asyncio.Task[None] | None = None

    def start(self, pid: int, origin: float) -> None:
        self._task = asyncio.create_task(self._loop(pid, origin), name="soak-process-sampler")

    async def _loop(self, pid: int, origin: float) -> None:
        while True:
            sample = await asyncio.to_thread(read_process, pid)
            if sample is None:
                return
            self.samples.append({"t": round(time.perf_counter() - origin, 1), **sample})
            await asyncio.sleep(self.interval)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


def memory_verdict(samples: list[dict[str, float]], warmup: float, window: float = 60.0) -> dict[str, Any]:
    """Flatness of the server's RSS after ``warmup`` seconds (see the module doc)."""
    after = [s for s in samples if s["t"] >= warmup]
    if len(after) < 4:
        return {"flat": None, "why": f"too few samples after {warmup:g}s of warm-up ({len(after)})"}
    t_end = after[-1]["t"]
    first = [s["rss_mib"] for s in after if s["t"] < after[0]["t"] + window]
    last = [s["rss_mib"] for s in after if s["t"] > t_end - window]
    start_mib, end_mib = statistics.median(first), statistics.median(last)
    half = [s for s in after if s["t"] >= (after[0]["t"] + t_end) / 2]
    slope = _slope([s["t"] for s in half], [s["rss_mib"] for s in half]) * 60.0 if len(half) > 1 else 0.0
    growth = (end_mib - start_mib) / start_mib if start_mib else 0.0
    threads = (after[0]["threads"], after[-1]["threads"])
    fds = (after[0]["fds"], after[-1]["fds"])
    return {
        "rss_start_mib": start_mib,
        "rss_end_mib": end_mib,
        "rss_peak_mib": max(s["rss_mib"] for s in samples),
        "growth": round(growth, 4),
        "slope_mib_per_min_second_half": round(slope, 3),
        "threads_start_end": threads,
        "fds_start_end": fds,
        "flat": growth <= FLAT_GROWTH and threads[1] <= threads[0] * 1.5 + 4 and fds[1] <= fds[0] * 1.5 + 16,
        "criterion": f"last {window:g}s median RSS <= first {window:g}s after warm-up x {1 + FLAT_GROWTH:g}; "
        "threads and fds end within 1.5x of where they began",
    }


def _slope(xs: list[float], ys: list[float]) -> float:
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den if den else 0.0


def plot(result: dict[str, Any], series: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mem = result["process_samples"]
    pool = series.get("timeline", [])
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    ax1.plot([s["t"] for s in mem], [s["rss_mib"] for s in mem], color="tab:blue", label="server RSS (MiB)")
    ax1.axvline(WARMUP_SECONDS, color="grey", ls=":", lw=1)
    ax1.set_ylabel("MiB")
    ax1.set_ylim(bottom=0)
    ax1.grid(alpha=0.3)
    ax1.legend(loc="lower right")
    ax2.plot([s["t"] for s in pool], [s.get("leased", 0) for s in pool], label="leased", color="tab:green")
    ax2.plot([s["t"] for s in pool], [s.get("ready", 0) for s in pool], label="ready", color="tab:orange")
    ax2.set_xlabel("seconds")
    ax2.set_ylabel("sandboxes")
    ax2.grid(alpha=0.3)
    ax2.legend(loc="lower right")
    growth = 100 * (result["memory"].get("growth") or 0)
    fig.suptitle(
        f"soak: {result['minutes']:g} min, {result['concurrency']} in flight, "
        f"{result['errors']} errors, {result['leaked']} leaked, RSS growth {growth:.1f}%"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


async def run(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    seconds = args.minutes * 60.0
    profile = load_profile(
        "soak",
        overrides={"run.max_seconds": seconds, "run.concurrency": args.concurrency, "run.seed": args.seed},
    )
    from sandboxd.images.build import ensure_default_image

    image = args.image or await asyncio.to_thread(ensure_default_image)
    in_flight = profile.run.in_flight
    run_id = f"soak-{os.getpid()}"
    driver = SandboxdDriver(
        run_id=run_id,
        image=image,
        min_ready=min(in_flight, MAX_WARM_POOL),
        # Room for a few warm sandboxes beyond those in flight, so churn is served warm.
        max_size=in_flight + 16,
        target=None,
        pool=None,
        lease_ttl=seconds + 300.0,
        acquire_timeout=min(300.0, seconds),
        backend="docker",
        log=log,
    )
    sampler = ProcessSampler(SAMPLE_SECONDS)
    origin = time.perf_counter()

    async def setup(warm_timeout: float) -> dict[str, Any]:
        info = await driver.setup(warm_timeout)
        assert driver.server is not None
        sampler.start(driver.server.proc.pid, origin)
        return info

    log(f"{args.minutes:g} min, {in_flight} rollouts in flight, image {image}")
    summary, series = await run_driver(
        driver, profile, run_id=run_id, warm_timeout=300.0, progress=False,
        setup=setup, teardown=driver.teardown,
    )  # fmt: skip
    await sampler.stop()
    report = build_report({"profile": "soak"}, {"sandboxd": summary})
    result: dict[str, Any] = {
        "minutes": args.minutes,
        "concurrency": in_flight,
        "errors": report["errors"],
        "errors_by_reason": summary.get("errors", {}),
        "error_samples": summary.get("error_samples", []),
        "leaked": report["leaked"],
        "episodes": summary.get("episodes"),
        "requests": summary.get("requests"),
        "throughput": summary.get("throughput"),
        "stopped_by": summary.get("stopped_by"),
        "latency_ms": {op: summary["latency_ms"][op] for op in sorted(summary.get("latency_ms", {}))},
        "memory": memory_verdict(sampler.samples, min(WARMUP_SECONDS, seconds / 4)),
        "process_samples": sampler.samples,
        "server_cpu_s": summary.get("server_cpu_s"),
        "host_cpu_busy_pct": summary.get("host_cpu_busy_pct"),
        "machine": machine_info(),
        "wall_s": round(time.perf_counter() - origin, 1),
    }
    flat = result["memory"].get("flat") is True
    result["goals_met"] = result["errors"] == 0 and result["leaked"] == 0 and flat
    return result, series


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=(__doc__ or "").split("\n")[0])
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--concurrency", type=int, default=100, help="rollouts in flight")
    p.add_argument("--seed", type=int, default=9)
    p.add_argument("--image", help="sandbox image (default: the built-in rollout image)")
    p.add_argument("--output", type=Path, default=RESULTS / "soak.json")
    p.add_argument("--no-plot", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.minutes <= 0 or args.concurrency < 1:
        parser().error("--minutes must be > 0 and --concurrency >= 1")
    result, series = asyncio.run(run(args))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    if not args.no_plot:
        plot(result, series, args.output.with_suffix(".png"))
    log(
        f"errors {result['errors']}, leaked {result['leaked']}, episodes {result['episodes']}, "
        f"RSS {result['memory'].get('rss_start_mib')} -> {result['memory'].get('rss_end_mib')} MiB "
        f"(flat: {result['memory'].get('flat')})"
    )
    print(json.dumps({k: v for k, v in result.items() if k != "process_samples"}))
    return 0 if result["goals_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
