"""A modelled generator and trainer around real sandboxes, for the real
variants of benchmarks.loop and benchmarks.fleet.

Generation and training take the time a configured model says (a
235B-class mixture-of-experts model served and trained on H200s, its times
scaled down so a run fits in minutes); everything a rollout does in its
environment is real: each group asks the rollout queue for a slot, leases
a sandbox from the server's pool, runs its tool calls there between turns
of generation, and is submitted with a verifier command per trajectory that
the server runs in that sandbox, reading what the tool calls wrote. The
trainer pulls batches, "trains" for the modelled step time, acknowledges
and publishes the next policy version.

A worker keeps its sandbox while it gets slot after slot and gives it back
once the queue has had none for it for a second, so a run holds about the
sandboxes its groups use and not more.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import cast

from sandboxd import errors
from sandboxd.client import AsyncClient
from sandboxd.client.aio import Lease
from sandboxd.client.rollouts import RolloutClient, trajectory
from sandboxd.v1 import rollouts_pb2 as pb

KEEP_SECONDS = 1.0
"""How long a worker refused a slot keeps its sandbox before giving it back
(a release destroys the container and the pool starts another: short
refusals are not worth that)."""


@dataclass(frozen=True)
class ModelProfile:
    """How long one model takes to generate and to train, in real seconds,
    and the factor that scales them down for the benchmark."""

    name: str = "235B-A22B MoE: 8xH200 inference replicas, 8xH200 trainer"
    decode_seconds_per_token: float = 0.030
    """Per sequence at short context, with the replica serving a full batch."""
    context_tokens_per_doubling: int = 16_384
    """Context length at which attention has doubled the decode time per token."""
    prompt_tokens: int = 1_024
    train_fixed_seconds: float = 60.0
    """Optimizer step, weight sync to the inference replicas."""
    train_seconds_per_token: float = 0.00015
    """Forward and backward over 22B active parameters (6 x 22e9 FLOP a token) plus
    the reference and old-policy passes, at ~40 % of 8 H200s' dense peak."""
    time_scale: float = 1 / 25
    """Benchmark seconds per modelled second."""

    def generation_seconds(self, tokens: int, context: int) -> float:
        """Benchmark seconds to decode ``tokens`` after ``context`` tokens (the
        per-token time grows linearly with context)."""
        mean_context = self.prompt_tokens + context + tokens / 2
        slow = 1 + mean_context / self.context_tokens_per_doubling
        return tokens * self.decode_seconds_per_token * slow * self.time_scale

    def step_seconds(self, tokens: int) -> float:
        """Benchmark seconds of one training step over ``tokens`` tokens."""
        return (self.train_fixed_seconds + tokens * self.train_seconds_per_token) * self.time_scale


@dataclass(frozen=True)
class RunSpec:
    """One run on the server: its queue, its workers and its model's drift."""

    run: str
    pool: str
    controller: bool
    fixed_concurrency: int = 0
    """The concurrency without the controller; with it, where the controller starts (0 = B)."""
    batch_groups: int = 2
    group_size: int = 2
    max_staleness: int = 3
    workers: int = 0
    """0 = as many as the staleness gate admits ((S + 1) * B)."""
    profile: ModelProfile = ModelProfile()
    speed: float = 1.0
    """Generator slowness against the profile (2 = takes twice as long)."""
    tokens: Callable[[float], float] = lambda frac: 1500.0
    """Mean output tokens per trajectory at ``frac`` (0-1) of the run: the drift."""
    turns: int = 2
    window_seconds: float = 20.0
    seed: int = 1


@dataclass
class RunResult:
    """What one run saw: the trainer's idle and busy time, steps, rollouts and the final figures."""

    run: str
    idle_seconds: float = 0.0
    busy_seconds: float = 0.0
    steps: int = 0
    rollouts: int = 0
    """Trajectories submitted."""
    tokens: int = 0
    cancelled: int = 0
    """Groups the queue took away (stale or reclaimed) before they were submitted."""
    phase_idle: dict[str, list[float]] = field(default_factory=dict)
    concurrency: list[int] = field(default_factory=list)
    figures: pb.Figures | None = None

    @property
    def idle_ratio(self) -> float:
        """Trainer idle over its wall time, the wait for the first batch included."""
        total = self.idle_seconds + self.busy_seconds
        return self.idle_seconds / total if total else 0.0


class _Clock:
    def __init__(self, seconds: float) -> None:
        self.start = time.monotonic()
        self.seconds = seconds

    @property
    def frac(self) -> float:
        return min(1.0, (time.monotonic() - self.start) / self.seconds)

    @property
    def over(self) -> bool:
        return time.monotonic() - self.start >= self.seconds


def phase_name(frac: float, phases: int) -> str:
    """Which of ``phases`` equal parts of the run ``frac`` falls in, as "phase 1".."phase N"."""
    return f"phase {min(phases, int(frac * phases) + 1)}"


async def run_one(client: AsyncClient, spec: RunSpec, seconds: float, phases: int = 1) -> RunResult:
    """Configures the run, drives its workers and trainer for ``seconds``, and returns what it saw."""
    rollouts = RolloutClient(client)
    await rollouts.configure(
        spec.run,
        batch_groups=spec.batch_groups,
        group_size=spec.group_size,
        max_staleness=spec.max_staleness,
        filter_mode=pb.FILTER_MODE_DROP_AND_BACKFILL,
        pool=spec.pool,
        sandboxes_per_group=1,
        controller=spec.controller,
        max_concurrent=spec.fixed_concurrency,
        window_seconds=spec.window_seconds,
    )
    result = RunResult(spec.run)
    clock = _Clock(seconds)
    state = {"version": 0}
    workers = spec.workers or (spec.max_staleness + 1) * spec.batch_groups
    tasks = [
        asyncio.create_task(_worker(client, rollouts, spec, clock, state, result, i)) for i in range(workers)
    ]
    sampler = asyncio.create_task(_sample(rollouts, spec, clock, result))
    try:
        await _trainer(rollouts, spec, clock, state, result, phases)
    finally:
        for t in [*tasks, sampler]:
            t.cancel()
        await asyncio.gather(*tasks, sampler, return_exceptions=True)
    result.figures = await rollouts.figures(spec.run)
    return result


async def _sample(rollouts: RolloutClient, spec: RunSpec, clock: _Clock, result: RunResult) -> None:
    while not clock.over:
        with contextlib.suppress(errors.SandboxdError):
            result.concurrency.append((await rollouts.figures(spec.run)).in_flight)
        await asyncio.sleep(1.0)  # a sampling period, not a wait for a condition


async def _trainer(
    rollouts: RolloutClient,
    spec: RunSpec,
    clock: _Clock,
    state: dict[str, int],
    result: RunResult,
    phases: int,
) -> None:
    await rollouts.publish(spec.run, 0)
    waited_since = time.monotonic()
    batches = cast(AsyncGenerator[pb.Batch, None], rollouts.pull(spec.run))
    try:
        while not clock.over:
            try:
                batch = await asyncio.wait_for(anext(batches), max(0.1, clock.seconds * (1 - clock.frac)))
            except TimeoutError:
                break
            now = time.monotonic()
            phase = result.phase_idle.setdefault(phase_name(clock.frac, phases), [0.0, 0.0])
            result.idle_seconds += now - waited_since
            phase[0] += now - waited_since
            tokens = sum(s.tokens for g in batch.groups for t in g.trajectories for s in t.segments)
            step = spec.profile.step_seconds(tokens)
            await asyncio.sleep(step)  # the modelled training step
            result.busy_seconds += step
            phase[1] += step
            result.steps += 1
            result.tokens += tokens
            await rollouts.ack(spec.run, batch.batch_id)
            state["version"] += 1
            await rollouts.publish(spec.run, state["version"])
            waited_since = time.monotonic()
        if not clock.over:
            return
        tail = time.monotonic() - waited_since
        result.idle_seconds += tail
        result.phase_idle.setdefault(phase_name(1.0, phases), [0.0, 0.0])[0] += tail
    finally:
        await batches.aclose()


async def _worker(
    client: AsyncClient,
    rollouts: RolloutClient,
    spec: RunSpec,
    clock: _Clock,
    state: dict[str, int],
    result: RunResult,
    index: int,
) -> None:
    rng = random.Random(spec.seed * 1000 + index)
    lease: Lease | None = None
    last_slot = time.monotonic()
    try:
        while not clock.over:
            try:
                (slot,) = await rollouts.request_slots(spec.run, 1)
                last_slot = time.monotonic()
            except errors.ResourceExhausted as e:
                if lease is not None and time.monotonic() - last_slot >= KEEP_SECONDS:
                    await lease.release()  # no slot for it: the sandbox goes back to the fleet
                    lease = None
                await asyncio.sleep(min(0.5, e.retry_after or 0.2))  # as the server advises
                continue
            try:
                if lease is None:
                    lease = await client.lease(spec.pool, labels={"run": spec.run}, lease_ttl=120, timeout=60)
                lease = await _rollout(rollouts, spec, clock, slot, lease, rng, result)
            except errors.FailedPrecondition:
                result.cancelled += 1  # taken away (stale, reclaimed): the queue said so
            except (errors.NotFound, errors.BackendError, errors.DeadlineExceeded):
                lease = None  # the sandbox went away under it: the next slot leases another
    finally:
        if lease is not None:
            with contextlib.suppress(errors.SandboxdError):
                await asyncio.shield(lease.release())


async def _rollout(
    rollouts: RolloutClient,
    spec: RunSpec,
    clock: _Clock,
    slot: pb.Slot,
    lease: Lease,
    rng: random.Random,
    result: RunResult,
) -> Lease:
    sb = lease[0]
    gid = slot.group_id
    await rollouts.report_progress(spec.run, gid, lease_ids=[lease.id])
    mean = spec.tokens(clock.frac)
    lengths = [max(64, int(mean * rng.lognormvariate(0, 0.25))) for _ in range(spec.group_size)]
    answers = [rng.random() < 0.5 for _ in range(spec.group_size)]
    done = [0] * spec.group_size
    for turn in range(spec.turns):
        part = [n // spec.turns for n in lengths]
        # The group's sequences decode side by side: the turn lasts as long as the longest.
        await asyncio.sleep(
            spec.speed * max(spec.profile.generation_seconds(p, d) for p, d in zip(part, done, strict=True))
        )
        done = [d + p for d, p in zip(done, part, strict=True)]
        writes = " && ".join(
            f"echo {int(a) if turn == spec.turns - 1 else 0} > {gid}-{i}.ans" for i, a in enumerate(answers)
        )
        tool = await sb.exec(f"mkdir -p tool && cd tool && {writes}", timeout=30)
        if tool.exit_code != 0:
            raise errors.Unavailable(f"tool call failed: {tool.stderr[:200]!r}")
        if (await rollouts.report_progress(spec.run, gid)).cancelled:
            raise errors.FailedPrecondition(f"group {gid} was taken away")
    trajs = [
        trajectory(
            f"{gid}-{i}",
            segments=[(slot.policy_version, lengths[i])],
            verifier=f"cat tool/{gid}-{i}.ans",
            sandbox_id=sb.id,
            verifier_timeout=20,
        )
        for i in range(spec.group_size)
    ]
    await rollouts.submit(spec.run, gid, trajs)
    result.rollouts += spec.group_size
    with contextlib.suppress(errors.SandboxdError):
        await lease.heartbeat()
    return lease
