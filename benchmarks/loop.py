"""Throughput matching, simulated: the rollout queue and its controller
against a fixed-concurrency baseline, on one fake clock, in one run.

The generator runs groups whose duration is the rollout length; the trainer
takes a step time per batch of B groups. Three phases: the trainer faster
than the generator, then slower, then rollouts growing longer (drift).
Rewards make some groups zero-advantage (dropped and backfilled) and some
trajectories fail for infrastructure reasons (masked). Both arms see the
same random draws. Writes benchmarks/results/loop.json and prints it last.

    python -m benchmarks.loop [--seconds 3000] [--seed 1]
    python -m benchmarks.loop --real [--seconds 240]   # on real sandboxes (benchmarks.loop_real)
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.dollars import idle_usd_per_step, prices_entry
from sandboxd.clock import FakeClock
from sandboxd.core.rollouts.model import FilterMode, InfraFailure, RunConfig, Segment, Trajectory
from sandboxd.core.rollouts.queue import RolloutQueue
from sandboxd.errors import ResourceExhausted

RESULTS = Path(__file__).parent / "results" / "loop.json"

B, G, S = 8, 8, 4
FIXED_CONCURRENCY = 10


@dataclass(frozen=True)
class Phase:
    name: str
    until: float
    rollout_start: float
    rollout_end: float
    step_seconds: float


def phases(total: float) -> list[Phase]:
    third = total / 3
    return [
        Phase("trainer faster", third, 10.0, 10.0, 6.0),
        Phase("trainer slower", 2 * third, 10.0, 10.0, 20.0),
        Phase("rollouts growing", total, 10.0, 20.0, 8.0),
    ]


def phase_at(ps: list[Phase], t: float) -> tuple[Phase, float]:
    start = 0.0
    for p in ps:
        if t < p.until:
            frac = (t - start) / (p.until - start)
            return p, p.rollout_start + frac * (p.rollout_end - p.rollout_start)
        start = p.until
    return ps[-1], ps[-1].rollout_end


@dataclass
class Arm:
    name: str
    queue: RolloutQueue
    clock: FakeClock
    rng: random.Random
    events: list[tuple[float, int, str, str]] = field(default_factory=list)
    seq: int = 0
    trainer_busy_until: float | None = None
    idle: float = 0.0
    busy: float = 0.0
    idle_since: float = 0.0
    steps: int = 0
    phase_idle: dict[str, list[float]] = field(default_factory=dict)
    concurrency: list[int] = field(default_factory=list)

    def push(self, at: float, kind: str, data: str = "") -> None:
        self.seq += 1
        heapq.heappush(self.events, (at, self.seq, kind, data))


def make_queue(controller: bool, clock: FakeClock) -> RolloutQueue:
    cfg = RunConfig(
        batch_groups=B,
        group_size=G,
        max_staleness=S,
        filter_mode=FilterMode.DROP_AND_BACKFILL,
        backfill_cap=B,
        controller=controller,
        max_concurrent=0 if controller else FIXED_CONCURRENCY,
        window_seconds=60.0,
    )
    q = RolloutQueue("bench", cfg, clock)
    if controller:
        q.target = FIXED_CONCURRENCY  # same starting point as the baseline
    return q


def rewards(rng: random.Random) -> list[float | None]:
    if rng.random() < 0.2:  # a zero-advantage group: all the same
        value = float(rng.random() < 0.5)
        return [value] * G
    return [None if rng.random() < 0.02 else float(rng.random() < 0.5) for _ in range(G)]


def simulate(arm: Arm, total: float, ps: list[Phase]) -> None:
    q, clock = arm.queue, arm.clock
    stream = q.open_stream()
    arm.push(0.0, "fill")
    arm.push(0.0, "train")
    while arm.events:
        at, _, kind, data = heapq.heappop(arm.events)
        if at > total:
            break
        clock.advance(at - clock.monotonic())
        now = at
        if kind == "done":
            g = q.running.get(data)
            if g is not None:
                ts = []
                for i, r in enumerate(rewards(arm.rng)):
                    t = Trajectory(f"t{i}", b"", [Segment(g.start_version, 100)], reward=r)
                    if r is None:
                        t.failure = InfraFailure.BACKEND
                    ts.append(t)
                q.submit(data, "", ts)
            kind = "fill"
        if kind == "ack":
            q.ack(data)
            q.publish(q.version + 1)
            arm.trainer_busy_until = None
            arm.idle_since = now
            kind = "train"
        if kind in ("fill", "train"):
            _fill(arm, now, ps)
            if arm.trainer_busy_until is None:
                batch = q.next_batch(stream)
                if batch is not None:
                    phase, _ = phase_at(ps, now)
                    waited = now - arm.idle_since
                    arm.idle += waited
                    arm.phase_idle.setdefault(phase.name, [0.0, 0.0])[0] += waited
                    step = phase.step_seconds * arm.rng.uniform(0.9, 1.1)
                    arm.busy += step
                    arm.phase_idle[phase.name][1] += step
                    arm.trainer_busy_until = now + step
                    arm.steps += 1
                    arm.push(now + step, "ack", batch.batch_id)
        if kind == "tick":
            _fill(arm, now, ps)
    if arm.trainer_busy_until is None:
        arm.idle += total - arm.idle_since


def _fill(arm: Arm, now: float, ps: list[Phase]) -> None:
    q = arm.queue
    try:
        slots = q.request_slots(1000)
    except ResourceExhausted as e:
        arm.push(now + (e.retry_after or 1.0), "tick")
        return
    _, length = phase_at(ps, now)
    for g in slots:
        arm.push(now + length * arm.rng.lognormvariate(0, 0.25), "done", g.group_id)
    arm.concurrency.append(len(q.running))


def run(total: float, seed: int) -> dict[str, object]:
    ps = phases(total)
    arms = {}
    for name, controller in (("controller", True), ("fixed", False)):
        clock = FakeClock(start=0.0)
        arm = Arm(name, make_queue(controller, clock), clock, random.Random(seed))
        simulate(arm, total, ps)
        arms[name] = arm
    out: dict[str, object] = {}
    for name, arm in arms.items():
        f = arm.queue.figures()
        out[f"{name}_steps"] = arm.steps
        out[f"{name}_mean_concurrency"] = round(sum(arm.concurrency) / max(1, len(arm.concurrency)), 2)
        out[f"{name}_idle_by_phase"] = {
            p: round(i / (i + b), 3) if i + b else 0.0 for p, (i, b) in arm.phase_idle.items()
        }
        out[f"{name}_max_staleness"] = f.staleness_trajectory.max
        out[f"{name}_filtered"] = f.filtered
    c, fx = arms["controller"], arms["fixed"]
    cf = c.queue.figures()
    # Simulated seconds priced as real ones: the trainer's GPUs cost the same waiting as training.
    for name, arm in arms.items():
        out[f"{name}_idle_usd_per_step"] = idle_usd_per_step(arm.idle, arm.steps)
    out["prices"] = prices_entry()
    out.update(
        {
            "simulated_seconds": total,
            "batch_groups": B,
            "group_size": G,
            "fixed_concurrency": FIXED_CONCURRENCY,
            "controller_trainer_idle": round(c.idle / (c.idle + c.busy), 4),
            "fixed_trainer_idle": round(fx.idle / (fx.idle + fx.busy), 4),
            "controller_max_staleness": cf.staleness_trajectory.max,
            "staleness_budget": S,
            "zero_adv_filtered": cf.filtered.get("zero_std", 0),
            "infra_failures_masked": cf.infra_failures_masked,
        }
    )
    out["goal_met"] = bool(
        out["controller_trainer_idle"] <= 0.5 * out["fixed_trainer_idle"]  # type: ignore[operator]
        and cf.staleness_trajectory.max <= S
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3000.0, help="simulated seconds")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--real", action="store_true", help="on real sandboxes on the Docker engine (benchmarks.loop_real)"
    )
    args = parser.parse_args()
    if args.real:
        from benchmarks import loop_real

        loop_real.main(args.seconds if args.seconds != 3000.0 else 240.0)
        return
    result = run(args.seconds, args.seed)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    last = {k: result[k] for k in (
        "controller_trainer_idle", "fixed_trainer_idle", "controller_max_staleness",
        "staleness_budget", "zero_adv_filtered", "infra_failures_masked",
        "controller_idle_usd_per_step", "fixed_idle_usd_per_step",
    )}  # fmt: skip
    print(json.dumps({k: v for k, v in result.items() if k not in last}, indent=2))
    print(json.dumps(last, indent=2))


if __name__ == "__main__":
    main()
