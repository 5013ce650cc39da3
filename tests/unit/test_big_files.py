"""Files above a pack batch or a read chunk, files too large for their
sandbox, and archives that lie about their sizes, on the fake backend
(workspaces read through the sandbox) and a real local blob directory: the
inline and chunk sizes are shrunk so a few hundred KiB cross them. Contents
go to the store in bounded pieces, sizes and digests are exact through a
restore, and what can never fit is refused by name before anything is
stored."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sandboxd import errors
from sandboxd.app import make_snapshot_manager
from sandboxd.backends.hostfs import LARGE, HostWorkspace
from sandboxd.core.files import check_upload
from sandboxd.core.lifecycle import State
from sandboxd.core.snapshots import SnapshotManager, blob_key, sizes, tenant_namespace
from sandboxd.core.snapshots.gc import discard
from sandboxd.core.snapshots.tarstream import Body, read_members
from tests.bigfiles import Watched, short_tar, sparse_tar
from tests.unit.conftest import Harness, MakeControl
from tests.unit.test_snapshots import leased_with, tar_of

pytestmark = pytest.mark.timeout(60)

INLINE = 64 << 10
CHUNK = 16 << 10


@pytest.fixture(autouse=True)
def small_sizes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(sizes, "INLINE_BYTES", INLINE)
    monkeypatch.setattr(sizes, "CHUNK_BYTES", CHUNK)
    # Restore archives spooled by the fake backend (it stages nothing) land here.
    spool = tmp_path / "spool"
    spool.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spool))


@pytest.fixture
async def snaps(make_control: MakeControl, tmp_path: Path) -> AsyncIterator[tuple[Harness, SnapshotManager]]:
    h = await make_control(
        state_dir=str(tmp_path), snapshots__gc_interval_seconds=0.0, snapshots__quota_bytes=4 << 20
    )
    manager = make_snapshot_manager(h.settings, h.control, h.clock, persist=True)
    await manager.start()
    try:
        yield h, manager
    finally:
        await manager.stop()


def spooled(tmp_path: Path) -> list[Path]:
    return list((tmp_path / "spool").iterdir())


async def test_a_file_above_the_inline_size_streams_and_round_trips_exactly(
    snaps: tuple[Harness, SnapshotManager], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    h, manager = snaps
    big = os.urandom(5 * INLINE + 123)
    sid = await leased_with(h, {"big.bin": big, "copy.bin": big, "small": b"s", "d/mid": os.urandom(INLINE)})
    watched = Watched(monkeypatch, manager.blobs.store)
    snap = await manager.snapshot(sid)
    entries = await manager._catalog.entries(snap.id)
    assert entries is not None
    assert (
        entries["big.bin"].size == len(big) and entries["big.bin"].digest == hashlib.sha256(big).hexdigest()
    )
    assert entries["copy.bin"].digest == entries["big.bin"].digest
    assert snap.size_bytes == 2 * len(big) + 1 + INLINE
    assert snap.stored_bytes == len(big) + 1 + INLINE, "the copy is stored once"
    # Structural bound: nothing larger than a chunk (streamed) or the inline size (packed) was held.
    assert watched.streams == 2 and watched.piece <= CHUNK
    assert watched.packed <= INLINE
    assert len(await manager.blobs.store.list_keys()) == 2, "one pack of small files, one of the big file"
    assert manager.pinned() == 0

    lease, records, _ = await manager.restore(snap.id, n=2, timeout=5)
    try:
        for rec in records:
            got = await h.control.read_files(
                rec.sandbox_id, ["big.bin", "copy.bin", "small", "d/mid"], 1 << 20
            )
            assert [f.content for f in got[:3]] == [big, big, b"s"]
            assert hashlib.sha256(got[3].content).hexdigest() == entries["d/mid"].digest
        assert spooled(tmp_path) == [], "the spooled archive is removed"
    finally:
        await h.control.release(lease.lease_id, [])
    assert manager.pinned() == 0


async def test_a_file_above_the_disk_limit_is_refused_before_anything_is_stored(
    snaps: tuple[Harness, SnapshotManager],
) -> None:
    h, manager = snaps
    sid = await leased_with(h, {"a": b"a" * 10_000, "holes.bin": b"\0" * 300_000})
    bystander = await leased_with(h, {"b": b"bystander"})
    rec = h.control.leased(sid)
    # As a sparse file on a small tmpfs: apparent size above the sandbox's disk limit.
    rec.limits = dataclasses.replace(rec.limits, disk_bytes=200_000)
    with pytest.raises(errors.ResourceExhausted) as info:
        await manager.snapshot(sid)
    message = info.value.message
    assert "/workspace/holes.bin" in message and "apparent size of 300000 bytes" in message, message
    assert "sparse" in message and "200000" in message
    assert await manager.blobs.store.list_keys() == [] and await manager.list_snapshots() == []
    assert manager.pinned() == 0
    # Several files that fit one by one but not together: the largest is named.
    rec.limits = dataclasses.replace(rec.limits, disk_bytes=305_000)
    with pytest.raises(errors.ResourceExhausted, match=r"its files take more than .*holes\.bin"):
        await manager.snapshot(sid)
    assert await manager.blobs.store.list_keys() == []
    # The sandbox and its neighbour keep working.
    assert (await manager.snapshot(bystander)).entry_count == 1
    rec.limits = dataclasses.replace(rec.limits, disk_bytes=1 << 20)
    assert (await manager.snapshot(sid)).size_bytes == 310_000


async def test_a_file_above_the_tenant_quota_is_refused_before_it_is_read(
    snaps: tuple[Harness, SnapshotManager], monkeypatch: pytest.MonkeyPatch
) -> None:
    h, manager = snaps
    sid = await leased_with(h, {"small": b"s" * 1000})
    await h.control.upload_directory(sid, ".", _once(tar_of([("huge.bin", "f", b"h" * 300_000, 0o644)])))
    monkeypatch.setattr(manager._capture._settings, "quota_bytes", 200_000)
    with pytest.raises(
        errors.ResourceExhausted, match=r"huge\.bin has an apparent size of 300000 bytes.*quota"
    ):
        await manager.snapshot(sid)
    assert await manager.blobs.store.list_keys() == []


async def test_a_snapshot_refused_at_the_quota_leaves_nothing_it_stored(
    snaps: tuple[Harness, SnapshotManager], monkeypatch: pytest.MonkeyPatch
) -> None:
    h, manager = snaps
    sid = await leased_with(h, {"one": os.urandom(3 * INLINE)})
    first = await manager.snapshot(sid)
    kept = sorted(await manager.blobs.store.list_keys())
    monkeypatch.setattr(manager._capture._settings, "quota_bytes", first.stored_bytes + 1000)
    await h.control.upload_directory(sid, ".", _once(tar_of([("two", "f", os.urandom(3 * INLINE), 0o644)])))
    with pytest.raises(errors.ResourceExhausted, match="quota"):
        await manager.snapshot(sid)
    assert sorted(await manager.blobs.store.list_keys()) == kept, "the refused snapshot's blob went at once"
    assert manager.pinned() == 0
    lease, _, _ = await manager.restore(first.id, timeout=5)
    await h.control.release(lease.lease_id, [])


async def test_discard_spares_what_a_snapshot_references_or_an_operation_pins(
    snaps: tuple[Harness, SnapshotManager],
) -> None:
    h, manager = snaps
    ns = tenant_namespace("default")
    sid = await leased_with(h, {"kept": b"referenced"})
    await manager.snapshot(sid)
    referenced = blob_key(ns, hashlib.sha256(b"referenced").hexdigest())
    pinned = blob_key(ns, hashlib.sha256(b"pinned").hexdigest())
    free = blob_key(ns, hashlib.sha256(b"free").hexdigest())
    await manager.blobs.put_absent({pinned: b"pinned", free: b"free"})
    held = await manager._pins.pin([pinned])
    try:
        n = await discard(
            manager._catalog, manager.blobs, manager._pins, "default", [referenced, pinned, free]
        )
    finally:
        manager._pins.unpin(held)
    assert n == 1
    assert await manager.blobs.missing([referenced, pinned, free]) == {free}


async def test_a_streamed_blob_cut_short_or_altered_fails_the_restore_by_name(
    snaps: tuple[Harness, SnapshotManager], tmp_path: Path
) -> None:
    h, manager = snaps
    big = os.urandom(3 * INLINE)
    sid = await leased_with(h, {"big.bin": big})
    snap = await manager.snapshot(sid)
    key = blob_key(tenant_namespace("default"), hashlib.sha256(big).hexdigest())
    pack, offset, size = (await manager._catalog.locate([key]))[key]
    path = tmp_path / "blobs" / pack
    pool = h.control.get_pool("p")
    with path.open("r+b") as fh:  # same length, other bytes
        fh.seek(offset + size // 2)
        fh.write(b"X" * 100)
    with pytest.raises(errors.FailedPrecondition, match=r"'big\.bin' does not match its digest"):
        await manager.restore(snap.id, timeout=5)
    with path.open("r+b") as fh:
        fh.truncate(offset + size - 1000)
    with pytest.raises(errors.FailedPrecondition, match=r"'big\.bin' is shorter than the 196608 bytes"):
        await manager.restore(snap.id, timeout=5)
    assert pool.count(State.LEASED) == 1
    assert spooled(tmp_path) == []


async def test_a_restore_that_cannot_fit_names_its_largest_file(
    snaps: tuple[Harness, SnapshotManager],
) -> None:
    h, manager = snaps
    sid = await leased_with(h, {"big.bin": os.urandom(1_200_000), "small": b"s"})
    snap = await manager.snapshot(sid)
    await h.pool(
        "tiny", max_size=2, limits=dataclasses.replace(h.control.leased(sid).limits, disk_bytes=1 << 20)
    )
    with pytest.raises(
        errors.FailedPrecondition, match=r"largest: 'big\.bin', 1200000 bytes.*'tiny' have 1048576"
    ):
        await manager.restore(snap.id, pool="tiny", timeout=5)


async def test_the_tar_reader_streams_large_members_and_names_one_cut_short() -> None:
    big = os.urandom(3 * INLINE + 7)
    archive = tar_of([("a", "f", b"small", 0o644), ("big", "f", big, 0o644), ("skipped", "f", big, 0o644)])

    async def stream(data: bytes) -> AsyncIterator[bytes]:
        for i in range(0, len(data), 10_000):
            yield data[i : i + 10_000]

    seen: dict[str, bytes] = {}
    async for member, content in read_members(stream(archive), INLINE, CHUNK):
        if member.name == "skipped":
            assert isinstance(content, Body)
            continue  # left unread: the reader skips it
        if isinstance(content, Body):
            pieces = [piece async for piece in content]
            assert max(len(p) for p in pieces) <= CHUNK
            seen[member.name] = b"".join(pieces)
        else:
            seen[member.name] = content
    assert seen == {"a": b"small", "big": big}

    cut = archive[: archive.index(big) + len(big) // 2]
    with pytest.raises(errors.BackendError, match=r"ended inside big \(\d+ of its 196615 bytes\)"):
        async for _, content in read_members(stream(cut), INLINE, CHUNK):
            if isinstance(content, Body):
                async for _ in content:
                    pass


# -- uploads ------------------------------------------------------------------


def test_an_upload_is_counted_at_its_members_apparent_sizes() -> None:
    with pytest.raises(errors.ResourceExhausted, match=r"'holes\.bin' has an apparent size of 21474836480"):
        check_upload(io.BytesIO(sparse_tar("holes.bin", 20 << 30)), 256 << 20)
    with pytest.raises(errors.ResourceExhausted, match=r"'liar' has an apparent size of 1099511627776"):
        check_upload(io.BytesIO(short_tar("liar", 1 << 40)), 256 << 20)
    with pytest.raises(errors.InvalidArgument, match=r"'liar' declares more data than the archive holds"):
        check_upload(io.BytesIO(short_tar("liar", 100_000)), 256 << 20)
    # Within the limit, a sparse member is fine (its stored data is all there).
    assert check_upload(io.BytesIO(sparse_tar("holes.bin", 1 << 20)), 256 << 20) == 1


async def test_an_upload_with_a_sparse_member_is_refused_and_writes_nothing(
    snaps: tuple[Harness, SnapshotManager],
) -> None:
    h, _ = snaps
    sid = await leased_with(h, {"keep": b"k"})
    for data in (sparse_tar("holes.bin", 20 << 30), short_tar("liar", 1 << 40)):
        with pytest.raises(errors.ResourceExhausted, match="apparent size"):
            await h.control.upload_directory(sid, ".", _once(data))
    got = await h.control.read_files(sid, ["keep"], 1 << 20)
    assert got[0].content == b"k"
    with pytest.raises(errors.NotFound):
        await h.control.read_files(sid, ["holes.bin"], 1 << 20)


async def _once(data: bytes) -> AsyncIterator[bytes]:
    yield data


# -- reading in place -------------------------------------------------------------


def test_the_chunked_reader_reads_to_the_end_in_bounded_pieces(tmp_path: Path) -> None:
    content = os.urandom(3 * CHUNK + 5)
    (tmp_path / "f").write_bytes(content)
    with HostWorkspace(os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)) as view:
        opened = view.open_file("f")
        assert opened is not None and opened.size == len(content)
        try:
            pieces = list(opened.chunks(CHUNK))
        finally:
            opened.close()
        assert b"".join(pieces) == content and max(map(len, pieces)) == CHUNK
        assert view.open_file("missing") is None


def test_the_chunked_reader_reads_a_growing_file_as_of_its_open(tmp_path: Path) -> None:
    """A log appended to while it is read: its first bytes, as many as it had
    when opened (as ``cat`` would), not a failure."""
    path = tmp_path / "busy.log"
    content = os.urandom(4 * CHUNK)
    path.write_bytes(content)
    with HostWorkspace(os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)) as view:
        opened = view.open_file("busy.log")
        assert opened is not None
        try:
            pieces = opened.chunks(CHUNK)
            first = next(pieces)
            with path.open("ab") as fh:
                fh.write(b"more" * CHUNK)
            assert first + b"".join(pieces) == content
        finally:
            opened.close()


def test_the_chunked_reader_fails_cleanly_if_the_file_shrinks_while_read(tmp_path: Path) -> None:
    path = tmp_path / "busy.log"
    path.write_bytes(os.urandom(4 * CHUNK))
    with HostWorkspace(os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)) as view:
        opened = view.open_file("busy.log")
        assert opened is not None
        try:
            pieces = opened.chunks(CHUNK)
            next(pieces)
            with path.open("r+b") as fh:
                fh.truncate(CHUNK + 10)
            with pytest.raises(errors.FailedPrecondition, match=r"/workspace/busy\.log shrank while"):
                list(pieces)
        finally:
            opened.close()


def test_files_above_the_inline_size_are_left_unread_for_streaming(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "small").write_bytes(b"s" * 100)
    (tmp_path / "big").write_bytes(b"b" * (INLINE + 1))
    with HostWorkspace(os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)) as view:
        scanned = {r[5]: c for r, c in view.scan(None, INLINE)}
        assert scanned["d/small"] == b"s" * 100 and scanned["big"] is LARGE and scanned["d"] is None
        got = dict(view.read_files([("big", 10), ("d/small", 100)], INLINE))
        assert got == {"big": LARGE, "d/small": b"s" * 100}, "a file larger than listed is not read whole"
        assert dict(view.read_files([("big", INLINE + 1)]))["big"] == b"b" * (INLINE + 1), "no limit"
