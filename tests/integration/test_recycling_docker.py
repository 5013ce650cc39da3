"""Recycling pools on the real engine: what a hostile tenant leaves in a
sandbox (files in the workspace, /tmp, /dev/shm and /mnt, a background
process, SysV IPC, a session's state) never reaches the next lease; a
changed mount, a sandbox with an operation of it in flight, and another
tenant's acquire never get a recycled sandbox."""

from __future__ import annotations

import json

import docker
import pytest

from sandboxd import errors
from sandboxd.app import App
from sandboxd.client import AsyncClient
from sandboxd.core.lifecycle import State
from sandboxd.core.tenancy import acting_as
from tests.integration.conftest import NO_GVISOR, gvisor_registered, poll

pytestmark = [pytest.mark.docker, pytest.mark.timeout(120)]

HOSTILE = r"""
set -e
echo secret > /workspace/secret.txt
mkdir -p /workspace/deep/er && echo x > /workspace/deep/er/f && chmod 000 /workspace/deep
echo t > /tmp/left.txt
echo s > /dev/shm/left.shm
echo m > /mnt/left.mnt
# A background process that outlives the command and rewrites its file.
nohup python3 -c 'import time
while True:
    open("/tmp/daemon.txt", "w").write(str(time.time())); time.sleep(0.05)' >/dev/null 2>&1 &
python3 -c 'import ctypes; l = ctypes.CDLL(None); assert l.shmget(4242, 4096, 0o1600) >= 0'
"""

# What the next lease sees: every path of the writable mounts but the
# kernel's, every process but its own chain, the SysV shared memory segment.
LOOK = r"""
import ctypes, json, os
mine = set()
pid = os.getpid()
while pid > 1:
    mine.add(pid)
    pid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
procs = []
for p in os.listdir("/proc"):
    if p.isdigit() and int(p) not in mine and int(p) != 1:
        try:
            procs.append(open(f"/proc/{p}/cmdline", "rb").read().replace(b"\0", b" ").decode())
        except OSError:
            pass
files = sorted(os.path.join(d, f) for root in ("/workspace", "/tmp", "/dev/shm", "/mnt")
               for d, _, fs in os.walk(root) for f in fs)
shm = ctypes.CDLL(None).shmget(4242, 0, 0) >= 0
print(json.dumps({"procs": procs, "files": files, "shm": shm}))
"""


async def _recycling_pool(client: AsyncClient, image: str, **kw: object) -> str:
    await client.create_pool("rc", image, min_ready=1, max_size=1, recycle="same-tenant", **kw)  # type: ignore[arg-type]
    return "rc"


async def test_a_hostile_tenants_leftovers_never_reach_the_next_lease(
    app: App, client: AsyncClient, image: str, each_runtime: str
) -> None:
    # Under gVisor, without the keeper (whose shells churn their FIFOs in /tmp).
    live = "off" if each_runtime == "gvisor" else ""
    pool = await _recycling_pool(client, image, runtime=each_runtime, live_snapshots=live)
    async with client.acquire(pool, timeout=60) as sb:
        first = sb.id
        r = await sb.exec(HOSTILE, timeout=30)
        assert r.ok, r.text
        assert (await sb.exec("export TOKEN=hunter2; cd /tmp", session="agent")).ok
        before = json.loads((await sb.exec(["python3", "-c", LOOK])).text)
        assert "/tmp/daemon.txt" in before["files"] and before["shm"]
        assert any("time.sleep" in p for p in before["procs"])
    warm = app.control.pools[pool]
    await poll(lambda: warm.recycled_total or warm._recycler.destroyed, timeout=60, what="the sandbox reset")
    assert warm.recycled_total == 1, warm._recycler.destroyed
    await poll(lambda: warm.ready == 1, timeout=60, what="the reset sandbox READY")
    async with client.acquire(pool, timeout=60) as sb:
        # The pool holds one sandbox: the next lease is the same one, reset.
        assert sb.id == first
        after = json.loads((await sb.exec(["python3", "-c", LOOK])).text)
        assert after["files"] == [] and not after["shm"]
        assert not any("time.sleep" in p for p in after["procs"]), after["procs"]
        session = await sb.exec("echo [$TOKEN] $(pwd)", session="agent")
        assert session.text.strip() == "[] /workspace"
        assert (await sb.exec("ls -A /workspace /mnt")).text.split() == ["/mnt:", "/workspace:"]
    status = (await client.get_pool(pool)).status
    assert status.recycled_total == 1
    assert status.reset_p50_seconds > 0 and status.create_p50_seconds > 0


async def test_a_changed_mount_destroys_the_sandbox(
    app: App, client: AsyncClient, image: str, engine: docker.DockerClient
) -> None:
    pool = await _recycling_pool(client, image)
    async with client.acquire(pool, timeout=60) as sb:
        first = sb.id
        # Not something added: what the sandbox came with, changed.
        assert (await sb.exec("chmod 0700 /workspace")).ok
    warm = app.control.pools[pool]
    await poll(lambda: first not in app.control._index and warm.ready == 1, timeout=60, what="a new sandbox")
    assert warm.recycled_total == 0 and warm._recycler.destroyed == {"check": 1}
    async with client.acquire(pool, timeout=60) as sb:
        assert sb.id != first


async def test_an_operation_in_flight_or_another_tenant_gets_no_recycled_sandbox(
    app: App, image: str
) -> None:
    control = app.control
    from sandboxd.backends.base import Limits
    from sandboxd.core.pools import PoolConfig

    with acting_as("alice"):
        alice = await control.create_pool(PoolConfig("p", image, 1, 2, Limits(), recycle="same-tenant"))
        await poll(lambda: alice.ready == 1, timeout=60, what="alice's pool warm")
        lease, records = await control.acquire("p", 1, 0, {}, 0.0, 60.0, None)
        held = records[0]
        # As a snapshot's capture or a fork's read of it holds it.
        with control.using(held):
            await control.release(lease.lease_id, [])
        await poll(lambda: held.state is State.GONE, timeout=60, what="the busy sandbox destroyed")
        assert alice._recycler.destroyed == {"in use": 1}
        lease, records = await control.acquire("p", 1, 0, {}, 0.0, 60.0, None)
        used = records[0]
        await control.release(lease.lease_id, [])
        await poll(lambda: used.state is State.READY, timeout=60, what="alice's sandbox reset")
    with acting_as("bob"):
        bob = await control.create_pool(PoolConfig("p", image, 0, 2, Limits(), recycle="same-tenant"))
        lease, got = await control.acquire("p", 2, 0, {}, 0.0, 60.0, None)
        assert used not in got and all(r.pool == bob.name for r in got)
        await control.release(lease.lease_id, [])
    assert used in alice.ready_records()


async def test_a_gvisor_pool_with_the_keeper_is_not_recycled(
    client: AsyncClient, image: str, engine: docker.DockerClient
) -> None:
    if not gvisor_registered(engine):
        pytest.skip(NO_GVISOR)
    with pytest.raises(errors.FailedPrecondition, match='live_snapshots "off"'):
        await client.create_pool("kept", image, max_size=1, runtime="gvisor", recycle="same-tenant")
    assert not [p for p in await client.list_pools() if p.spec.name == "kept"]
