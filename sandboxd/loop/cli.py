"""``sandboxd loop``: the reference generator/trainer loop, against a running
server (--target) or an embedded one on the local Docker engine."""

from __future__ import annotations

import argparse
import statistics

from sandboxd.client import AsyncClient
from sandboxd.loop.run import LoopConfig, run_loop
from sandboxd.settings import Settings


async def main(args: argparse.Namespace, settings: Settings) -> int:
    config = LoopConfig(
        pool=args.pool, steps=args.steps, workers=args.workers, seed=args.seed, policy=args.policy
    )
    if args.target:
        async with AsyncClient(args.target, token=args.token) as client:
            return await _run(client, config, image=None)
    from sandboxd.app import build_app
    from sandboxd.images.build import ensure_default_image

    image = ensure_default_image()
    settings.server.port = 0
    app = build_app(settings)
    await app.start()
    try:
        async with AsyncClient(app.address) as client:
            return await _run(client, config, image=image)
    finally:
        await app.stop(grace=5)


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
