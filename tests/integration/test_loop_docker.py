"""The integrated loop end to end on the real engine: the policy writes
programs, the server runs them in sandboxes through the verifier, the trainer
does GRPO updates; mean reward must rise well beyond noise."""

from __future__ import annotations

import statistics

import pytest

from sandboxd.app import App
from sandboxd.client import AsyncClient
from sandboxd.loop import LoopConfig, run_loop
from sandboxd.loop.policy import torch_available

pytestmark = [pytest.mark.docker, pytest.mark.timeout(420)]


async def test_loop_learns_on_docker(app: App, client: AsyncClient, image: str) -> None:
    await client.create_pool("loop", image, min_ready=4, max_size=8)
    config = LoopConfig(pool="loop", steps=30, workers=4, progress=False, seed=1)
    result = await run_loop(client, config)
    print(f"policy implementation: {result.implementation} (torch importable: {torch_available()})")
    print("reward curve:", [round(r, 3) for r in result.rewards])
    first, last = result.rewards[:6], result.rewards[-6:]
    noise = (statistics.pstdev(first) ** 2 / len(first) + statistics.pstdev(last) ** 2 / len(last)) ** 0.5
    rise = statistics.fmean(last) - statistics.fmean(first)
    print(f"rise {rise:.3f}, standard error {noise:.3f}")
    # Three standard errors: a rise this large by chance has odds below 1 in 700.
    # (The late steps are still climbing, which inflates their spread, so the
    # estimate of noise is on the generous side.)
    assert rise > max(0.05, 3 * noise), (rise, noise, result.rewards)
    assert result.figures is not None and result.figures.consumed_groups >= 30 * config.batch_groups
    assert result.max_staleness <= config.max_staleness
