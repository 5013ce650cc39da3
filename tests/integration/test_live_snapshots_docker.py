"""Live snapshots on the real engine: a gVisor sandbox paused and resumed,
checkpointed while it runs, restored and forked, with a process that holds
state only in its memory; corrupt images, quota and TTL; runc refused."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import docker
import pytest

from sandboxd import errors
from sandboxd.app import App, build_app
from sandboxd.backends.base import GVISOR
from sandboxd.backends.docker import shells as docker_shells
from sandboxd.client import AsyncClient
from sandboxd.client.aio import Lease, Sandbox
from sandboxd.core.snapshots.packs import blob_key, tenant_namespace
from tests.integration.conftest import NO_GVISOR, gvisor_registered, make_settings, poll, running_app

pytestmark = [pytest.mark.docker, pytest.mark.timeout(600)]

LEASED = 3

# Holds 8 MiB of random bytes and a random token in memory only, and ticks:
# each line it writes says token, tick and the digest of its memory as it
# was at start; on SIGUSR1 it hashes that memory again into holder.check; on
# SIGUSR2 it draws from its own PRNG and from the kernel into holder.rand.
HOLDER = """
import hashlib, os, random, secrets, signal, time
block = os.urandom(8 << 20)
token = secrets.token_hex(8)
start = hashlib.sha256(block).hexdigest()
def check(*_):
    with open('/tmp/holder.check.tmp', 'w') as f:
        f.write(hashlib.sha256(block).hexdigest())
    os.replace('/tmp/holder.check.tmp', '/tmp/holder.check')
signal.signal(signal.SIGUSR1, check)
def draw(*_):
    with open('/tmp/holder.rand.tmp', 'w') as f:
        f.write(f'{random.random()} {os.urandom(8).hex()}')
    os.replace('/tmp/holder.rand.tmp', '/tmp/holder.rand')
signal.signal(signal.SIGUSR2, draw)
tick = 0
while True:
    tick += 1
    with open('/tmp/holder.out.tmp', 'w') as f:
        f.write(f'{token} {tick} {start}')
    os.replace('/tmp/holder.out.tmp', '/tmp/holder.out')
    time.sleep(0.05)
"""

FILES = {
    "notes.txt": b"before the snapshot\n",
    "src/app/main.py": b"print('hi')\n",
    "src/app/data.bin": bytes(range(256)) * 512,
    "deep/a/b/c/d.txt": b"deep\n",
}


@pytest.fixture
def gvisor(engine: docker.DockerClient) -> None:
    if not gvisor_registered(engine):
        pytest.skip(NO_GVISOR)


@pytest.fixture
async def live_pool(client: AsyncClient, image: str, gvisor: None) -> str:
    await client.create_pool("live", image, min_ready=1, max_size=8, runtime=GVISOR)
    return "live"


async def holder_state(sb: Sandbox) -> tuple[str, int, str]:
    """(token, tick, digest at start) the holder last wrote."""
    out = await sb.exec("cat /tmp/holder.out 2>/dev/null")
    if not out.ok or not out.stdout:
        return "", 0, ""
    token, tick, digest = out.stdout.decode().split()
    return token, int(tick), digest


async def ticking_past(sb: Sandbox, tick: int) -> tuple[str, int, str]:
    """Polls until the holder has ticked past ``tick``; its state then."""
    seen: list[tuple[str, int, str]] = []

    async def past() -> bool:
        seen.append(await holder_state(sb))
        return seen[-1][1] > tick

    await poll(past, timeout=60, what=f"the holder in {sb.id} to tick past {tick}")
    return seen[-1]


async def memory_check(sb: Sandbox) -> str:
    """The digest the holder computes of its memory now (SIGUSR1)."""
    assert (await sb.exec("rm -f /tmp/holder.check; pkill -USR1 -x -f 'python3 holder.py'")).ok
    found: list[bytes] = []

    async def written() -> bool:
        out = await sb.exec("cat /tmp/holder.check 2>/dev/null")
        found.append(out.stdout)
        return out.ok and len(out.stdout) == 64

    await poll(written, timeout=60, what=f"the holder in {sb.id} to hash its memory")
    return found[-1].decode()


async def draws(sb: Sandbox) -> tuple[str, str]:
    """(the holder's next random.random(), 8 bytes it reads from the kernel now)."""
    assert (await sb.exec("rm -f /tmp/holder.rand; pkill -USR2 -x -f 'python3 holder.py'")).ok
    found: list[bytes] = []

    async def written() -> bool:
        out = await sb.exec("cat /tmp/holder.rand 2>/dev/null")
        found.append(out.stdout)
        return out.ok and b" " in out.stdout

    await poll(written, timeout=60, what=f"the holder in {sb.id} to draw")
    prng, kernel = found[-1].decode().split()
    return prng, kernel


async def start_holder(sb: Sandbox) -> tuple[str, int, str]:
    await sb.write_files({"holder.py": HOLDER.encode(), **FILES})
    await sb.keep("exec python3 holder.py")
    return await ticking_past(sb, 0)


async def assert_continues(sb: Sandbox, token: str, tick: int, digest: str) -> None:
    """The holder runs in ``sb`` with the same memory as when it had ticked ``tick``."""
    now_token, _, now_digest = await ticking_past(sb, tick)
    assert (now_token, now_digest) == (token, digest)
    assert await memory_check(sb) == digest
    assert await sb.read_files(list(FILES)) == FILES


@pytest.fixture
async def released() -> AsyncIterator[list[Lease]]:
    leases: list[Lease] = []
    yield leases
    for lease in leases:
        await lease.release()


async def test_pause_resume_snapshot_restore_and_fork_continue_the_process(
    app: App, client: AsyncClient, live_pool: str, released: list[Lease]
) -> None:
    async with client.acquire(live_pool, timeout=120) as sb:
        token, _, digest = await start_holder(sb)
        # Three pauses and resumes in a row: frozen, then going on.
        for _ in range(3):
            _, before, _ = await holder_state(sb)
            assert (await sb.pause()).paused
            assert (await client.get_sandbox(sb.id)).paused
            with pytest.raises(errors.FailedPrecondition, match="paused"):
                await sb.exec("true")
            with pytest.raises(errors.FailedPrecondition, match="paused"):
                await sb.snapshot(live=True)
            assert not (await sb.resume()).paused
            assert (await ticking_past(sb, before))[0] == token
        agent_state = "mkdir -p work && cd work && export AGENT_STEP=7 && LOCAL=5 && greet() { echo hi $1; }"
        assert (await sb.exec(agent_state, session="agent")).ok
        # Started from a session, and by a one-shot command (in a shell the
        # keeper started): carried.
        assert (await sb.exec("sleep 1000 >/dev/null 2>&1 &", session="agent")).ok
        assert (await sb.exec("setsid sleep 1001 >/dev/null 2>&1 &")).ok
        # Started by an engine exec of its own (root's commands are): the
        # snapshot says it does not carry it.
        assert (await sb.exec("setsid sleep 1002 >/dev/null 2>&1 &", user="root")).ok
        snap = await sb.snapshot(live=True, session="agent", policy_version=3, turn=2)
        assert snap.live and snap.size_bytes > 0 and snap.entry_count == 0
        stray = sorted(p.split(" (pid ")[0] for p in snap.not_carried)
        assert stray == ["sleep 1002"], list(snap.not_carried)
        assert list((await client.get_snapshot(snap.id)).not_carried) == list(snap.not_carried)
        assert snap.digest.startswith("sha256:") and snap.cwd == "/workspace/work"
        _, at_snapshot, _ = await holder_state(sb)
        # The source keeps running, memory intact.
        await assert_continues(sb, token, at_snapshot, digest)

    one = await client.restore(snap.id, timeout=120)
    released.append(one)
    (restored,) = one.sandboxes
    await assert_continues(restored, token, at_snapshot, digest)
    # The session's own shell went on: its unexported variable and function too.
    shown = 'printf "%s %s %s " "$PWD" "$AGENT_STEP" "$LOCAL"; greet you'
    state = await restored.exec(shown, session="agent")
    assert state.stdout == b"/workspace/work 7 5 hi you\n"
    running = await restored.exec("pgrep -f '^sleep 100[012]$' -a | cut -d' ' -f2- | sort")
    assert running.stdout == b"sleep 1000\nsleep 1001\n", "carried, and what it said it did not carry"
    # The session's job is the session's still: a command's kill spares it.
    timed = await restored.exec("sleep 60", session="agent", timeout=1)
    assert timed.outcome == "TIMED_OUT"
    assert (await restored.exec("pgrep -c -f '^sleep 1000$'", session="agent")).text.strip() == "1"
    assert restored.info.labels["sandboxd.snapshot"] == snap.id

    fork = await client.restore(snap.id, n=4, timeout=240)
    released.append(fork)
    assert len(fork) == 4
    await asyncio.gather(*(assert_continues(s, token, at_snapshot, digest) for s in fork))
    greeted = await asyncio.gather(*(s.exec("greet $LOCAL", session="agent") for s in fork))
    assert [g.stdout for g in greeted] == [b"hi 5\n"] * 4
    # Forks share the process's memory, its PRNG state included; what the
    # kernel hands out (getrandom, /dev/urandom) is fresh in each.
    drawn = await asyncio.gather(*(draws(s) for s in fork))
    assert len({prng for prng, _ in drawn}) == 1
    assert len({kernel for _, kernel in drawn}) == 4

    # A live snapshot of a restored sandbox, restored again: the lineage grows.
    again = await restored.snapshot(live=True, turn=3)
    assert again.parent_id == snap.id
    assert [r.id for r in again.chain] == [snap.id, again.id]
    _, at_again, _ = await holder_state(restored)
    second = await client.restore(again.id, timeout=120)
    released.append(second)
    await assert_continues(second[0], token, at_again, digest)
    assert (await second[0].exec("greet $LOCAL", session="agent")).stdout == b"hi 5\n"


async def test_a_live_snapshot_is_taken_between_commands(
    client: AsyncClient, live_pool: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with client.acquire(live_pool, timeout=120) as sb:

        async def sleeping(seconds: int) -> bool:
            return (await sb.exec(f"pgrep -f '^sleep {seconds}$'")).ok

        running = asyncio.create_task(sb.exec("sleep 2; echo done", session="agent"))
        await poll(lambda: sleeping(2), timeout=30, what="the session's command to start")
        snap = await sb.snapshot(live=True)
        assert running.done(), "the snapshot waited for the command to end"
        assert (await running).stdout == b"done\n" and snap.live

        monkeypatch.setattr(docker_shells, "_QUIET_WAIT_SECONDS", 0.5)
        endless = asyncio.create_task(sb.exec("sleep 30", session="agent", timeout=60))
        await poll(lambda: sleeping(30), timeout=30, what="the session's command to start")
        with pytest.raises(errors.FailedPrecondition, match="between commands"):
            await sb.snapshot(live=True)
        assert not endless.done(), "the command runs on, untouched"
        endless.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await endless
        # The abandoned command is killed; the session goes on.
        assert (await sb.exec("echo $0", session="agent")).ok


async def test_corrupt_live_image_is_refused_with_nothing_leased(
    app: App, client: AsyncClient, live_pool: str
) -> None:
    async with client.acquire(live_pool, timeout=120) as sb:
        await start_holder(sb)
        snap = await sb.snapshot(live=True)
    assert app.snapshots is not None
    key = blob_key(tenant_namespace("default"), snap.digest.removeprefix("sha256:"))
    pack, offset, size = (await app.snapshots._catalog.locate([key]))[key]
    with (app.settings.state_dir / "blobs" / pack).open("r+b") as fh:
        fh.seek(offset + size // 2)
        fh.write(b"corrupt!")
    with pytest.raises(errors.FailedPrecondition, match="corrupt"):
        await client.restore(snap.id, n=2, timeout=120)
    assert await client.list_sandboxes(live_pool, state=LEASED) == []


async def test_live_snapshots_count_in_the_quota_and_expire(
    tmp_path: Path, engine: docker.DockerClient, image: str, gvisor: None
) -> None:
    settings = make_settings(tmp_path, **{"snapshots.quota_bytes": 1 << 20})
    async with running_app(settings, engine) as app, AsyncClient(app.address) as client:
        assert app.snapshots is not None
        await client.create_pool("live", image, min_ready=1, max_size=2, runtime=GVISOR)
        async with client.acquire("live", timeout=120) as sb:
            await start_holder(sb)
            # An image of several MiB does not fit a 1 MiB quota: nothing is stored.
            with pytest.raises(errors.ResourceExhausted, match="quota"):
                await sb.snapshot(live=True)
            assert await app.snapshots.blobs.list_keys() == []
            assert await app.snapshots.usage() == 0
            app.snapshots.settings.quota_bytes = 0
            snap = await sb.snapshot(live=True, ttl=1.0)
            assert await app.snapshots.usage() == snap.size_bytes

        async def expired() -> bool:
            try:
                await client.get_snapshot(snap.id)
            except errors.NotFound:
                return True
            return False

        await poll(expired, timeout=30, what="the live snapshot to expire")
        with pytest.raises(errors.NotFound):
            await client.restore(snap.id, timeout=60)
        await app.snapshots.gc()
        assert await app.snapshots.blobs.list_keys() == []
        assert await app.snapshots.usage() == 0


async def test_a_restarted_server_thaws_a_paused_sandbox_and_release_removes_a_paused_one(
    tmp_path: Path, engine: docker.DockerClient, image: str, gvisor: None
) -> None:
    settings = make_settings(tmp_path)
    first = build_app(settings)
    await first.start()
    try:
        async with AsyncClient(first.address) as client:
            await client.create_pool("live", image, min_ready=1, max_size=2, runtime=GVISOR)
            lease = await client.lease("live", timeout=120, lease_ttl=600)
            token, _, _ = await start_holder(lease[0])
            await lease[0].pause()
    finally:
        await first.stop(grace=1)
    # Leased sandboxes outlive their server; the next one adopts them, and
    # it knows nothing of the pause: the sandbox runs again.
    async with running_app(settings, engine) as again, AsyncClient(again.address) as client:
        adopted = await client.get_sandbox(lease[0].id)
        assert not adopted.paused
        sb = Sandbox(client, adopted, lease.id)
        _, tick, _ = await holder_state(sb)
        assert (await ticking_past(sb, tick))[0] == token
        # Released while paused: thawed, then removed (running_app checks
        # that no container is left).
        assert (await sb.pause()).paused
        await client.release(lease.id)
        assert await client.list_sandboxes("live", state=LEASED) == []


async def test_runc_sandboxes_refuse_live_snapshots_and_pause(client: AsyncClient, pool: str) -> None:
    async with client.acquire(pool, timeout=60) as sb:
        with pytest.raises(errors.FailedPrecondition, match="runtime 'runc'"):
            await sb.snapshot(live=True)
        with pytest.raises(errors.FailedPrecondition, match="runtime 'runc'"):
            await sb.pause()
        with pytest.raises(errors.FailedPrecondition, match="no keeper"):
            await sb.keep("sleep 1")
        assert (await sb.exec("true")).ok


async def test_a_live_snapshot_does_not_restore_into_a_runc_pool(
    client: AsyncClient, live_pool: str, image: str
) -> None:
    await client.create_pool("plain", image, min_ready=0, max_size=2)
    async with client.acquire(live_pool, timeout=120) as sb:
        snap = await sb.snapshot(live=True)
    with pytest.raises(errors.FailedPrecondition, match="runtime 'runc'"):
        await client.restore(snap.id, pool="plain", timeout=60)
    assert await client.list_sandboxes("plain", state=LEASED) == []
