"""A client killed with SIGKILL while holding 50 leases: the server reclaims
every sandbox once the leases' TTL runs out, and nothing is left behind."""

from __future__ import annotations

import asyncio
import signal
import sys
import time

import docker
import pytest

from sandboxd.app import App
from sandboxd.client import AsyncClient
from sandboxd.core.lifecycle import State
from tests.integration.conftest import instance_containers, poll

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

TTL = 3.0
HOLDER = """
import asyncio, sys
from sandboxd.client import AsyncClient

async def main() -> None:
    client = AsyncClient(sys.argv[1])
    leases = await asyncio.gather(*(client.lease("held", lease_ttl=float(sys.argv[2]), timeout=120)
                                   for _ in range(50)))
    print("held", len(leases), flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


async def test_sigkilled_client_leases_are_reclaimed_within_a_ttl(
    app: App, client: AsyncClient, image: str, engine: docker.DockerClient
) -> None:
    await client.create_pool("held", image, min_ready=50, max_size=50, limits={"memory_bytes": 64 << 20})
    await poll(lambda: app.control.pools["held"].ready >= 50, timeout=240, what="50 warm sandboxes")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", HOLDER, app.address, str(TTL), stdout=asyncio.subprocess.PIPE
    )
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 120)
    assert line.decode().split() == ["held", "50"]
    pool = app.control.pools["held"]
    assert pool.count(State.LEASED) == 50
    proc.send_signal(signal.SIGKILL)
    await proc.wait()
    killed_at = time.monotonic()

    # Leases were taken just before the kill, so all expire within one TTL of it.
    await poll(lambda: pool.count(State.LEASED) == 0, timeout=TTL + 10, what="every lease reclaimed")
    reclaimed_after = time.monotonic() - killed_at
    assert len(app.control.leases) == 0
    print(f"50 leases reclaimed {reclaimed_after:.2f}s after the client died (TTL {TTL}s)")
    await client.update_pool("held", min_ready=0)
    await poll(lambda: not pool.records, timeout=120, what="reclaimed sandboxes destroyed")
    await client.delete_pool("held")
    left = await asyncio.to_thread(instance_containers, engine, app.settings.instance_id)
    assert left == []
