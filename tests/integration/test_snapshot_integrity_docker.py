"""Snapshots that are never silently stale or incomplete, on the real engine
(runc, workspaces read in place): writes through a shared mapping (Python's
mmap, SQLite in WAL mode) are in the incremental snapshot, its restore and
its fork; a file under a write lease fails the snapshot naming it; a log
being appended to is read, downloaded and snapshotted as of a moment; a
snapshot of a sandbox being restored is refused until the restore answers;
a workspace over its inotify watch budget still gets exact snapshots."""

from __future__ import annotations

import asyncio
import io
import tarfile
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import docker
import pytest

from sandboxd import errors
from sandboxd.app import App
from sandboxd.backends.base import GVISOR, RUNC
from sandboxd.client import AsyncClient, Sandbox
from sandboxd.core.snapshots import LABEL_SNAPSHOT
from sandboxd.core.snapshots import journal as journals
from sandboxd.v1 import common_pb2
from tests.integration.conftest import NO_GVISOR, gvisor_registered, make_settings, poll, running_app

pytestmark = [pytest.mark.docker, pytest.mark.timeout(240)]

# Maps data.bin shared, writes a page, then on each go file in /tmp writes
# that page again (the page is dirty already: no fault, no time moved, no
# event), and after the last one unmaps and exits.
MAPPER = r"""
import mmap, os, time
fd = os.open("/workspace/data.bin", os.O_RDWR)
m = mmap.mmap(fd, 8192)
os.close(fd)
def step(n, text):
    m[0:len(text)] = text
    open(f"/tmp/done{n}", "w").close()
step(1, b"v1-through-the-mapping")
for n, text in ((2, b"v2-same-page-again!!!!"), (3, b"v3-then-unmapped!!!!!!")):
    while not os.path.exists(f"/tmp/go{n}"):
        time.sleep(0.01)
    step(n, text)
m.close()
open("/tmp/unmapped", "w").close()
"""


async def run_ok(sb: Sandbox, command: str, **kwargs: Any) -> str:
    r = await sb.exec(command, **kwargs)
    assert r.ok, r
    return str(r.text)


async def exists(sb: Sandbox, path: str) -> bool:
    return (await sb.exec(f"test -e {path}")).exit_code == 0


async def until(sb: Sandbox, path: str) -> None:
    await poll(lambda: exists(sb, path), timeout=60, what=path)


async def head(sb: Sandbox, path: str = "/workspace/data.bin") -> str:
    return await run_ok(sb, f"head -c 22 {path}")


async def mapping_round(client: AsyncClient, pool: str) -> None:
    """A file written through a mapping made after the first snapshot: each
    snapshot after it (mapped, written again, unmapped) holds what the
    mapping wrote, and so do its restore and its fork."""
    lease = await client.lease(pool, timeout=60)
    snaps = []
    try:
        sb = lease[0]
        await run_ok(sb, "head -c 8192 /dev/zero > data.bin && printf 'other' > other.txt")
        await sb.write_file("/tmp/mapper.py", MAPPER)
        first = await sb.snapshot()
        await run_ok(sb, "python3 /tmp/mapper.py >/tmp/mapper.log 2>&1 &", session="m")
        await until(sb, "/tmp/done1")
        snaps.append(await sb.snapshot())
        await run_ok(sb, "touch /tmp/go2")
        await until(sb, "/tmp/done2")
        # Mapped still, and changed without a stamp or an event.
        snaps.append(await sb.snapshot())
        await run_ok(sb, "touch /tmp/go3")
        await until(sb, "/tmp/unmapped")
        # Unmapped since the last snapshot; changed while it was mapped.
        snaps.append(await sb.snapshot())
        assert [s.parent_id for s in snaps] == [first.id, snaps[0].id, snaps[1].id], "each is incremental"
        assert len({first.digest, *(s.digest for s in snaps)}) == 4, "every snapshot saw its change"
        assert all(s.stored_bytes > 0 for s in snaps)
        quiet = await sb.snapshot()
        assert quiet.digest == snaps[-1].digest and quiet.stored_bytes == 0, "unchanged since: nothing read"
    finally:
        await lease.release()
    wants = ["v1-through-the-mapping", "v2-same-page-again!!!!", "v3-then-unmapped!!!!!!"]
    for snap, want in zip(snaps, wants, strict=True):
        restored = await client.restore(snap.id, n=2 if want.startswith("v3") else 1, timeout=60)
        try:
            for target in restored:
                assert await head(target) == want
        finally:
            await restored.release()


async def test_writes_through_a_shared_mapping_are_in_every_incremental_snapshot(
    app: App, client: AsyncClient, pool: str
) -> None:
    await mapping_round(client, pool)


@pytest.fixture(params=[RUNC, GVISOR])
def through_runtime(request: pytest.FixtureRequest, engine: docker.DockerClient) -> str:
    if request.param == GVISOR and not gvisor_registered(engine):
        pytest.skip(NO_GVISOR)
    return str(request.param)


async def test_writes_through_a_mapping_are_seen_through_the_sandbox_too(
    tmp_path: Path, engine: docker.DockerClient, image: str, through_runtime: str
) -> None:
    """Read through the sandbox (gVisor always; runc as through a remote
    engine): the listing names what the sandbox user's processes map."""
    settings = make_settings(tmp_path, **{"backend.host_workspaces": False})
    async with running_app(settings, engine) as app, AsyncClient(app.address) as client:
        await client.create_pool("it", image, min_ready=1, max_size=4, runtime=through_runtime)
        await mapping_round(client, "it")


SQLITE = r"""
import sqlite3, sys
db = sqlite3.connect("/workspace/app.db")
if sys.argv[1] == "init":
    assert db.execute("pragma journal_mode=wal").fetchone()[0] == "wal"
    db.execute("create table t (k text primary key, v text)")
    db.execute("insert into t values ('answer', 'before')")
    db.commit()
else:
    db.execute("update t set v = ? where k = 'answer'", (sys.argv[1],))
    db.commit()
    open("/tmp/written-" + sys.argv[1], "w").close()
    import time, os
    while not os.path.exists("/tmp/close"):
        time.sleep(0.01)
"""

READ_DB = (
    'cd /workspace && python3 -c "import sqlite3; '
    "print(sqlite3.connect('app.db').execute('select v from t').fetchone()[0])\""
)


async def test_sqlite_in_wal_mode_is_snapshotted_while_its_writer_is_open(
    app: App, client: AsyncClient, pool: str
) -> None:
    lease = await client.lease(pool, timeout=60)
    try:
        sb = lease[0]
        await sb.write_file("/tmp/db.py", SQLITE)
        await run_ok(sb, "python3 /tmp/db.py init")
        first = await sb.snapshot()
        # The writer keeps the database (and its -shm index, mapped shared) open.
        await run_ok(sb, "python3 /tmp/db.py after >/tmp/db.log 2>&1 &", session="w")
        await until(sb, "/tmp/written-after")
        second = await sb.snapshot()
        assert second.parent_id == first.id and second.digest != first.digest
        await run_ok(sb, "touch /tmp/close")
    finally:
        await lease.release()
    fork = await client.restore(second.id, n=2, timeout=60)
    try:
        for target in fork:
            assert (await run_ok(target, READ_DB)).strip() == "after"
    finally:
        await fork.release()


LEASER = r"""
import fcntl, os, signal, time
# A lease break is announced with SIGIO, which would end this process.
signal.signal(signal.SIGIO, signal.SIG_IGN)
fd = os.open("/workspace/leased.txt", os.O_RDONLY)
fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)
open("/tmp/leased", "w").close()
while not os.path.exists("/tmp/unlease"):
    time.sleep(0.01)
fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
open("/tmp/unleased", "w").close()
"""


async def lease_round(client: AsyncClient, pool: str) -> None:
    """A leased file fails the first snapshot and an incremental one, naming
    it; once the lease is given up, the snapshot holds it."""
    lease = await client.lease(pool, timeout=60)
    try:
        sb = lease[0]
        await run_ok(sb, "printf 'kept' > leased.txt && mkdir d && printf x > d/f")
        await sb.write_file("/tmp/leaser.py", LEASER)
        for incremental in (False, True):
            await run_ok(sb, "rm -f /tmp/leased /tmp/unlease /tmp/unleased")
            await run_ok(sb, "python3 /tmp/leaser.py >/tmp/leaser.log 2>&1 &", session="l")
            await until(sb, "/tmp/leased")
            if incremental:
                await run_ok(sb, "printf y > d/f")  # the next snapshot reads a change, not the whole
            with pytest.raises(
                errors.FailedPrecondition, match=r"/workspace/leased\.txt is held under a write lease"
            ):
                await sb.snapshot()
            await run_ok(sb, "touch /tmp/unlease")
            await until(sb, "/tmp/unleased")
            snap = await sb.snapshot()
            assert snap.entry_count == 3
            if not incremental:
                await run_ok(sb, "printf 'changed' > leased.txt")
    finally:
        await lease.release()
    restored = await client.restore(snap.id, timeout=60)
    try:
        assert await run_ok(restored[0], "cat /workspace/leased.txt /workspace/d/f") == "changedy"
    finally:
        await restored.release()


async def test_a_file_under_a_write_lease_fails_the_snapshot_naming_it(
    app: App, client: AsyncClient, pool: str
) -> None:
    await lease_round(client, pool)


async def test_a_leased_file_is_refused_in_the_same_words_through_the_sandbox(
    tmp_path: Path, engine: docker.DockerClient, image: str
) -> None:
    """tar in the sandbox opens files without blocking too: the lease's
    EAGAIN becomes the same FAILED_PRECONDITION as in place."""
    settings = make_settings(tmp_path, **{"backend.host_workspaces": False})
    async with running_app(settings, engine) as app, AsyncClient(app.address) as client:
        await client.create_pool("it", image, min_ready=1, max_size=4)
        await lease_round(client, "it")


APPENDER = r"""
import os
fd = os.open("/workspace/app.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
i = 0
while not os.path.exists("/tmp/stop"):
    os.write(fd, b"%08d\n" % i)
    i += 1
    if i == 700_000:
        open("/tmp/long", "w").close()
os.close(fd)
open("/tmp/stopped", "w").close()
"""


def is_prefix(content: bytes) -> bool:
    """Whether ``content`` is the appender's lines 0.. in order, whole."""
    if not content or len(content) % 9:
        return False
    lines = content.split(b"\n")[:-1]
    return lines[0] == b"00000000" and lines[-1] == b"%08d" % (len(lines) - 1)


async def test_a_file_being_appended_to_is_read_as_of_a_moment(
    app: App, client: AsyncClient, pool: str
) -> None:
    lease = await client.lease(pool, timeout=60)
    snaps = []
    try:
        sb = lease[0]
        await sb.write_file("/tmp/appender.py", APPENDER)
        await run_ok(sb, "printf 'x' > other.txt")
        snaps.append(await sb.snapshot())
        await run_ok(sb, "python3 /tmp/appender.py >/tmp/appender.log 2>&1 &", session="a")
        await until(sb, "/tmp/long")  # above the inline size: streamed in pieces
        for _ in range(3):
            content = await sb.read_file("app.log")
            assert is_prefix(content), content[-40:]
            with tarfile.open(fileobj=io.BytesIO(await sb.download_dir("."))) as tar:
                member = tar.extractfile("./app.log")
                assert member is not None and is_prefix(member.read())
            snaps.append(await sb.snapshot())
        await run_ok(sb, "touch /tmp/stop")
        await until(sb, "/tmp/stopped")
    finally:
        await lease.release()
    assert [s.parent_id for s in snaps[1:]] == [s.id for s in snaps[:-1]]
    for snap in snaps[1:]:
        restored = await client.restore(snap.id, timeout=60)
        try:
            content = await restored[0].read_file("app.log")
            assert is_prefix(content)
            # What the snapshot records is what it stored.
            assert snap.size_bytes == len(content) + 1
        finally:
            await restored.release()


async def test_a_snapshot_of_a_sandbox_being_restored_is_refused_until_the_restore_answers(
    app: App, client: AsyncClient, pool: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    lease = await client.lease(pool, timeout=60)
    try:
        sb = lease[0]
        source = sb.id
        await run_ok(sb, "mkdir -p src && printf 'print(1)' > src/main.py")
        snap = await sb.snapshot()
    finally:
        await lease.release()
    assert app.snapshots is not None
    restore = app.snapshots._restore
    hold = asyncio.Event()
    original: Callable[..., Awaitable[None]] = restore._restore_into

    async def held(*args: Any) -> None:
        await hold.wait()
        await original(*args)

    monkeypatch.setattr(restore, "_restore_into", held)
    restoring = asyncio.create_task(client.restore(snap.id, timeout=60))
    try:

        async def target() -> list[Any]:
            found = await client.list_sandboxes(
                pool, state=common_pb2.SANDBOX_STATE_LEASED, labels={LABEL_SNAPSHOT: snap.id}
            )
            return [s for s in found if s.id != source]

        async def seen() -> bool:
            return bool(await target())

        await poll(seen, timeout=60, what="the restore's target")
        (info,) = await target()
        with pytest.raises(errors.FailedPrecondition, match=f"being restored from snapshot {snap.id}"):
            await client.snapshot(info.id)
        hold.set()
        restored = await restoring
    except BaseException:
        hold.set()
        restoring.cancel()
        await asyncio.gather(restoring, return_exceptions=True)
        raise
    try:
        again = await restored[0].snapshot()
        assert again.entry_count == snap.entry_count == 2 and again.digest == snap.digest
    finally:
        await restored.release()


@pytest.fixture
async def small_budget_app(tmp_path: Path, engine: docker.DockerClient, image: str) -> AsyncIterator[App]:
    settings = make_settings(tmp_path, **{"snapshots.inotify_watches_per_sandbox": 4})
    async with running_app(settings, engine) as app:
        yield app


async def test_a_workspace_over_its_watch_budget_gets_exact_snapshots_by_walking(
    small_budget_app: App, image: str
) -> None:
    app = small_budget_app
    async with AsyncClient(app.address) as client:
        await client.create_pool("it", image, min_ready=1, max_size=4)
        lease = await client.lease("it", timeout=60)
        try:
            sb = lease[0]
            await run_ok(sb, "mkdir -p a/b/c/d/e f g && printf 1 > a/b/c/d/e/deep && printf 1 > g/top")
            first = await sb.snapshot()
            assert app.snapshots is not None
            assert app.snapshots.watcher.degraded[journals.BUDGET] >= 1
            assert app.snapshots.watcher.watches == 0, "a journal over its budget holds no watch"
            await run_ok(sb, "printf 2 > a/b/c/d/e/deep && rm g/top && mkdir -p h/i && printf 3 > h/i/new")
            second = await sb.snapshot()
            assert second.parent_id == first.id and second.digest != first.digest
        finally:
            await lease.release()
        restored = await client.restore(second.id, timeout=60)
        try:
            r = await run_ok(restored[0], "cd /workspace && cat a/b/c/d/e/deep h/i/new; ls g")
            assert r == "23"
        finally:
            await restored.release()
