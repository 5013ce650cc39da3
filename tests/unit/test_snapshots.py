"""Snapshots on the fake backend: round trip, fork, incremental capture,
lineage, retention, quota, GC safety, hostile manifests, tenancy."""

from __future__ import annotations

import asyncio
import io
import sqlite3
import tarfile
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import grpc
import pytest

from sandboxd import cli, errors
from sandboxd.app import App, make_snapshot_manager
from sandboxd.backends.snapshot_shell import TAR_SCRIPT
from sandboxd.client import AsyncClient
from sandboxd.clock import FakeClock
from sandboxd.core.files import FileData
from sandboxd.core.lifecycle import State
from sandboxd.core.snapshots import (
    LABEL_POLICY,
    LABEL_SNAPSHOT,
    SnapshotManager,
    blob_key,
    tenant_namespace,
)
from sandboxd.core.snapshots import manifest as mf
from sandboxd.core.snapshots.catalog import MAX_DEPTH
from sandboxd.core.snapshots.manifest import Entry
from sandboxd.core.snapshots.tarstream import read_members
from sandboxd.core.tenancy import acting_as
from sandboxd.v1 import snapshots_pb2
from tests.unit.conftest import IMAGE, Harness, MakeApp, MakeControl

pytestmark = pytest.mark.timeout(60)


def tar_of(members: list[tuple[str, str, bytes | str, int]]) -> bytes:
    """(name, kind f/d/l, content or link target, mode) -> tar bytes."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, kind, data, mode in members:
            info = tarfile.TarInfo(name)
            info.mode = mode
            if kind == "d":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif kind == "l":
                info.type, info.linkname = tarfile.SYMTYPE, str(data)
                tar.addfile(info)
            else:
                raw = data.encode() if isinstance(data, str) else data
                info.size = len(raw)
                tar.addfile(info, io.BytesIO(raw))
    return buf.getvalue()


def listing_of(tar: bytes) -> dict[str, tuple[str, int, bytes | str]]:
    out: dict[str, tuple[str, int, bytes | str]] = {}
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        for m in t:
            name = m.name.removeprefix("./")
            if name in (".", ""):
                continue
            if m.isdir():
                out[name] = ("d", m.mode, b"")
            elif m.issym():
                out[name] = ("l", 0, m.linkname)
            else:
                fh = t.extractfile(m)
                out[name] = ("f", m.mode, fh.read() if fh else b"")
    return out


WORKSPACE_TAR = tar_of(
    [
        ("src", "d", b"", 0o755),
        ("src/main.py", "f", "print('hi')\n", 0o644),
        ("run.sh", "f", "#!/bin/sh\necho run\n", 0o775),
        ("secret", "f", "s3cr3t", 0o600),
        ("empty", "d", b"", 0o700),
        ("link", "l", "src/main.py", 0o777),
        ("big.bin", "f", bytes(range(256)) * 40, 0o644),
    ]
)


async def prepared(client: AsyncClient) -> Any:
    """A leased sandbox with WORKSPACE_TAR and session state (cwd src, X=1 2)."""
    await client.create_pool("p", IMAGE, min_ready=2, max_size=16)
    lease = await client.lease("p", timeout=5)
    sb = lease[0]
    await sb.upload_dir(WORKSPACE_TAR)
    assert (await sb.exec("cd src; export X=one; export Y=two", session="agent")).ok
    return lease


async def test_round_trip_fidelity(app: App, client: AsyncClient) -> None:
    lease = await prepared(client)
    sb = lease[0]
    snap = await sb.snapshot(session="agent", labels={"run": "r1"}, policy_version=7, turn=3)
    assert snap.id.startswith("sn-") and snap.digest.startswith("sha256:")
    assert (snap.cwd, dict(snap.env)) == ("/workspace/src", {"X": "one", "Y": "two"})
    assert snap.entry_count == 7
    assert snap.size_bytes == snap.stored_bytes == len("print('hi')\n#!/bin/sh\necho run\ns3cr3t") + 10240
    assert [(r.id, r.policy_version, r.turn) for r in snap.chain] == [(snap.id, 7, 3)]

    restored = await client.restore(snap.id, timeout=5)
    target = restored[0]
    assert target.id != sb.id
    assert listing_of(await target.download_dir(".")) == listing_of(await sb.download_dir("."))
    r = await target.exec("pwd; env", session="agent")
    assert r.text.splitlines() == ["/workspace/src", "X=one", "Y=two"]
    # Lineage travels with the sandbox.
    info = await client.get_sandbox(target.id)
    assert info.labels[LABEL_SNAPSHOT] == snap.id and info.labels[LABEL_POLICY] == "7"
    # Same content, same digest; the source is untouched and can go away.
    await lease.release()
    again = await target.snapshot(session="agent")
    assert again.digest == snap.digest and again.stored_bytes == 0


async def test_fork_of_n(app: App, client: AsyncClient) -> None:
    lease = await prepared(client)
    snap = await lease[0].snapshot(session="agent")
    fork = await client.restore(snap.id, n=5, labels={"group": "g1"}, timeout=5)
    assert len(fork) == 5 and len({s.id for s in fork}) == 5
    results = await asyncio.gather(*(s.exec("cat main.py; env", session="agent") for s in fork))
    assert all(r.text == "print('hi')\nX=one\nY=two\n" for r in results)
    assert all(s.info.labels["group"] == "g1" and s.info.labels[LABEL_SNAPSHOT] == snap.id for s in fork)
    # One lease holds the whole group; releasing it frees all five.
    assert len({s.lease_id for s in fork}) == 1
    await fork.release()
    leased = await client.list_sandboxes("p", state=int(State.LEASED))
    assert [s.id for s in leased] == [lease[0].id]


async def test_restore_without_session_and_a_dead_parent(app: App, client: AsyncClient) -> None:
    lease = await prepared(client)
    snap = await lease[0].snapshot()
    assert snap.session == "" and snap.cwd == ""
    await lease.release()
    restored = await client.restore(snap.id, timeout=5)
    assert (await restored[0].read_file("secret")) == b"s3cr3t"
    assert (await restored[0].exec("pwd", session="agent")).text == "/workspace\n"


async def test_incremental_snapshot_reads_and_stores_only_changes(
    app: App, client: AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    manager = app.snapshots
    assert manager is not None
    lease = await prepared(client)
    parent = await lease[0].snapshot(session="agent", policy_version=1, turn=1)
    restored = await client.restore(parent.id, timeout=5)
    target = restored[0]
    await target.write_files({"src/main.py": "print('changed')\n", "new.txt": "new"})

    read: list[bytes] = []
    written: list[int] = []
    real_run, real_put = manager._workspaces.run, manager.blobs.put_absent

    async def spy_run(rec: Any, script: str, **kw: Any) -> bytes:
        if script == TAR_SCRIPT:
            read.append(kw["stdin"])
        return await real_run(rec, script, **kw)

    async def spy_put(blobs: Mapping[str, bytes]) -> int:
        written.append(await real_put(blobs))
        return written[-1]

    monkeypatch.setattr(manager._workspaces, "run", spy_run)
    monkeypatch.setattr(manager.blobs, "put_absent", spy_put)
    child = await target.snapshot(session="agent", policy_version=2, turn=2)
    assert read == [b"new.txt\x00src/main.py\x00"], "only changed files are read"
    assert sum(written) == child.stored_bytes
    assert child.stored_bytes == len("print('changed')\n") + len("new")
    assert child.parent_id == parent.id
    assert [(r.id, r.policy_version) for r in child.chain] == [(parent.id, 1), (child.id, 2)]
    # Unchanged since the last snapshot: nothing is stored, and nothing is read
    # but files written so shortly before the last listing that a change in
    # the same kernel timestamp tick could have gone unseen ("racy" files).
    read.clear()
    written.clear()
    third = await target.snapshot(session="agent", policy_version=3)
    assert read in ([], [b"new.txt\x00src/main.py\x00"])
    assert sum(written) == 0 and third.stored_bytes == 0
    assert [r.policy_version for r in (await client.get_snapshot(third.id)).chain] == [1, 2, 3]
    # A child restores with the changes and stays intact when its parent goes.
    await client.delete_snapshot(parent.id)
    await manager.gc()
    again = await client.restore(child.id, timeout=5)
    assert await again[0].read_files(["src/main.py", "secret", "new.txt"]) == {
        "src/main.py": b"print('changed')\n",
        "secret": b"s3cr3t",
        "new.txt": b"new",
    }


async def test_files_carried_over_are_read_again_when_their_parent_and_blobs_are_gone(
    app: App, client: AsyncClient
) -> None:
    """A delta listing carries unchanged files over by digest; if the parent
    snapshot was deleted and collected, those blobs no longer exist, so the
    next snapshot reads the files again instead of referencing nothing."""
    manager = app.snapshots
    assert manager is not None
    lease = await prepared(client)
    sb = lease[0]
    parent = await sb.snapshot(session="agent")
    await client.delete_snapshot(parent.id)
    assert (await manager.gc()).deleted_blobs > 0
    await sb.write_files({"new.txt": "n"})
    child = await sb.snapshot(session="agent")
    assert child.stored_bytes == child.size_bytes, "every file's content was stored again"
    again = await client.restore(child.id, timeout=5)
    assert await again[0].read_files(["src/main.py", "secret", "new.txt", "big.bin"]) == {
        "src/main.py": b"print('hi')\n",
        "secret": b"s3cr3t",
        "new.txt": b"n",
        "big.bin": bytes(range(256)) * 40,
    }


async def test_list_get_delete_and_ttl(make_app: MakeApp) -> None:
    clock = FakeClock()
    app = await make_app(snapshots__gc_interval_seconds=0.0)
    manager = app.snapshots
    assert manager is not None
    manager._clock = clock
    async with AsyncClient(app.address) as client:
        lease = await prepared(client)
        a = await lease[0].snapshot(labels={"run": "r1", "kind": "a"}, ttl=10)
        b = await lease[0].snapshot(labels={"run": "r1", "kind": "b"})
        c = await lease[0].snapshot(labels={"run": "r2"})
        assert [s.id for s in await client.list_snapshots(labels={"run": "r1"})] == [a.id, b.id]
        assert [s.id for s in await client.list_snapshots(parent_id=b.id)] == [c.id]
        assert [s.id for s in await client.list_snapshots(pool="other")] == []
        await client.delete_snapshot(c.id)
        with pytest.raises(errors.NotFound):
            await client.get_snapshot(c.id)
        with pytest.raises(errors.NotFound):
            await client.delete_snapshot(c.id)
        with pytest.raises(errors.InvalidArgument):
            await client.get_snapshot("bogus")
        clock.advance(11)
        with pytest.raises(errors.NotFound):
            await client.get_snapshot(a.id)
        assert [s.id for s in await client.list_snapshots()] == [b.id]
        result = await manager.gc()
        assert result.expired_snapshots == 1


async def test_quota_exceeded_is_resource_exhausted(make_app: MakeApp) -> None:
    app = await make_app(snapshots__quota_bytes=11_000)
    async with AsyncClient(app.address) as client:
        lease = await prepared(client)
        sb = lease[0]
        first = await sb.snapshot()
        assert first.stored_bytes < 11_000
        # Identical content is stored once and does not count twice.
        second = await sb.snapshot()
        assert second.stored_bytes == 0
        await sb.write_files({"more.bin": b"x" * 2000})
        with pytest.raises(errors.ResourceExhausted) as info:
            await sb.snapshot()
        assert info.value.retry_after is None
        assert "quota" in info.value.message
        code = None
        try:
            await client.snapshots.Snapshot(snapshots_pb2.SnapshotRequest(sandbox_id=sb.id))
        except grpc.aio.AioRpcError as e:
            code = e.code()
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        # The refused snapshot left nothing behind; freeing space makes room.
        assert [x.id for x in await client.list_snapshots()] == [first.id, second.id]
        await client.delete_snapshot(first.id)
        await client.delete_snapshot(second.id)
        await sb.write_files({"big.bin": b"small now"})
        # (more.bin's blob, written before the refusal, was deleted with it.)
        assert (await sb.snapshot()).size_bytes == 12277 - 10240 + len("small now")


async def test_restore_checks_pool_limits_before_acquiring(app: App, client: AsyncClient) -> None:
    lease = await prepared(client)
    snap = await lease[0].snapshot()
    await client.create_pool("tiny", IMAGE, max_size=2, limits={"max_files": 16, "disk_bytes": 1 << 20})
    await client.create_pool("huge-files", IMAGE, max_size=2)
    fits = await client.restore(snap.id, pool="tiny", timeout=5)
    await fits.release()
    await lease[0].write_files({f"f{i}": "x" for i in range(12)})
    crowded = await lease[0].snapshot()
    with pytest.raises(errors.FailedPrecondition, match="entries"):
        await client.restore(crowded.id, pool="tiny", timeout=5)
    await client.create_pool("other-image", "sandboxd/other:1", max_size=2)
    with pytest.raises(errors.FailedPrecondition, match="image"):
        await client.restore(snap.id, pool="other-image", timeout=5)
    with pytest.raises(errors.FailedPrecondition):
        await client.restore(snap.id, n=20, timeout=5)
    assert (await client.get_pool("tiny")).status.leased == 0


# -- core level -----------------------------------------------------------------


@pytest.fixture
async def snaps(make_control: MakeControl, tmp_path: Path) -> AsyncIterator[tuple[Harness, SnapshotManager]]:
    h = await make_control(state_dir=str(tmp_path), snapshots__gc_interval_seconds=0.0)
    manager = make_snapshot_manager(h.settings, h.control, h.clock, persist=True)
    await manager.start()
    try:
        yield h, manager
    finally:
        await manager.stop()


async def leased_with(h: Harness, files: dict[str, bytes], pool: str = "p") -> str:
    if pool not in {p.config.name.split("/")[-1] for p in h.control.list_pools()}:
        await h.pool(pool, max_size=16)
    _, records = await h.acquire(pool)
    sid = records[0].sandbox_id
    await h.control.upload_directory(sid, ".", _once(tar_of([(p, "f", c, 0o644) for p, c in files.items()])))
    return sid


async def _once(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def test_cross_tenant_access_is_not_found(snaps: tuple[Harness, SnapshotManager]) -> None:
    h, manager = snaps
    sid = await leased_with(h, {"a": b"tenant default"})
    snap = await manager.snapshot(sid, labels={"run": "x"})
    with acting_as("other"):
        for call in (
            lambda: manager.get(snap.id),
            lambda: manager.delete(snap.id),
            lambda: manager.restore(snap.id, timeout=5),
        ):
            with pytest.raises(errors.NotFound) as info:
                await call()
            assert "other" not in info.value.message
        assert await manager.list_snapshots() == []
        assert await manager.usage() == 0
        # Nor can another tenant snapshot this tenant's sandbox.
        with pytest.raises(errors.NotFound):
            await manager.snapshot(sid)
    assert (await manager.get(snap.id)).id == snap.id
    # Blob namespaces differ per tenant, so usage and dedup never cross tenants.
    assert tenant_namespace("default") != tenant_namespace("other")


async def test_corrupt_blob_fails_clearly_and_leaves_nothing_leased(
    snaps: tuple[Harness, SnapshotManager], tmp_path: Path
) -> None:
    h, manager = snaps
    sid = await leased_with(h, {"a.txt": b"good content", "b.txt": b"other"})
    snap = await manager.snapshot(sid)
    digest = next(iter(((await manager._catalog.entries(snap.id)) or {}).values())).digest
    key = blob_key(tenant_namespace("default"), digest)
    pack, offset, size = (await manager._catalog.locate([key]))[key]
    path = tmp_path / "blobs" / pack
    with path.open("r+b") as fh:  # same length, other bytes: only the digest check can tell
        fh.seek(offset)
        fh.write(b"X" * size)
    pool = h.control.get_pool("p")
    leased_before = pool.count(State.LEASED)
    with pytest.raises(errors.FailedPrecondition, match="corrupt"):
        await manager.restore(snap.id, timeout=5)
    assert pool.count(State.LEASED) == leased_before
    path.unlink()
    with pytest.raises(errors.FailedPrecondition, match="corrupt"):
        await manager.restore(snap.id, timeout=5)


async def test_failure_while_restoring_destroys_the_targets(
    snaps: tuple[Harness, SnapshotManager], monkeypatch: pytest.MonkeyPatch
) -> None:
    h, manager = snaps
    sid = await leased_with(h, {"a.txt": b"content"})
    snap = await manager.snapshot(sid)
    calls = 0
    real = h.backend.put_tar

    async def flaky(handle: str, dest: str, chunks: AsyncIterator[bytes]) -> None:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise errors.ResourceExhausted("workspace is full (bytes)")
        await real(handle, dest, chunks)

    monkeypatch.setattr(h.backend, "put_tar", flaky)
    pool = h.control.get_pool("p")
    with pytest.raises(errors.FailedPrecondition, match="destroyed"):
        await manager.restore(snap.id, n=3, timeout=5)
    assert pool.count(State.LEASED) == 1  # only the source
    assert not [lease for lease in h.control.leases.all() if len(lease.sandbox_ids) == 3]


async def test_tampered_manifest_is_refused(snaps: tuple[Harness, SnapshotManager], tmp_path: Path) -> None:
    h, manager = snaps
    sid = await leased_with(h, {"a.txt": b"content"})
    snap = await manager.snapshot(sid)
    hostile = [Entry("../../etc/cron.d/x", mf.FILE, 0o644, 7, "0" * 64)]
    db = sqlite3.connect(tmp_path / "unit-snapshots.sqlite3")
    with db:
        db.execute("UPDATE snapshots SET manifest = ? WHERE id = ?", (mf.encode(hostile), snap.id))
    db.close()
    with pytest.raises(errors.FailedPrecondition, match="unsafe"):
        await manager.restore(snap.id, timeout=5)
    assert h.control.get_pool("p").count(State.LEASED) == 1


@pytest.mark.parametrize(
    ("entry", "why"),
    [
        (Entry("../x", "f", 0o644, 1, "a" * 64), "'..'"),
        (Entry("a/../../x", "f", 0o644, 1, "a" * 64), "normalised"),
        (Entry("/etc/passwd", "f", 0o644, 1, "a" * 64), "absolute"),
        (Entry("", "f", 0o644, 1, "a" * 64), "empty"),
        (Entry("dev", "c", 0o644), "kind"),
        (Entry("fifo", "p", 0o644), "kind"),
        (Entry("suid", "f", 0o4755, 1, "a" * 64), "setuid"),
        (Entry("sgid", "d", 0o2755), "setuid"),
        (Entry("bad", "f", 0o644, 1, "xyz"), "digest"),
        (Entry("up", "l", 0o777, target="../../etc"), "leaves"),
        (Entry("abs", "l", 0o777, target="/etc/passwd"), "leaves"),
        (Entry("deep/l", "l", 0o777, target="../../x"), "leaves"),
        (Entry("nul", "l", 0o777, target="a\x00b"), "leaves"),
    ],
)
def test_hostile_manifest_entries_are_rejected(entry: Entry, why: str) -> None:
    with pytest.raises(mf.UnsafeSnapshot, match=why):
        mf.validate([entry])


def test_writing_through_a_symlink_is_rejected() -> None:
    entries = [
        Entry("d", "l", 0o777, target="sub"),
        Entry("sub", "d", 0o755),
        Entry("d/x", "f", 0o644, 1, "a" * 64),
    ]
    with pytest.raises(mf.UnsafeSnapshot, match="not a directory"):
        mf.validate(entries)
    mf.validate([Entry("ok", "l", 0o777, target="/workspace/sub"), Entry("sub", "d", 0o755)])
    with pytest.raises(mf.UnsafeSnapshot, match="twice"):
        mf.validate([Entry("a", "d", 0o755), Entry("a", "d", 0o755)])


async def test_snapshot_refuses_links_leaving_the_workspace(snaps: tuple[Harness, SnapshotManager]) -> None:
    h, manager = snaps
    sid = await leased_with(h, {"a": b"x"})
    box = h.backend.sandboxes[h.control.get_sandbox(sid).handle]
    box.links["/workspace/escape"] = "/etc/shadow"
    with pytest.raises(errors.FailedPrecondition, match="leaves the workspace"):
        await manager.snapshot(sid)
    assert manager.pinned() == 0


async def test_tar_reader_handles_long_names_pax_and_hardlinks() -> None:
    long = "d/" + "n" * 150
    gnu = io.BytesIO()
    with tarfile.open(fileobj=gnu, mode="w", format=tarfile.GNU_FORMAT) as tar:
        info = tarfile.TarInfo(long)
        info.size = 3
        tar.addfile(info, io.BytesIO(b"abc"))
        hard = tarfile.TarInfo("./h")
        hard.type, hard.linkname = tarfile.LNKTYPE, "./" + long
        tar.addfile(hard)
        gnu_end = tar.offset
    pax = io.BytesIO()
    with tarfile.open(fileobj=pax, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("p/" + "ü" * 120)
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    data = gnu.getvalue()[:gnu_end] + pax.getvalue()

    async def chunks() -> AsyncIterator[bytes]:
        for i in range(0, len(data), 7):  # split headers across chunks
            yield data[i : i + 7]

    got = [(m.name, m.type, m.linkname, c) async for m, c in read_members(chunks())]
    assert got == [
        (long, ord("0"), "", b"abc"),
        ("h", ord("1"), long, b""),
        ("p/" + "ü" * 120, ord("0"), "", b"hi"),
    ]


# -- GC -----------------------------------------------------------------------------


async def test_gc_never_deletes_a_blob_a_snapshot_in_flight_relies_on(
    snaps: tuple[Harness, SnapshotManager], monkeypatch: pytest.MonkeyPatch
) -> None:
    h, manager = snaps
    sid = await leased_with(h, {"shared": b"shared content", "own": b"first"})
    first = await manager.snapshot(sid)
    await manager.delete(first.id)  # its blobs are garbage now...
    gate, entered = asyncio.Event(), asyncio.Event()
    real = manager.blobs.put_absent

    async def slow_put(blobs: Mapping[str, bytes]) -> int:
        entered.set()
        await gate.wait()
        return await real(blobs)

    monkeypatch.setattr(manager.blobs, "put_absent", slow_put)
    sid2 = await leased_with(h, {"shared": b"shared content", "own": b"second"})
    # ...but a new snapshot that needs the same content pins it first.
    task = asyncio.create_task(manager.snapshot(sid2))
    await asyncio.wait_for(entered.wait(), 5)
    result = await manager.gc()
    assert result.deleted_blobs == 1  # "first" only; "shared" is pinned
    gate.set()
    second = await task
    assert manager.pinned() == 0
    await manager.restore(second.id, timeout=5)
    assert (await manager.gc()).deleted_blobs == 0


async def test_gc_under_concurrent_snapshotting_keeps_every_live_snapshot_whole(
    snaps: tuple[Harness, SnapshotManager],
) -> None:
    h, manager = snaps
    await h.pool("p", max_size=40)
    sandboxes = [
        await leased_with(h, {"common": b"same everywhere", f"own{i}": f"{i}".encode()}) for i in range(8)
    ]
    kept: list[str] = []

    async def churn(i: int, sid: str) -> None:
        for round_ in range(4):
            await h.control.write_files(sid, [FileData(f"/workspace/r{round_}", b"%d" % i)])
            snap = await manager.snapshot(sid)
            if round_ % 2:
                await manager.delete(snap.id)
            else:
                kept.append(snap.id)
            await asyncio.sleep(0)  # let the collector interleave, not a wait for a condition

    async def collector() -> int:
        rounds = 0
        while not all(t.done() for t in workers):
            await manager.gc()
            rounds += 1
            await asyncio.sleep(0)
        return rounds

    workers = [asyncio.create_task(churn(i, sid)) for i, sid in enumerate(sandboxes)]
    rounds = await collector()
    await asyncio.gather(*workers)
    assert rounds > 1
    await manager.gc()
    assert manager.pinned() == 0
    for sid in kept:  # every surviving snapshot restores with verified blobs
        lease, _records, _ = await manager.restore(sid, timeout=5)
        await h.control.release(lease.lease_id, [])
    live = await manager._catalog.live_keys()
    assert set(await manager.blobs.list_keys()) == live


def test_manifest_round_trip_and_digest() -> None:
    entries = [
        Entry("a", "f", 0o644, 3, "b" * 64, mtime=5.0),
        Entry("d", "d", 0o755),
        Entry("l", "l", 0o777, target="a"),
    ]
    assert mf.decode(mf.encode(entries)) == entries
    assert mf.digest_of(entries) == mf.digest_of(list(reversed(entries)))
    with pytest.raises(mf.UnsafeSnapshot):
        mf.decode(b"not a manifest")
    assert mf.footprint(entries) == (4, 4096)


async def test_cli_lists_gets_and_deletes(
    app: App, client: AsyncClient, capsys: pytest.CaptureFixture[str]
) -> None:
    lease = await prepared(client)
    snap = await lease[0].snapshot(labels={"run": "cli"}, policy_version=4)
    target = ["--target", app.address]
    assert await asyncio.to_thread(cli.main, ["snapshot", "list", "--label", "run=cli", *target]) == 0
    assert f"{snap.id}@v4" in capsys.readouterr().out
    assert await asyncio.to_thread(cli.main, ["snapshot", "get", snap.id, *target]) == 0
    assert '"policy_version": "4"' in capsys.readouterr().out
    assert await asyncio.to_thread(cli.main, ["snapshot", "delete", snap.id, *target]) == 0
    assert await client.list_snapshots() == []


async def test_snapshots_on_a_baseline_are_deltas_and_chains_stay_bounded(
    app: App, client: AsyncClient
) -> None:
    """Each snapshot after the first records only what changed; past
    MAX_DEPTH one is complete again. Any of them restores whole, also once
    the snapshots before it are deleted and collected."""
    manager = app.snapshots
    assert manager is not None
    lease = await prepared(client)
    sb = lease[0]
    first = await sb.snapshot(session="agent")
    ids = [first.id]
    for i in range(MAX_DEPTH + 2):
        await sb.write_files({f"step/{i}.txt": f"step {i}"})
        ids.append((await sb.snapshot(session="agent")).id)
    depths = [await manager._catalog.depth(sid) for sid in ids]
    assert depths == [*range(MAX_DEPTH + 1), 0, 1]
    delta = await manager._catalog.manifest(ids[5])
    assert delta is not None and mf.is_delta(delta) and len(delta) < 200, "a delta holds one change"
    for sid in ids[:-1]:
        await client.delete_snapshot(sid)
    await manager.gc()
    again = await client.restore(ids[-1], timeout=5)
    got = await again[0].read_files(["src/main.py", "step/0.txt", f"step/{MAX_DEPTH + 1}.txt"])
    assert got == {
        "src/main.py": b"print('hi')\n",
        "step/0.txt": b"step 0",
        f"step/{MAX_DEPTH + 1}.txt": b"step 17",
    }
    await again.release()
    await client.delete_snapshot(ids[-1])
    await manager.gc()
    assert await manager._catalog.live_keys() == set() and await manager._catalog.depth(ids[0]) is None
