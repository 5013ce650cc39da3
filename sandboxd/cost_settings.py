"""The ``[cost]`` settings section: the prices every dollar figure is
computed at (rollout figures, ``sandboxd status --run``, the benchmarks)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from sandboxd.errors import InvalidArgument

H200_GPU_HOUR_USD = 1.59
"""One H200's hour, all in (hardware, power, hosting over its life): the
total-cost-of-ownership figure GPU-hour prices are usually compared against."""

FARGATE_CPU_HOUR_USD = 0.04048
"""One vCPU for an hour, on-demand Linux/x86 container pricing of a large
cloud (AWS Fargate, us-east-1): what a sandbox's CPU reservation costs when
bought by the hour."""

FARGATE_GB_HOUR_USD = 0.004445
"""One GiB of memory for an hour at the same pricing."""


@dataclass(frozen=True)
class CostSettings:
    """Prices of the trainer's GPUs and the sandboxes' reservations. A run's
    trainer is assumed to hold ``trainer_gpus`` GPUs whether it trains or
    waits, so every second it waits costs ``trainer_gpus * gpu_hour_usd / 3600``."""

    gpu_hour_usd: float = H200_GPU_HOUR_USD
    """Price of one trainer GPU for an hour (default: an H200's TCO, $1.59)."""
    trainer_gpus: int = 8
    """GPUs a run's trainer holds (default: one 8-GPU node)."""
    sandbox_cpu_hour_usd: float = FARGATE_CPU_HOUR_USD
    """Price of one CPU core a sandbox reserves (its cpu limit) for an hour."""
    sandbox_gb_hour_usd: float = FARGATE_GB_HOUR_USD
    """Price of one GiB of memory a sandbox reserves (its memory limit) for an hour."""

    def __post_init__(self) -> None:
        for name in ("gpu_hour_usd", "sandbox_cpu_hour_usd", "sandbox_gb_hour_usd"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise InvalidArgument(f"cost.{name}", f"must be a number of dollars, got {value!r}")
            if not math.isfinite(value) or value < 0:
                raise InvalidArgument(f"cost.{name}", f"must be a finite amount >= 0, got {value!r}")
        gpus = self.trainer_gpus
        if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0:
            raise InvalidArgument("cost.trainer_gpus", f"must be a whole number >= 0, got {gpus!r}")

    @property
    def trainer_usd_per_second(self) -> float:
        """What the trainer's GPUs cost per second, busy or idle."""
        return self.trainer_gpus * self.gpu_hour_usd / 3600.0

    def sandbox_usd(self, cpu_cores: float, memory_bytes: int, seconds: float) -> float:
        """What reserving ``cpu_cores`` and ``memory_bytes`` for ``seconds`` costs."""
        hours = max(0.0, seconds) / 3600.0
        gib = memory_bytes / (1 << 30)
        return hours * (cpu_cores * self.sandbox_cpu_hour_usd + gib * self.sandbox_gb_hour_usd)
