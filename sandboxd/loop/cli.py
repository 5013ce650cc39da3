"""``sandboxd loop``: the reference generator/trainer loop against a server.

It speaks only the public client API: ``sandboxd loop`` without ``--target``
starts an embedded server in sandboxd.cli and hands this module its address.
"""

from __future__ import annotations

import argparse
import statistics

from sandboxd.client import AsyncClient
from sandboxd.loop.run import LoopConfig, run_loop


async def main(
    args: argparse.Namespace, target: str, *, token: str | None = None, image: str | None = None
) -> int:
    """Runs the loop against the server at ``target``; with ``image``, creates
    the pool there first if it does not exist."""
    config = LoopConfig(
        pool=args.pool, steps=args.steps, workers=args.workers, seed=args.seed, policy=args.policy
    )
    async with AsyncClient(target, token=token) as client:
        return await _run(client, config, image=image)


async def _run(client: AsyncClient, config: LoopConfig, image: str | None) -> int:
    if image is not None and config.pool not in {p.spec.name for p in await client.list_pools()}:
        await client.create_pool(config.pool, image, min_ready=config.workers, max_size=config.workers * 2)
    result = await run_loop(client, config, on_step=lambda v, r: None)
    rewards = result.rewards
    k = max(1, len(rewards) // 5)
    print(f"policy implementation: {result.implementation}")
    print("mean reward per step: " + " ".join(f"{r:.2f}" for r in rewards))
    if len(rewards) >= 2 * k:
        print(
            f"first {k} steps {statistics.fmean(rewards[:k]):.3f} -> "
            f"last {k} steps {statistics.fmean(rewards[-k:]):.3f}"
        )
    if result.figures is not None:
        f = result.figures
        print(
            f"trainer idle {f.trainer_idle_ratio:.0%}, generator idle {f.generator_idle_ratio:.0%}, "
            f"keep rate {f.keep_rate:.2f}, max staleness {result.max_staleness}"
        )
    return 0
