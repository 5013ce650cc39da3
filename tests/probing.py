"""Containment checks shared by the Docker and Kubernetes tiers: an attack
runs while a bystander sandbox keeps being asked to do something trivial."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable

from sandboxd.client import ExecResult, Sandbox


async def while_probing(bystander: Sandbox, attack: Awaitable[ExecResult]) -> tuple[ExecResult, list[float]]:
    """Runs the attack while ``bystander`` keeps executing ``true`` in a
    session; returns the attack's result and the latency of each bystander
    command answered meanwhile."""
    latencies: list[float] = []
    done = asyncio.Event()

    async def probe() -> None:
        while not done.is_set():
            t0 = time.perf_counter()
            r = await bystander.exec("true", session="probe", timeout=30)
            assert r.ok, r
            latencies.append(time.perf_counter() - t0)

    prober = asyncio.create_task(probe())
    try:
        result = await attack
    finally:
        done.set()
        await prober
    return result, latencies
