"""The Docker engine restarted mid-run (runs last: it stops the engine).
What was lost is reported as lost, nothing hangs, and the pool returns to
its target by itself once the engine is back."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path

import docker
import pytest

from sandboxd import errors
from sandboxd.app import App
from sandboxd.client import AsyncClient
from tests.integration.conftest import instance_containers, poll

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
PIDFILE = Path("/var/run/docker.pid")


def _ping(engine: docker.DockerClient) -> bool:
    try:
        return bool(engine.ping())
    except Exception:
        return False


async def _start_engine() -> None:
    proc = await asyncio.create_subprocess_exec("bash", str(ROOT / "scripts/start-docker.sh"))
    assert await asyncio.wait_for(proc.wait(), 120) == 0


@pytest.mark.skipif(not PIDFILE.exists(), reason="the engine was not started with a pid file")
async def test_engine_restart_mid_run(
    app: App, client: AsyncClient, pool: str, engine: docker.DockerClient
) -> None:
    await poll(lambda: app.control.pools[pool].ready >= 2, timeout=60, what="pool warm")
    lease = await client.lease(pool, timeout=30)
    sb = lease.sandboxes[0]
    assert (await sb.exec("echo before", session="s")).text == "before\n"
    try:
        os.kill(int((await asyncio.to_thread(PIDFILE.read_text)).strip()), signal.SIGTERM)
        await poll(lambda: asyncio.to_thread(lambda: not _ping(engine)), timeout=60, what="engine down")

        # While the engine is down: a clear answer, not a hang.
        try:
            r = await asyncio.wait_for(sb.exec("true", timeout=5), 30)
            assert r.outcome == "SANDBOX_LOST", r
        except errors.TransientBackendError:
            pass
    finally:
        await _start_engine()
    await poll(lambda: asyncio.to_thread(_ping, engine), timeout=60, what="engine back")

    # The engine stopped every container: the leased one is reported lost ...
    r = await sb.exec("true", timeout=10)
    assert r.outcome == "SANDBOX_LOST", r
    with contextlib.suppress(errors.NotFound):
        await client.release(lease.id)
    # ... and the pool replaces its dead warm sandboxes (the periodic liveness
    # sweep, run now rather than waited for) and returns to target.
    await app.control.reconciler.sweep()
    target = app.control.pools[pool].config.min_ready

    def warm_and_alive() -> bool:
        p = app.control.pools[pool]
        return p.ready >= target and p.creating == 0

    await poll(warm_and_alive, timeout=120, what="pool back at its target")
    async with client.acquire(pool, timeout=60) as fresh:
        assert (await fresh.exec("echo after")).text == "after\n"

    # Remains of creates the outage cut short are found and removed.
    def only_known() -> bool:
        known = {r.handle for p in app.control.pools.values() for r in p.records.values()}
        return {c.id for c in instance_containers(engine, app.settings.instance_id)} <= known

    await poll(lambda: asyncio.to_thread(only_known), timeout=60, what="orphans swept")
