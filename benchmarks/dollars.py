"""Benchmark figures in dollars, at the prices a server's ``[cost]``
settings default to (sandboxd.cost_settings): an H200 trainer GPU-hour at
$1.59, sandbox CPU and memory reservations at on-demand container prices.
One place, so every benchmark prices its seconds alike."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from sandboxd.backends.base import Limits
from sandboxd.cost_settings import CostSettings
from sandboxd.settings import DEFAULT_LIMITS

PRICES = CostSettings()


def prices_entry(prices: CostSettings = PRICES, limits: Limits = DEFAULT_LIMITS) -> dict[str, Any]:
    """The prices (and the sandbox reservation) a result's dollars were computed at."""
    return {
        **asdict(prices),
        "sandbox_cpu_cores": limits.cpu_millis / 1000,
        "sandbox_memory_bytes": limits.memory_bytes,
    }


def trainer_usd(seconds: float, prices: CostSettings = PRICES) -> float:
    """What ``seconds`` of the trainer's GPUs cost, busy or idle."""
    return seconds * prices.trainer_usd_per_second


def idle_usd_per_step(idle_seconds: float, steps: int, prices: CostSettings = PRICES) -> float | None:
    """The trainer's idle dollars per training step; None without a step."""
    return round(trainer_usd(idle_seconds, prices) / steps, 6) if steps else None


def sandbox_usd(
    sandbox_seconds: float, prices: CostSettings = PRICES, limits: Limits = DEFAULT_LIMITS
) -> float:
    """What ``sandbox_seconds`` of sandboxes holding ``limits`` (cpu and memory) cost."""
    return prices.sandbox_usd(limits.cpu_millis / 1000, limits.memory_bytes, sandbox_seconds)
