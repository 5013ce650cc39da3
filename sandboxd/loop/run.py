"""The integrated loop: generator workers and a trainer running concurrently
against the rollout queue, within its staleness budget.

Each generator worker holds one sandbox (reused across groups: the tasks are
stateless programs), asks for a slot, samples a group of programs token by
token from the weights of the latest published policy version, writes them
into its sandbox and submits the group with a verifier command per program:
the server runs the verifier, so rewards (and infrastructure failures, which
are masked) come from executing the programs. The trainer pulls batches,
does a GRPO update, acknowledges, and publishes the next policy version.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sandboxd import errors
from sandboxd.client.aio import AsyncClient, Lease
from sandboxd.client.rollouts import RolloutClient, trajectory
from sandboxd.loop.policy import Policy, Sample, Weights, make_policy
from sandboxd.loop.tasks import (
    VERIFY_SCRIPT,
    decode_payload,
    encode_payload,
    program,
    sample_task,
    verify_command,
)
from sandboxd.v1 import rollouts_pb2 as pb

log = logging.getLogger(__name__)


@dataclass
class LoopConfig:
    """One loop run: the pool, the queue's shape (B, group size, S), the workers and the policy."""

    pool: str
    run: str = "loop"
    steps: int = 30
    batch_groups: int = 4
    group_size: int = 8
    max_staleness: int = 1
    workers: int = 4
    lr: float = 0.2
    seed: int = 0
    policy: str = "auto"
    progress: bool = True


@dataclass
class LoopResult:
    """What a loop run learned and saw: reward per step, the final figures, the worst staleness."""

    implementation: str
    rewards: list[float] = field(default_factory=list)
    """Mean reward of each trained batch (infrastructure failures excluded)."""
    figures: pb.Figures | None = None
    max_staleness: int = 0


class _Shared:
    def __init__(self, weights: Weights) -> None:
        self.weights = weights
        self.version = 0
        self.stop = asyncio.Event()


async def run_loop(
    client: AsyncClient, config: LoopConfig, on_step: Callable[[int, float], None] | None = None
) -> LoopResult:
    """Trains ``config.steps`` GRPO steps on the rollout queue; the workers' leases go however it ends."""
    rollouts = RolloutClient(client)
    await rollouts.configure(
        config.run,
        batch_groups=config.batch_groups,
        group_size=config.group_size,
        max_staleness=config.max_staleness,
        filter_mode=pb.FILTER_MODE_MASK,
        pool=config.pool,
        sandboxes_per_group=1,
        max_concurrent=config.workers,
    )
    policy = make_policy(config.policy, lr=config.lr, seed=config.seed)
    shared = _Shared(policy.export())
    result = LoopResult(policy.implementation)
    workers = [
        asyncio.create_task(_generator(client, rollouts, config, shared, i), name=f"loop-generator-{i}")
        for i in range(config.workers)
    ]
    try:
        await _trainer(rollouts, config, policy, shared, result, on_step)
    finally:
        shared.stop.set()
        for w in workers:
            w.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
    result.figures = await rollouts.figures(config.run)
    result.max_staleness = result.figures.staleness_trajectory.max
    return result


async def _generator(
    client: AsyncClient, rollouts: RolloutClient, config: LoopConfig, shared: _Shared, index: int
) -> None:
    rng = random.Random(config.seed * 1000 + index)
    nrng = np.random.default_rng(config.seed * 1000 + index)
    lease: Lease | None = None
    try:
        while not shared.stop.is_set():
            try:
                (slot,) = await rollouts.wait_slots(config.run, 1)
            except errors.SandboxdError as e:
                log.warning("generator %d: %s", index, e)
                await asyncio.sleep(0.2)
                continue
            if lease is None:
                lease = await client.lease(config.pool, labels={"run": config.run}, lease_ttl=120)
                await lease[0].write_files({"verify.py": VERIFY_SCRIPT})
            sb = lease[0]
            await rollouts.report_progress(config.run, slot.group_id, lease_ids=[lease.id])
            weights, version = shared.weights, shared.version
            task = sample_task(rng)
            files, trajs = {}, []
            for i in range(config.group_size):
                tokens, logprobs = weights.sample(task.index, nrng)
                path = f"sol_{slot.group_id}_{i}.py"
                files[path] = program(tokens)
                trajs.append(
                    trajectory(
                        f"{slot.group_id}-{i}",
                        payload=encode_payload(task, tokens, logprobs),
                        segments=[(version, len(tokens))],
                        verifier=verify_command(task, path),
                        sandbox_id=sb.id,
                        verifier_timeout=10,
                    )
                )
            try:
                await sb.write_files(files)
                await rollouts.submit(config.run, slot.group_id, trajs, prompt_id=str(task.target))
            except errors.FailedPrecondition:
                pass  # cancelled (over-stale): its sandbox was released
            except errors.NotFound:
                lease = None  # the sandbox is gone; take another
            if lease is not None and not client_lease_alive(lease):
                lease = None
            with contextlib.suppress(errors.SandboxdError):
                if lease is not None:
                    await lease.heartbeat()
    finally:
        if lease is not None:
            with contextlib.suppress(errors.SandboxdError):
                await asyncio.shield(lease.release())


def client_lease_alive(lease: Lease) -> bool:
    """Whether the client-side lease still lists a sandbox; asks the server nothing."""
    return bool(lease.sandboxes)


async def _trainer(
    rollouts: RolloutClient,
    config: LoopConfig,
    policy: Policy,
    shared: _Shared,
    result: LoopResult,
    on_step: Callable[[int, float], None] | None,
) -> None:
    bar = _progress(config)
    version = 0
    await rollouts.publish(config.run, version)
    try:
        async for batch in rollouts.pull(config.run):
            samples, rewards = [], []
            for g in batch.groups:
                for t in g.trajectories:
                    if t.failure:
                        continue
                    rewards.append(t.reward)
                    if t.masked:
                        continue
                    task, tokens, logprobs = decode_payload(t.payload)
                    samples.append(Sample(task.index, tokens, logprobs, t.advantage))
            if samples:
                await asyncio.to_thread(policy.update, samples)
            await rollouts.ack(config.run, batch.batch_id)
            version += 1
            shared.weights, shared.version = policy.export(), version
            await rollouts.publish(config.run, version)
            mean = statistics.fmean(rewards) if rewards else 0.0
            result.rewards.append(mean)
            if on_step is not None:
                on_step(version, mean)
            if bar is not None:
                figures = await rollouts.figures(config.run)
                bar.set_postfix_str(f"reward {mean:.2f} | {_line(figures)}")
                bar.update(1)
            if version >= config.steps:
                break
    finally:
        if bar is not None:
            bar.close()


def _line(f: pb.Figures) -> str:
    return (
        f"R_p {f.production_rate:.1f}/s k {f.keep_rate:.2f} R_eff {f.effective_rate:.1f}/s "
        f"R_c {f.consumption_rate:.1f}/s idle T {f.trainer_idle_ratio:.0%} G {f.generator_idle_ratio:.0%} "
        f"queue {f.queue_depth} run {f.in_flight} stale max {f.staleness_trajectory.max}"
    )


def _progress(config: LoopConfig) -> Any:
    if not config.progress:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=config.steps, desc="GRPO steps", file=sys.stderr, dynamic_ncols=True)
