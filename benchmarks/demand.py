"""Demand-following pools on the real Docker engine, in one run:

(a) burst: a demand pool holding W warm sandboxes gets 10 x W concurrent
    single-sandbox acquires at once; failures and latency percentiles;
(b) steps: a replay of synchronous RL steps (groups of rollouts acquired at
    the start of each step, long-tailed rollout lengths, a training phase
    between steps) on a demand pool that gets the loop's announcement at the
    start of every training phase ("in ~T s I will run N rollouts");
(c) the same replay (same seed, same lengths) on a fixed-size pool of N
    (min_ready = N): the baseline. (b) and (c) run side by side on one
    server, so both meet the same engine and the same background load (the
    machine may be shared); their busy phases hardly overlap (the demand pool
    warms while the trainer trains, the fixed pool refills while rollouts run).

    python -m benchmarks.demand            # ~3-4 minutes on 2 cores
    python -m benchmarks.demand --quick    # a smoke run

The server runs as a child process (``sandboxd serve``) with its own instance
id; pool state is sampled through the WatchPool stream. Idle warm
sandbox-seconds integrate READY sandboxes over the replay. It writes
benchmarks/results/demand.json (printed as the last line) and plots pool size
and demand over time to benchmarks/results/demand.png.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import math
import os
import platform
import random
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import docker
import grpc
import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sandboxd.backends.base import LABEL_INSTANCE
from sandboxd.client import AsyncClient
from sandboxd.images.build import ensure_default_image

RESULTS = Path(__file__).resolve().parent / "results"
JSON_PATH = RESULTS / "demand.json"
PNG_PATH = RESULTS / "demand.png"


@dataclass(frozen=True)
class Config:
    burst_warm: int = 3
    """W: warm size before the burst; the burst is 10 x W acquires."""
    groups: int = 8
    group_size: int = 2
    steps: int = 5
    train_seconds: float = 14.0
    rollout_median_seconds: float = 3.0
    rollout_sigma: float = 0.8
    rollout_cap_seconds: float = 15.0
    idle_seconds: float = 4.0
    """Scale-down delay of the demand pool."""
    max_starting: int = 6
    seed: int = 20261129

    @classmethod
    def quick(cls) -> Config:
        return cls(
            burst_warm=2, groups=4, group_size=2, steps=2, train_seconds=6.0, rollout_median_seconds=1.5
        )

    @property
    def per_step(self) -> int:
        return self.groups * self.group_size


def log(msg: str) -> None:
    print(f"[demand] {msg}", file=sys.stderr, flush=True)


def percentile(samples: Sequence[float], q: float) -> float:
    if not samples:
        return math.nan
    ordered = sorted(samples)
    k = (len(ordered) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summary_ms(samples: Sequence[float]) -> dict[str, float]:
    return {
        "n": len(samples),
        "p50_ms": round(percentile(samples, 0.5) * 1000, 2),
        "p99_ms": round(percentile(samples, 0.99) * 1000, 2),
        "max_ms": round(max(samples, default=math.nan) * 1000, 2),
    }


# -- the server ---------------------------------------------------------------------


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    os.setsid()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """``sandboxd serve`` with a TOML config of the benchmark's pool settings."""

    def __init__(self, cfg: Config) -> None:
        self.instance = f"demand-{secrets.token_hex(4)}"
        self.dir = Path(tempfile.mkdtemp(prefix="sandboxd-demand-"))
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        config = self.dir / "sandboxd.toml"
        config.write_text(
            "[pools]\n"
            f"max_starting = {cfg.max_starting}\n"
            "scale_down_delay_seconds = 30.0\n"
            "liveness_interval_seconds = 5.0\n"
            "reconcile_interval_seconds = 0.25\n"
        )
        self.log_path = self.dir / "server.log"
        self._log = self.log_path.open("wb")
        cmd = [
            sys.executable, "-m", "sandboxd.cli", "--log-level", "WARNING", "serve",
            "--config", str(config), "--host", "127.0.0.1", "--port", str(self.port),
            "--instance", self.instance, "--state-dir", str(self.dir),
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            cmd,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
        )

    async def wait_healthy(self, within: float = 60.0) -> None:
        deadline = time.monotonic() + within
        async with grpc.aio.insecure_channel(self.address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"server exited:\n{self.log_path.read_text()[-3000:]}")
                with contextlib.suppress(grpc.aio.AioRpcError):
                    reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                if time.monotonic() > deadline:
                    raise TimeoutError("server not healthy")
                await asyncio.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def sweep(instance: str) -> int:
    """Removes what the run left on the engine; returns how many were left."""
    engine = docker.from_env()
    left = engine.containers.list(all=True, filters={"label": f"{LABEL_INSTANCE}={instance}"})
    for c in left:
        with contextlib.suppress(docker.errors.APIError):
            c.remove(force=True)
    engine.close()
    return len(left)


# -- sampling pool state through WatchPool ---------------------------------------------


@dataclass
class Series:
    t: list[float] = field(default_factory=list)
    ready: list[int] = field(default_factory=list)
    leased: list[int] = field(default_factory=list)
    starting: list[int] = field(default_factory=list)
    target: list[int] = field(default_factory=list)
    announced: list[int] = field(default_factory=list)

    def idle_sandbox_seconds(self, start: float, end: float) -> float:
        total = 0.0
        for i in range(len(self.t) - 1):
            a, b = max(self.t[i], start), min(self.t[i + 1], end)
            if b > a:
                total += self.ready[i] * (b - a)
        return total


async def watch(client: AsyncClient, pool: str, series: Series, t0: float) -> None:
    async for update in client.watch_pools(pool, interval=0.1):
        (s,) = update.pools
        series.t.append(time.monotonic() - t0)
        series.ready.append(s.ready)
        series.leased.append(s.leased)
        series.starting.append(s.starting)
        series.target.append(s.warm_target)
        series.announced.append(s.announced)


async def wait_pool(client: AsyncClient, pool: str, pred: Any, within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while True:
        p = await client.get_pool(pool)
        if pred(p.status):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: {p.status}")
        await asyncio.sleep(0.1)


# -- (a) burst ------------------------------------------------------------------------


async def burst(client: AsyncClient, image: str, cfg: Config) -> dict[str, Any]:
    pool = "burst"
    n = 10 * cfg.burst_warm
    await client.create_pool(pool, image, min_ready=0, max_size=n + cfg.burst_warm, max_ready=n)
    await client.prewarm(pool, cfg.burst_warm, wait=True, timeout=120, source="warm-up")
    await client.set_demand(pool, 0, source="warm-up")  # withdraw: W stay warm (scale-down delay)
    log(f"burst: {n} acquires against {cfg.burst_warm} warm")
    latencies: list[float] = []
    failures: list[str] = []
    leases = []

    async def one() -> None:
        t = time.perf_counter()
        try:
            leases.append(await client.lease(pool, 1, timeout=180))
            latencies.append(time.perf_counter() - t)
        except Exception as e:
            failures.append(f"{type(e).__name__}: {e}")

    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(n)))
    elapsed = time.perf_counter() - t0
    await asyncio.gather(*(lease.release() for lease in leases))
    status = (await client.get_pool(pool)).status
    await client.delete_pool(pool, force=True)
    return {
        "acquires": n,
        "warm_before": cfg.burst_warm,
        "failures": len(failures),
        "failure_samples": failures[:3],
        "seconds": round(elapsed, 2),
        "latency": summary_ms(latencies),
        "failed_creates": status.failed_total,
    }


# -- (b), (c) step replay ----------------------------------------------------------------


def plan_lengths(cfg: Config) -> list[list[list[float]]]:
    """Rollout lengths per step, group, rollout (lognormal, capped)."""
    rng = random.Random(cfg.seed)
    mu = math.log(cfg.rollout_median_seconds)
    return [
        [
            [
                min(cfg.rollout_cap_seconds, rng.lognormvariate(mu, cfg.rollout_sigma))
                for _ in range(cfg.group_size)
            ]
            for _ in range(cfg.groups)
        ]
        for _ in range(cfg.steps)
    ]


async def replay(
    client: AsyncClient, image: str, cfg: Config, lengths: list[list[list[float]]], *, announced: bool
) -> dict[str, Any]:
    pool = "steps" if announced else "fixed"
    n = cfg.per_step
    if announced:
        await client.create_pool(
            pool, image, min_ready=0, max_size=2 * n, max_ready=n, idle_seconds=cfg.idle_seconds
        )
    else:
        await wait_pool(client, pool, lambda s: s.ready == n, 180, "fixed pool warm")
    series = Series()
    t0 = time.monotonic()
    watcher = asyncio.create_task(watch(client, pool, series, t0))
    latencies: list[float] = []
    failures = 0
    step_marks: list[tuple[float, float]] = []  # (training start, step start)

    async def rollout_group(lengths_g: list[float]) -> None:
        nonlocal failures
        t = time.perf_counter()
        try:
            lease = await client.lease(pool, len(lengths_g), timeout=120, lease_ttl=120)
        except Exception as e:
            failures += 1
            log(f"acquire failed: {e}")
            return
        latencies.append(time.perf_counter() - t)
        try:
            await asyncio.gather(*(rollout(sb, d) for sb, d in zip(lease, lengths_g, strict=True)))
        finally:
            await lease.release()

    async def rollout(sb: Any, seconds: float) -> None:
        await sb.exec(["true"])
        await asyncio.sleep(seconds)

    for step in range(cfg.steps):
        train_start = time.monotonic() - t0
        if announced:
            await client.set_demand(pool, n, in_seconds=cfg.train_seconds, ttl=60, source="trainer")
        await asyncio.sleep(cfg.train_seconds)  # the trainer trains on the previous step
        step_start = time.monotonic() - t0
        step_marks.append((train_start, step_start))
        log(f"{pool}: step {step + 1}/{cfg.steps}")
        await asyncio.gather(*(rollout_group(g) for g in lengths[step]))
    end = time.monotonic() - t0
    await asyncio.sleep(0.3)
    watcher.cancel()
    with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
        await watcher
    status = (await client.get_pool(pool)).status
    await client.delete_pool(pool, force=True)
    return {
        "pool": pool,
        "announced": announced,
        "acquire": summary_ms(latencies),
        "acquire_failures": failures,
        "idle_warm_sandbox_seconds": round(series.idle_sandbox_seconds(0.0, end), 1),
        "seconds": round(end, 1),
        "failed_creates": status.failed_total,
        "series": asdict(series),
        "steps": step_marks,
    }


# -- the plot ------------------------------------------------------------------------------


def plot(steps: dict[str, Any], fixed: dict[str, Any], cfg: Config, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 1, figsize=(11, 7), sharex=True)
    for ax, run, title in (
        (axes[0], steps, "demand pool with announced demand"),
        (axes[1], fixed, f"fixed pool (min_ready = {cfg.per_step})"),
    ):
        s = run["series"]
        ax.step(s["t"], s["ready"], where="post", label="READY (warm, idle)", color="tab:green")
        ax.step(s["t"], s["leased"], where="post", label="leased (in use)", color="tab:blue")
        ax.step(s["t"], s["starting"], where="post", label="starting", color="tab:orange", alpha=0.7)
        if run["announced"]:
            ax.step(s["t"], s["announced"], where="post", label="announced, not yet acquired",
                    color="tab:red", linestyle="--")  # fmt: skip
            ax.step(s["t"], s["target"], where="post", label="warm target", color="tab:gray", linestyle=":")
        for i, (train, start) in enumerate(run["steps"]):
            ax.axvspan(
                train, start, color="tab:purple", alpha=0.07, label="training phase" if i == 0 else None
            )
            ax.axvline(start, color="tab:purple", alpha=0.4, linewidth=0.8)
        ax.set_ylabel("sandboxes")
        ax.set_title(
            f"{title}: acquire p99 {run['acquire']['p99_ms']:.0f} ms, "
            f"idle warm {run['idle_warm_sandbox_seconds']:.0f} sandbox-s"
        )
        ax.legend(loc="upper right", fontsize=8)
        ax.grid(alpha=0.3)
    axes[1].set_xlabel("seconds since the replay started")
    fig.suptitle(
        f"{cfg.steps} steps x {cfg.groups} groups x {cfg.group_size} rollouts, "
        f"lognormal lengths (median {cfg.rollout_median_seconds:g} s), {cfg.train_seconds:g} s training"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- main ------------------------------------------------------------------------------------


async def run(cfg: Config, image: str, server: Server) -> dict[str, Any]:
    await server.wait_healthy()
    async with AsyncClient(server.address) as client:
        burst_result = await burst(client, image, cfg)
        log(f"burst: {burst_result['failures']} failures, p99 {burst_result['latency']['p99_ms']} ms")
        lengths = plan_lengths(cfg)
        # The fixed pool is filled first; then both replays run side by side.
        await client.create_pool("fixed", image, min_ready=cfg.per_step, max_size=2 * cfg.per_step)
        await wait_pool(client, "fixed", lambda s: s.ready == cfg.per_step, 180, "fixed pool warm")
        steps, fixed = await asyncio.gather(
            replay(client, image, cfg, lengths, announced=True),
            replay(client, image, cfg, lengths, announced=False),
        )
        log(f"announced: p99 {steps['acquire']['p99_ms']} ms, idle {steps['idle_warm_sandbox_seconds']}")
        log(f"fixed: p99 {fixed['acquire']['p99_ms']} ms, idle {fixed['idle_warm_sandbox_seconds']}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    plot(steps, fixed, cfg, PNG_PATH)
    strip = ("series", "steps")
    return {
        "burst_failures": burst_result["failures"],
        "burst_p99_ms": burst_result["latency"]["p99_ms"],
        "step_acquire_p99_ms": steps["acquire"]["p99_ms"],
        "fixed_pool_acquire_p99_ms": fixed["acquire"]["p99_ms"],
        "idle_warm_sandbox_seconds": steps["idle_warm_sandbox_seconds"],
        "fixed_pool_idle_warm_sandbox_seconds": fixed["idle_warm_sandbox_seconds"],
        "goals": {
            "zero_burst_failures": burst_result["failures"] == 0,
            "p99_within_2x_of_fixed": steps["acquire"]["p99_ms"] <= 2 * max(fixed["acquire"]["p99_ms"], 1.0),
            "idle_at_most_half_of_fixed": steps["idle_warm_sandbox_seconds"]
            <= 0.5 * fixed["idle_warm_sandbox_seconds"],
        },
        "burst": burst_result,
        "steps": {k: v for k, v in steps.items() if k not in strip},
        "fixed_pool": {k: v for k, v in fixed.items() if k not in strip},
        "config": asdict(cfg),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "kernel": platform.release(),
        },
        "plot": str(PNG_PATH.relative_to(Path.cwd()) if PNG_PATH.is_relative_to(Path.cwd()) else PNG_PATH),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a small smoke run")
    args = parser.parse_args(argv)
    cfg = Config.quick() if args.quick else Config()
    image = ensure_default_image(log=log)
    server = Server(cfg)
    started = time.monotonic()
    try:
        report = asyncio.run(run(cfg, image, server))
    finally:
        server.stop()
        leaked = sweep(server.instance)
    report["leaked"] = leaked
    report["wall_seconds"] = round(time.monotonic() - started, 1)
    JSON_PATH.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
