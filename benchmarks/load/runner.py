"""Plays a profile on one driver: bounded, sampled, with a progress bar.

Modes:
- ``step-sync``: per step, every group is created first and all start at the
  same instant; the step ends when the last group has released. Steps run
  one after another; each step's wall time is what a GRPO training step would
  wait for its rollouts.
- ``burst``: one step of everything at once (the step time is the makespan).
- ``open``: groups start as a Poisson process (``arrival_rate`` per second,
  seeded) or back to back, at most ``concurrency`` rollouts in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from benchmarks.load.episode import Driver, Plan, Tally, plan_episode, run_group
from benchmarks.load.profile import Profile
from benchmarks.load.stats import Bounds, OpFailed, Recorder, Stopped

SAMPLE_INTERVAL = 0.5
HARD_STOP_GRACE = 60.0
"""After max_seconds, episodes have this long to release before they are cancelled."""


class SampledDriver(Driver, Protocol):
    async def sample(self) -> dict[str, int]: ...


@runtime_checkable
class RefillDriver(Protocol):
    """A driver whose pool the harness can tell when to refill (step-sync, refill between-steps)."""

    async def hold_refill(self) -> None: ...

    async def refill(self, timeout: float) -> None:
        """Restores the pool's floor and waits until it is warm."""
        ...


async def _quiet(call: Awaitable[Any]) -> None:
    """Awaits a recorded call whose failure is already counted."""
    with contextlib.suppress(OpFailed, Stopped):
        await call


class Progress(Protocol):
    def update(self, n: int = 1) -> Any: ...
    def close(self) -> None: ...


class _NoProgress:
    def update(self, n: int = 1) -> None:
        return None

    def close(self) -> None:
        return None


def make_progress(total: int, desc: str, enabled: bool) -> Progress:
    if not enabled:
        return _NoProgress()
    try:
        from tqdm import tqdm
    except ImportError:  # the dev extra is not installed: no bar, still a run
        return _NoProgress()
    return tqdm(total=total, desc=desc, unit="rollout", dynamic_ncols=True, leave=True)


def groups_of(plans: Sequence[Plan], size: int) -> list[list[Plan]]:
    return [list(plans[i : i + size]) for i in range(0, len(plans), size)]


class Sampler:
    """Pool size and demand every ``interval`` seconds, as (t, sample) pairs;
    t counts from ``origin`` (negative during warm-up)."""

    def __init__(self, driver: SampledDriver, interval: float = SAMPLE_INTERVAL) -> None:
        self.driver = driver
        self.interval = interval
        self.origin = time.perf_counter()
        self.samples: list[dict[str, float]] = []
        self.errors = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="load-sampler")

    async def _loop(self) -> None:
        while True:
            t = time.perf_counter()
            try:
                s = await asyncio.wait_for(self.driver.sample(), self.interval * 4)
                self.samples.append({"t": t, **s})
            except Exception:
                self.errors += 1
            await asyncio.sleep(max(0.0, self.interval - (time.perf_counter() - t)))

    def timeline(self) -> list[dict[str, float]]:
        """The samples with t in seconds since ``origin``."""
        return [{**s, "t": round(s["t"] - self.origin, 3)} for s in self.samples]

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


async def play_profile(
    driver: SampledDriver,
    profile: Profile,
    *,
    run_id: str,
    progress: bool = False,
    sampler: Sampler | None = None,
    log: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """Runs the profile's episodes on a driver that is set up; returns the raw measurements."""
    run = profile.run
    bounds = Bounds(run.max_seconds, run.max_requests)
    rec = Recorder(bounds, driver.classify)
    tally = Tally()
    timeout = profile.episode.exec_timeout_seconds
    bar = make_progress(run.rollouts * run.steps, driver.name, progress)
    steps: list[float] = []
    starts: list[float] = []
    loop = asyncio.get_running_loop()
    t0 = time.perf_counter()
    if sampler is not None:
        sampler.origin = t0
    soft = loop.call_later(run.max_seconds, bounds.halt, "max_seconds")

    async def group(
        plans: list[Plan], labels: dict[str, str], on_acquired: Callable[[], None] = lambda: None
    ) -> None:
        await run_group(driver, rec, plans, labels, timeout, tally, on_acquired)
        bar.update(len(plans))

    refills = run.refill == "between-steps" and isinstance(driver, RefillDriver)
    gaps: list[float] = []

    async def between_steps() -> None:
        """The trainer's update: at least step_gap_seconds; with refill
        between-steps, also until the pool is warm again (the excess is reported)."""
        g0 = time.perf_counter()
        if refills:
            assert isinstance(driver, RefillDriver)
            left = max(1.0, run.max_seconds - (g0 - t0))
            with contextlib.suppress(OpFailed):
                await rec.call("refill", lambda: driver.refill(left), cleanup=True)
        rest = run.step_gap_seconds - (time.perf_counter() - g0)
        if rest > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(bounds.stop.wait(), rest)
        gaps.append(time.perf_counter() - g0)

    async def body() -> None:
        if run.mode in ("step-sync", "burst"):
            for step in range(run.steps):
                if step > 0:
                    await between_steps()
                if bounds.stop.is_set():
                    break
                plans = [plan_episode(profile, r, step) for r in range(run.rollouts)]
                batches = groups_of(plans, run.group_size)
                go = asyncio.Event()
                hold: list[asyncio.Task[None]] = []
                pending = [len(batches)]

                def acquired(pending: list[int] = pending, hold: list[asyncio.Task[None]] = hold) -> None:
                    pending[0] -= 1
                    if pending[0] == 0 and refills:  # every group holds its sandboxes: stop refilling
                        assert isinstance(driver, RefillDriver)
                        hold.append(asyncio.create_task(_quiet(rec.call("hold_refill", driver.hold_refill))))

                async def gated(
                    plans: list[Plan], g: int, go: asyncio.Event = go, step: int = step, done: Any = acquired
                ) -> None:
                    await go.wait()
                    await group(plans, {"run": run_id, "step": str(step), "group": str(g)}, done)

                tasks = [asyncio.create_task(gated(p, g)) for g, p in enumerate(batches)]
                await asyncio.sleep(0)  # every task is parked on the gate
                s0 = time.perf_counter()
                starts.append(s0 - t0)
                go.set()
                await asyncio.gather(*tasks)
                steps.append(time.perf_counter() - s0)
                await asyncio.gather(*hold)
                log(f"{driver.name}: step {step} took {steps[-1]:.2f}s")
        else:
            plans = [plan_episode(profile, r, 0) for r in range(run.rollouts)]
            limit = asyncio.Semaphore(max(1, run.in_flight // run.group_size))
            rng = random.Random(f"{run.seed}/arrivals")
            tasks = []

            async def limited(plans: list[Plan], g: int) -> None:
                async with limit:
                    await group(plans, {"run": run_id, "group": str(g)})

            for g, p in enumerate(groups_of(plans, run.group_size)):
                if bounds.stop.is_set():
                    break
                if run.arrival_rate > 0 and g > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(bounds.stop.wait(), rng.expovariate(run.arrival_rate))
                tasks.append(asyncio.create_task(limited(p, g)))
            await asyncio.gather(*tasks)
            starts.append(0.0)
            steps.append(time.perf_counter() - t0)

    main = asyncio.create_task(body())
    try:
        await asyncio.wait_for(asyncio.shield(main), run.max_seconds + HARD_STOP_GRACE)
    except TimeoutError:
        bounds.halt("max_seconds")
        main.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await main
        rec.error(
            "run", "harness:HARD_STOP", f"episodes still running {HARD_STOP_GRACE:g}s after max_seconds"
        )
    finally:
        soft.cancel()
        bar.close()
    wall = time.perf_counter() - t0
    n_exec = len(rec.latencies.get("exec", []))
    return {
        "wall_s": round(wall, 3),
        "step_s": [round(s, 3) for s in steps],
        "between_steps_s": [round(g, 3) for g in gaps],
        "step_start_s": [round(x, 3) for x in starts],
        "stopped_by": bounds.stopped_by or "completed",
        "requests": bounds.requests,
        "episodes": {
            "planned": tally.planned,
            "completed": tally.completed,
            "failed": tally.failed,
            "cut_by_bounds": tally.cut,
        },
        "sandbox_seconds": round(tally.held_seconds, 3),
        "throughput": {
            "requests_per_s": round(bounds.requests / wall, 2) if wall else None,
            "execs_per_s": round(n_exec / wall, 2) if wall else None,
            "rollouts_per_s": round(tally.completed / wall, 3) if wall else None,
        },
        "latency_ms": rec.summaries(),
        "samples_ms": {op: [round(x * 1000, 3) for x in xs] for op, xs in rec.latencies.items()},
        "errors": dict(rec.errors),
        "error_samples": rec.error_samples,
    }
