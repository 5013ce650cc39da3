"""Benchmark dollars: the loop's idle dollars per step and the load
benchmark's per-driver trainer and sandbox dollars, at the default prices."""

from __future__ import annotations

import pytest

from benchmarks.dollars import PRICES, idle_usd_per_step, prices_entry, sandbox_usd
from benchmarks.load.report import dollars
from sandboxd.settings import DEFAULT_LIMITS

pytestmark = pytest.mark.timeout(10)


def test_idle_dollars_per_step_at_h200_prices() -> None:
    # 8 GPUs at $1.59 an hour, idle 450 s over 2 steps
    assert idle_usd_per_step(450.0, 2) == pytest.approx(8 * 1.59 / 3600 * 225, abs=1e-6)
    assert idle_usd_per_step(10.0, 0) is None


def test_load_report_prices_each_driver() -> None:
    drivers = {
        "sandboxd": {"step_s": [10.0, 20.0], "episodes": {"completed": 16}, "sandbox_seconds": 3600.0},
        "baseline": {"step_s": [], "episodes": {"completed": 0}},
    }
    out = dollars(drivers)
    hour = sandbox_usd(3600.0)
    assert hour == pytest.approx(PRICES.sandbox_cpu_hour_usd + 0.5 * PRICES.sandbox_gb_hour_usd)
    assert out["sandboxd_idle_usd_per_step"] == pytest.approx(15.0 * PRICES.trainer_usd_per_second, abs=1e-6)
    assert out["sandboxd_sandbox_usd_per_rollout"] == pytest.approx(hour / 16, abs=1e-8)
    assert out["sandboxd_sandbox_usd_per_step"] == pytest.approx(hour / 2, abs=1e-6)
    assert out["baseline_idle_usd_per_step"] is None and out["baseline_sandbox_usd_per_rollout"] is None
    assert out["prices"] == prices_entry()
    assert out["prices"]["sandbox_memory_bytes"] == DEFAULT_LIMITS.memory_bytes
