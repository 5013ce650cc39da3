"""Throughput matching on real sandboxes: ``python -m benchmarks.loop --real``.

Two runs side by side on one server on the Docker engine, same model, same
drift, same seed: one with the controller, one at fixed concurrency (the
baseline). Generation and training follow a 235B-class model on H200s
scaled down in time (benchmarks.rollout_sim.ModelProfile); output lengths
grow over the run (1500 to 4000 tokens per trajectory), so generation per
token slows down with the context and the concurrency the trainer needs
grows. Every rollout's tool calls and reward run in a sandbox leased from
the server's pool, through the rollout queue. Dollars at the default
[cost] prices (8 H200 at $1.59/GPU-hour), over modelled (unscaled) time.
Writes benchmarks/results/loop.real.json and prints it last.

    python -m benchmarks.loop --real [--seconds 240]
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import docker

from benchmarks.rollout_sim import ModelProfile, RunResult, RunSpec, run_one
from sandboxd.app import App, build_app
from sandboxd.backends.base import LABEL_INSTANCE
from sandboxd.client import AsyncClient
from sandboxd.cost_settings import CostSettings
from sandboxd.images.build import ensure_default_image
from sandboxd.settings import load_settings

RESULTS = Path(__file__).parent / "results" / "loop.real.json"
B, G, S = 2, 4, 5
FIXED_CONCURRENCY = 2
PHASES = 3


def tokens(frac: float) -> float:
    """Output length drift: 1500 tokens per trajectory at the start, 4000 at the end."""
    return 1500.0 + 2500.0 * frac


@contextlib.asynccontextmanager
async def server(**overrides: Any) -> AsyncIterator[App]:
    """An in-process server on the Docker engine with a fresh instance id;
    whatever it leaves behind is removed at the end."""
    with tempfile.TemporaryDirectory() as state:
        settings = load_settings(
            None,
            {
                "instance_id": "bench-" + secrets.token_hex(4),
                "state_dir": state,
                "server.port": 0,
                **overrides,
            },
        )
        app = build_app(settings)
        await app.start()
        try:
            yield app
        finally:
            await app.stop(grace=1)
            engine = docker.from_env()
            for c in engine.containers.list(
                all=True, filters={"label": f"{LABEL_INSTANCE}={settings.instance_id}"}
            ):
                with contextlib.suppress(docker.errors.APIError):
                    c.remove(force=True)


async def warm(client: AsyncClient, pool: str, ready: int) -> None:
    """Waits (bounded) until the pool has ``ready`` sandboxes READY."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 180
    while (await client.get_pool(pool)).status.ready < ready:
        if loop.time() > deadline:
            raise TimeoutError(f"pool {pool} did not reach {ready} ready sandboxes in 180 s")
        await asyncio.sleep(0.5)  # polling the pool's status, bounded by the deadline


def idle_usd_per_step(r: RunResult, profile: ModelProfile, prices: CostSettings) -> float:
    """The trainer's idle dollars per step in modelled time (benchmark seconds / time_scale)."""
    if not r.steps:
        return 0.0
    return r.idle_seconds / profile.time_scale * prices.trainer_usd_per_second / r.steps


def summary(name: str, r: RunResult) -> dict[str, Any]:
    """One arm's figures under its name's prefix."""
    f = r.figures
    return {
        f"{name}_steps": r.steps,
        f"{name}_rollouts": r.rollouts,
        f"{name}_mean_concurrency": round(sum(r.concurrency) / max(1, len(r.concurrency)), 2),
        f"{name}_idle_by_phase": {
            p: round(i / (i + b), 3) if i + b else 0.0 for p, (i, b) in r.phase_idle.items()
        },
        f"{name}_max_staleness": f.staleness_trajectory.max if f else 0,
        f"{name}_filtered": dict(f.filtered) if f else {},
        f"{name}_cancelled_groups": r.cancelled,
        f"{name}_lifecycle_bottleneck": f.lifecycle.bottleneck if f else "",
    }


async def run(seconds: float) -> dict[str, Any]:
    """Both arms at once for ``seconds``; the result's keys."""
    image = ensure_default_image(log=lambda _: None)
    profile = ModelProfile()
    prices = CostSettings()
    controller_workers = (S + 1) * B
    async with server() as app, AsyncClient(app.address) as client:
        # Every worker's first sandbox is warm: the arms start on rollouts, not on container starts.
        size = controller_workers + FIXED_CONCURRENCY
        await client.create_pool("loop", image, min_ready=size, max_size=size)
        await warm(client, "loop", size)
        shape = {"batch_groups": B, "group_size": G, "max_staleness": S, "profile": profile, "tokens": tokens}
        arms = {
            # Both start at the fixed concurrency: the controller moves from there.
            "controller": RunSpec("controller", "loop", True, FIXED_CONCURRENCY, **shape),  # type: ignore[arg-type]
            "fixed": RunSpec("fixed", "loop", False, FIXED_CONCURRENCY, workers=FIXED_CONCURRENCY, **shape),  # type: ignore[arg-type]
        }
        results = await asyncio.gather(*(run_one(client, spec, seconds, PHASES) for spec in arms.values()))
    c, fx = results
    out: dict[str, Any] = {"real": True}
    out.update(summary("controller", c))
    out.update(summary("fixed", fx))
    out.update(
        {
            "seconds": seconds,
            "model": profile.name,
            "time_scale": profile.time_scale,
            "batch_groups": B,
            "group_size": G,
            "fixed_concurrency": FIXED_CONCURRENCY,
            "tokens_start": tokens(0.0),
            "tokens_end": tokens(1.0),
            "controller_trainer_idle": round(c.idle_ratio, 4),
            "fixed_trainer_idle": round(fx.idle_ratio, 4),
            "controller_max_staleness": c.figures.staleness_trajectory.max if c.figures else 0,
            "staleness_budget": S,
            "controller_idle_usd_per_step": round(idle_usd_per_step(c, profile, prices), 4),
            "fixed_idle_usd_per_step": round(idle_usd_per_step(fx, profile, prices), 4),
            "gpu_hour_usd": prices.gpu_hour_usd,
            "trainer_gpus": prices.trainer_gpus,
        }
    )
    out["goal_met"] = bool(out["controller_trainer_idle"] <= 0.05 and out["controller_max_staleness"] <= S)
    return out


def main(seconds: float) -> None:
    """Runs the benchmark, writes its JSON and prints it (the headline keys last)."""
    result = asyncio.run(run(seconds))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    last = {k: result[k] for k in (
        "controller_trainer_idle", "fixed_trainer_idle", "controller_max_staleness", "staleness_budget",
        "controller_idle_usd_per_step", "fixed_idle_usd_per_step", "goal_met",
    )}  # fmt: skip
    print(json.dumps({k: v for k, v in result.items() if k not in last}, indent=2))
    print(json.dumps(last, indent=2))
