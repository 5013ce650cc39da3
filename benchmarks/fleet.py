"""Two rollout runs sharing one host's fleet of sandboxes, in one run:
static halves (each run held to its weight's share, ``[fleet] borrowing =
false``) against sharing with borrowing, on the real Docker engine.

Run "a" has the faster generator, run "b" the slower one (1.5x the time
per token), both on the 235B-class model of benchmarks.rollout_sim scaled
down in time, each with its own trainer and concurrency controller. Their
output lengths move opposite ways halfway through: a starts with long
outputs (many rollouts in flight to keep its trainer fed) and ends with
short ones, b the reverse; so each run leaves sandboxes idle while the
other needs more than its half. The two arms run one after the other on a
fresh server each (same seed, same fleet of 8 sandboxes). Trainer idle per
run, fleet throughput (rollouts submitted per second) and the time borrowed
sandboxes took to be given back once their owner needed them. Writes
benchmarks/results/fleet.json (and fleet.png when matplotlib imports) and
prints it last.

    python -m benchmarks.fleet [--seconds 120]
"""

from __future__ import annotations

import argparse
import asyncio
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.loop_real import server, warm
from benchmarks.rollout_sim import ModelProfile, RunResult, RunSpec, run_one
from sandboxd.client import AsyncClient
from sandboxd.core.rollouts.fleet import RECLAIMED
from sandboxd.images.build import ensure_default_image

RESULTS = Path(__file__).parent / "results"
FLEET = 8
RECLAIM_SECONDS = 15.0
B, G, S = 2, 2, 4


def tokens_a(frac: float) -> float:
    """Run a's mean output length: long, then short."""
    return 6500.0 if frac < 0.5 else 400.0


def tokens_b(frac: float) -> float:
    """Run b's mean output length: short, then long."""
    return 400.0 if frac < 0.5 else 4300.0


async def arm(borrowing: bool, seconds: float, image: str) -> dict[str, Any]:
    """Both runs on a fresh server whose fleet borrows or not; the arm's figures."""
    # The trainer's fixed part (optimizer step, weight sync to the inference
    # replicas) at 90 s: a run on short outputs is then held by its trainer and
    # needs few sandboxes, one on long outputs by its generator and many.
    profile = replace(ModelProfile(), train_fixed_seconds=90.0)
    overrides = {
        "fleet.sandboxes": FLEET,
        "fleet.borrowing": borrowing,
        "fleet.reclaim_seconds": RECLAIM_SECONDS,
    }
    async with server(**overrides) as app, AsyncClient(app.address) as client:
        await client.create_pool("fleet", image, min_ready=FLEET, max_size=FLEET)
        await warm(client, "fleet", FLEET)
        specs = [
            RunSpec("a", "fleet", True, 2, B, G, S, profile=profile, speed=1.0, tokens=tokens_a, seed=1),
            RunSpec("b", "fleet", True, 2, B, G, S, profile=profile, speed=1.5, tokens=tokens_b, seed=2),
        ]
        results: list[RunResult] = list(
            await asyncio.gather(*(run_one(client, s, seconds, 2) for s in specs))
        )
        assert app.rollouts is not None and app.rollouts.fleet is not None
        fleet = app.rollouts.fleet.figures()
    a, b = results
    return {
        "idle_a": round(a.idle_ratio, 4),
        "idle_b": round(b.idle_ratio, 4),
        "idle_by_phase_a": {p: round(i / (i + x), 3) if i + x else 0.0 for p, (i, x) in a.phase_idle.items()},
        "idle_by_phase_b": {p: round(i / (i + x), 3) if i + x else 0.0 for p, (i, x) in b.phase_idle.items()},
        "rollouts_per_s": round((a.rollouts + b.rollouts) / seconds, 3),
        "steps": [a.steps, b.steps],
        "mean_concurrency": [round(sum(r.concurrency) / max(1, len(r.concurrency)), 2) for r in results],
        "concurrency": [r.concurrency for r in results],
        "reclaimed_groups": sum((r.figures.filtered.get(RECLAIMED, 0) if r.figures else 0) for r in results),
        "reclaims": fleet.reclaims_closed,
        "reclaims_forced": fleet.reclaims_forced,
        "reclaim_p50_s": round(fleet.reclaim_p50_seconds, 3),
        "reclaim_p99_s": round(fleet.reclaim_p99_seconds, 3),
        "max_staleness": max((r.figures.staleness_trajectory.max if r.figures else 0) for r in results),
    }


async def run(seconds: float) -> dict[str, Any]:
    """The static arm, then the shared one; the result's keys."""
    image = ensure_default_image(log=lambda _: None)
    static = await arm(False, seconds, image)
    shared = await arm(True, seconds, image)
    out: dict[str, Any] = {
        "seconds_per_arm": seconds,
        "fleet_sandboxes": FLEET,
        "reclaim_bound_s": RECLAIM_SECONDS,
        "staleness_budget": S,
        "static_idle_a": static["idle_a"],
        "static_idle_b": static["idle_b"],
        "shared_idle_a": shared["idle_a"],
        "shared_idle_b": shared["idle_b"],
        "static_rollouts_per_s": static["rollouts_per_s"],
        "shared_rollouts_per_s": shared["rollouts_per_s"],
        "throughput_ratio": round(shared["rollouts_per_s"] / max(1e-9, static["rollouts_per_s"]), 3),
        "reclaim_p99_s": shared["reclaim_p99_s"],
        "static": {k: v for k, v in static.items() if k != "concurrency"},
        "shared": {k: v for k, v in shared.items() if k != "concurrency"},
    }
    out["goal_met"] = bool(
        out["shared_idle_a"] < out["static_idle_a"]
        and out["shared_idle_b"] < out["static_idle_b"]
        and out["throughput_ratio"] >= 1.2
        and out["reclaim_p99_s"] <= RECLAIM_SECONDS
    )
    plot(static["concurrency"], shared["concurrency"])
    return out


def plot(static: list[list[int]], shared: list[list[int]]) -> None:
    """Groups in flight per run over time, static beside shared (skipped without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5), sharey=True)
    for ax, series, title in ((axes[0], static, "static halves"), (axes[1], shared, "shared, borrowing")):
        for name, s in zip(("a (fast generator)", "b (slow generator)"), series, strict=True):
            ax.step(range(len(s)), s, where="post", label=name)
        ax.axhline(FLEET // 2, color="grey", lw=0.8, ls="--")
        ax.set_title(title)
        ax.set_xlabel("seconds")
    axes[0].set_ylabel("groups in flight (1 sandbox each)")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "fleet.png", dpi=110)


def main() -> None:
    """Runs both arms, writes fleet.json and prints it (the headline keys last)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120.0, help="seconds per arm")
    args = parser.parse_args()
    result = asyncio.run(run(args.seconds))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "fleet.json").write_text(json.dumps(result, indent=2) + "\n")
    head = (
        "static_idle_a", "static_idle_b", "shared_idle_a", "shared_idle_b", "static_rollouts_per_s",
        "shared_rollouts_per_s", "throughput_ratio", "reclaim_p99_s", "reclaim_bound_s", "goal_met",
    )  # fmt: skip
    print(json.dumps({k: v for k, v in result.items() if k not in head}, indent=2))
    print(json.dumps({k: result[k] for k in head}, indent=2))


if __name__ == "__main__":
    main()
