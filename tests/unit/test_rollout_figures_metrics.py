"""The rollout figures as metrics and in `sandboxd status`."""

from __future__ import annotations

import io

import pytest

from sandboxd.app import App
from sandboxd.client import AsyncClient
from sandboxd.client.rollouts import RolloutClient, trajectory
from sandboxd.telemetry.status import run_status

pytestmark = pytest.mark.timeout(30)


async def test_figures_are_gauges_and_in_status(app: App, client: AsyncClient) -> None:
    await client.create_pool("p", "img", min_ready=0, max_size=4)
    rollouts = RolloutClient(client)
    await rollouts.configure("r1", batch_groups=1, group_size=2, max_staleness=1)
    (slot,) = await rollouts.wait_slots("r1", 1)
    await rollouts.submit(
        "r1", slot.group_id, [trajectory(f"t{i}", segments=[(0, 3)], reward=float(i)) for i in range(2)]
    )
    text = app.telemetry.prometheus_text()
    lines = {
        line.split(" ")[0]: line.split(" ")[-1]
        for line in text.splitlines()
        if line.startswith("sandboxd_rollout")
    }
    assert lines['sandboxd_rollout_queue_depth_groups{run="r1"}'] == "1"
    assert 'sandboxd_rollout_trainer_idle_ratio{run="r1"}' in lines
    assert 'sandboxd_rollout_policy_version{run="r1"}' in lines
    assert 'sandboxd_rollout_trainer_idle_usd_per_hour{run="r1"}' in lines
    assert 'sandboxd_rollout_sandbox_usd_total{run="r1"}' in lines

    out = io.StringIO()
    assert await run_status(app.address, once=True, out=out, runs=["r1", "nope"]) == 0
    shown = out.getvalue()
    assert "run r1: v0" in shown and "queue 1" in shown
    assert "cost: trainer idle $" in shown and "lifecycle: 0 rollouts" in shown
    assert "run nope:" in shown and "not found" in shown.lower()
