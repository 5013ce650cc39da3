"""Live snapshots, pause and resume in the core, on the fake backend: the
refusals (backend, runtime, paused, quota, memory), and a live adapter over
the fake that checkpoints a sandbox's "memory" so image verification,
lineage and fork bookkeeping can be checked without an engine."""

from __future__ import annotations

import asyncio
import io
import tarfile
from pathlib import Path

import grpc
import pytest

from sandboxd import errors
from sandboxd.app import App
from sandboxd.backends.base import GVISOR, RUNC
from sandboxd.backends.fake import FakeBackend
from sandboxd.client import AsyncClient
from sandboxd.core.snapshots.images import Unpacker, archive_chunks, archived_size
from sandboxd.core.snapshots.manifest import UnsafeSnapshot
from sandboxd.core.snapshots.packs import blob_key, tenant_namespace
from sandboxd.v1 import sandboxes_pb2
from tests.unit.conftest import IMAGE, UNKNOWN_SANDBOX, MakeApp

pytestmark = pytest.mark.timeout(60)

LEASED = 3


class LiveFake(FakeBackend):
    """The fake with LiveCheckpoints: a sandbox's "memory" is a byte string
    per handle, checkpointed into checkpoint.img and restored from it."""

    def __init__(self) -> None:
        super().__init__()
        self.memory: dict[str, bytes] = {}
        self.paused: set[str] = set()
        self.restored: dict[str, bytes] = {}
        self.strays: dict[str, list[str]] = {}

    def live_refusal(self, runtime: str) -> str:
        return "" if runtime == GVISOR else f"runtime {runtime!r} cannot checkpoint a running sandbox here"

    async def pause(self, handle: str) -> None:
        self.paused.add(handle)

    async def resume(self, handle: str) -> None:
        self.paused.discard(handle)

    async def not_carried(self, handle: str) -> list[str]:
        return list(self.strays.get(handle, []))

    async def checkpoint(self, handle: str, dest: Path) -> None:
        await asyncio.to_thread(self._write, dest, self.memory.get(handle, b"fresh"))

    @staticmethod
    def _write(dest: Path, memory: bytes) -> None:
        dest.mkdir()
        (dest / "checkpoint.img").write_bytes(memory)
        (dest / "pages.img").write_bytes(b"\0" * 4096)

    async def restore_checkpoint(self, handle: str, image: Path) -> None:
        self.restored[handle] = await asyncio.to_thread((image / "checkpoint.img").read_bytes)
        self.memory[handle] = self.restored[handle]


async def live_app(make_app: MakeApp, **overrides: object) -> tuple[App, LiveFake]:
    backend = LiveFake()
    app = await make_app(backend=backend, **overrides)
    return app, backend


async def test_the_fake_backend_refuses_live_snapshots_and_pause_naming_itself(
    app: App, client: AsyncClient
) -> None:
    await client.create_pool("g", IMAGE, min_ready=1, max_size=2, runtime=GVISOR)
    async with client.acquire("g", timeout=5) as sb:
        with pytest.raises(errors.FailedPrecondition, match="fake backend cannot checkpoint"):
            await sb.snapshot(live=True)
        with pytest.raises(errors.FailedPrecondition, match="fake backend"):
            await sb.pause()
        with pytest.raises(errors.FailedPrecondition, match="fake backend"):
            await sb.resume()
        assert (await sb.exec("true")).ok


async def test_pause_and_resume_validate_their_input(app: App, client: AsyncClient) -> None:
    codes = []
    for sandbox_id in ("", "not-an-id", UNKNOWN_SANDBOX):
        try:
            await client.sandboxes.Pause(sandboxes_pb2.PauseRequest(sandbox_id=sandbox_id))
        except grpc.aio.AioRpcError as e:
            codes.append(e.code())
    assert codes == [
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
    ]
    await client.create_pool("p", IMAGE, min_ready=1, max_size=2)
    await client.wait_ready(5.0)
    (ready,) = await client.list_sandboxes("p", state=2)
    with pytest.raises(errors.FailedPrecondition, match="not LEASED"):
        await client.pause(ready.id)


async def test_pause_freezes_a_gvisor_sandbox_until_resumed(make_app: MakeApp) -> None:
    app, backend = await live_app(make_app)
    async with AsyncClient(app.address) as client:
        await client.create_pool("g", IMAGE, min_ready=1, max_size=2, runtime=GVISOR)
        await client.create_pool("r", IMAGE, min_ready=1, max_size=2, runtime=RUNC)
        async with client.acquire("g", timeout=5) as sb, client.acquire("r", timeout=5) as plain:
            assert (await sb.pause()).paused
            assert (await sb.pause()).paused  # idempotent
            assert backend.paused == {app.control.get_sandbox(sb.id).handle}
            for call in (sb.exec("true"), sb.snapshot(), sb.snapshot(live=True), sb.read_file("a")):
                with pytest.raises(errors.FailedPrecondition, match="paused; resume it first"):
                    await call
            assert not (await sb.resume()).paused
            assert not (await sb.resume()).paused
            assert backend.paused == set()
            assert (await sb.exec("true")).ok
            with pytest.raises(errors.FailedPrecondition, match="runtime 'runc'"):
                await plain.pause()
            with pytest.raises(errors.FailedPrecondition, match="runtime 'runc'"):
                await plain.snapshot(live=True)


async def test_live_snapshot_restore_fork_and_lineage(make_app: MakeApp) -> None:
    app, backend = await live_app(make_app)
    async with AsyncClient(app.address) as client:
        await client.create_pool("g", IMAGE, min_ready=2, max_size=8, runtime=GVISOR)
        async with client.acquire("g", timeout=5) as sb:
            backend.memory[app.control.get_sandbox(sb.id).handle] = b"state of the source"
            backend.strays[app.control.get_sandbox(sb.id).handle] = ["python3 -m http.server (pid 41)"]
            assert (await sb.exec("cd src; export STEP=4", session="agent")).ok
            snap = await sb.snapshot(live=True, session="agent", policy_version=9, turn=1, labels={"k": "v"})
            backend.strays.clear()
            again = await sb.snapshot(live=True)
        assert snap.live
        # What the checkpoint did not carry is said, and kept with the snapshot.
        assert list(snap.not_carried) == ["python3 -m http.server (pid 41)"] and not again.not_carried
        assert list((await client.get_snapshot(snap.id)).not_carried) == list(snap.not_carried)
        assert again.parent_id == snap.id and [r.id for r in again.chain] == [snap.id, again.id]
        # Equal images are one blob: the second stored nothing new.
        assert again.stored_bytes == 0 and again.digest == snap.digest
        assert snap.env["STEP"] == "4" and snap.memory_limit_bytes >= 0
        fork = await client.restore(snap.id, n=3, timeout=5)
        try:
            handles = [app.control.get_sandbox(s.id).handle for s in fork]
            assert [backend.restored[h] for h in handles] == [b"state of the source"] * 3
            assert {s.info.labels["sandboxd.snapshot"] for s in fork} == {snap.id}
            assert {s.info.labels["sandboxd.snapshot.policy_version"] for s in fork} == {"9"}
            state = (await fork[0].exec("pwd; env", session="agent")).stdout.decode().splitlines()
            assert "STEP=4" in state
            child = await fork[0].snapshot(live=True)
            assert [r.id for r in child.chain] == [snap.id, child.id]
        finally:
            await fork.release()
        listed = await client.list_snapshots(labels={"k": "v"})
        assert [s.id for s in listed] == [snap.id]


async def test_a_corrupt_or_missing_image_is_refused_before_anything_is_leased(make_app: MakeApp) -> None:
    app, backend = await live_app(make_app)
    assert app.snapshots is not None
    async with AsyncClient(app.address) as client:
        await client.create_pool("g", IMAGE, min_ready=1, max_size=4, runtime=GVISOR)
        async with client.acquire("g", timeout=5) as sb:
            snap = await sb.snapshot(live=True)
        key = blob_key(tenant_namespace("default"), snap.digest.removeprefix("sha256:"))
        pack, offset, _ = (await app.snapshots._catalog.locate([key]))[key]
        stored = (await app.snapshots.blobs.store.get_many([pack]))[pack]
        flipped = stored[:offset] + bytes([stored[offset] ^ 1]) + stored[offset + 1 :]
        await app.snapshots.blobs.store.delete_many([pack])
        await app.snapshots.blobs.store.put_parts(pack, [flipped])
        with pytest.raises(errors.FailedPrecondition, match="corrupt"):
            await client.restore(snap.id, n=2, timeout=5)
        await app.snapshots.blobs.store.delete_many([pack])
        with pytest.raises(errors.FailedPrecondition, match="missing"):
            await client.restore(snap.id, timeout=5)
        assert await client.list_sandboxes("g", state=LEASED) == []
        assert backend.restored == {}


async def test_restore_targets_are_checked_before_acquiring(make_app: MakeApp) -> None:
    app, _ = await live_app(make_app)
    async with AsyncClient(app.address) as client:
        await client.create_pool(
            "g", IMAGE, min_ready=1, max_size=4, runtime=GVISOR, limits={"memory_bytes": 512 << 20}
        )
        await client.create_pool(
            "small", IMAGE, max_size=2, runtime=GVISOR, limits={"memory_bytes": 256 << 20}
        )
        await client.create_pool("plain", IMAGE, max_size=2, runtime=RUNC)
        await client.create_pool("other", "other/image:1", max_size=2, runtime=GVISOR)
        async with client.acquire("g", timeout=5) as sb:
            snap = await sb.snapshot(live=True)
        assert snap.memory_limit_bytes == 512 << 20
        with pytest.raises(errors.FailedPrecondition, match="could not all be held"):
            await client.restore(snap.id, pool="small", timeout=5)
        with pytest.raises(errors.FailedPrecondition, match="runtime 'runc'"):
            await client.restore(snap.id, pool="plain", timeout=5)
        with pytest.raises(errors.FailedPrecondition, match="image"):
            await client.restore(snap.id, pool="other", timeout=5)
        for pool in ("small", "plain", "other"):
            assert await client.list_sandboxes(pool, state=LEASED) == []


async def test_live_snapshots_are_refused_over_quota_and_leave_nothing(make_app: MakeApp) -> None:
    app, _ = await live_app(make_app, snapshots__quota_bytes=4096)
    assert app.snapshots is not None
    async with AsyncClient(app.address) as client:
        await client.create_pool("g", IMAGE, min_ready=1, max_size=2, runtime=GVISOR)
        async with client.acquire("g", timeout=5) as sb:
            with pytest.raises(errors.ResourceExhausted, match="quota"):
                await sb.snapshot(live=True)
        assert await app.snapshots.blobs.list_keys() == []
        assert await client.list_snapshots() == []


def tar_bytes(members: list[tarfile.TarInfo], data: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for m in members:
            body = data.get(m.name, b"")
            m.size = len(body) if m.isreg() else 0
            tar.addfile(m, io.BytesIO(body) if m.isreg() else None)
    return out.getvalue()


def unpack(archive: bytes, dest: Path, piece: int = 700) -> None:
    unpacker = Unpacker(dest)
    try:
        for i in range(0, len(archive), piece):
            unpacker.feed(archive[i : i + piece])
        unpacker.finish()
    finally:
        unpacker.close()


@pytest.mark.parametrize(
    "name, kind, problem",
    [
        ("../checkpoint.img", tarfile.REGTYPE, "not a checkpoint file"),
        ("sub/checkpoint.img", tarfile.REGTYPE, "not a checkpoint file"),
        ("checkpoint.img", tarfile.SYMTYPE, "not a checkpoint file"),
        ("pages.img", tarfile.REGTYPE, "no checkpoint.img"),
        ("checkpoint.img", tarfile.DIRTYPE, "not a checkpoint file"),
        ("x" * 120, tarfile.REGTYPE, "not a checkpoint file"),
        ("pages.img\n", tarfile.REGTYPE, "not a checkpoint file"),
    ],
)
def test_foreign_images_are_refused(tmp_path: Path, name: str, kind: bytes, problem: str) -> None:
    member = tarfile.TarInfo(name)
    member.type = kind
    member.linkname = "/etc/passwd" if kind == tarfile.SYMTYPE else ""
    with pytest.raises(UnsafeSnapshot, match=problem):
        unpack(tar_bytes([member], {name: b"x"}), tmp_path / "out")


@pytest.mark.parametrize(
    "archive, problem",
    [
        (b"this is no tar at all" * 100, "not a readable archive"),
        (b"", "no end"),
    ],
)
def test_an_archive_that_is_not_one_is_refused(tmp_path: Path, archive: bytes, problem: str) -> None:
    with pytest.raises(UnsafeSnapshot, match=problem):
        unpack(archive, tmp_path / "out")


async def archive_of(image: Path) -> bytes:
    return b"".join([piece async for piece in archive_chunks(image)])


async def test_images_round_trip_and_equal_images_archive_to_equal_bytes(tmp_path: Path) -> None:
    outs = []
    for i in range(2):
        image = tmp_path / f"image{i}"
        image.mkdir()
        for name, size in (("pages.img", 3 << 20), ("checkpoint.img", 1000), ("pages_meta.img", 0)):
            (image / name).write_bytes(bytes(range(256)) * (size // 256) + b"z" * (size % 256))
            (image / name).chmod(0o644 if i else 0o600)
        outs.append(await archive_of(image))
        assert len(outs[-1]) == archived_size(image)
    assert outs[0] == outs[1]
    # Other tar readers read it too.
    with tarfile.open(fileobj=io.BytesIO(outs[0])) as tar:
        assert tar.getnames() == ["checkpoint.img", "pages.img", "pages_meta.img"]
    unpack(outs[0], tmp_path / "back", piece=4096 * 3 + 17)
    for name in ("pages.img", "checkpoint.img", "pages_meta.img"):
        assert (tmp_path / "back" / name).read_bytes() == (tmp_path / "image0" / name).read_bytes()
    with pytest.raises(UnsafeSnapshot, match="ends inside a file"):
        unpack(outs[0][: len(outs[0]) // 2], tmp_path / "half")
    with pytest.raises(UnsafeSnapshot, match="data after its end"):
        unpack(outs[0] + b"\1" * 512, tmp_path / "trailing")


def test_not_carried_lines_are_named_by_args_and_pid() -> None:
    from sandboxd.backends.docker.checkpoints import parse_not_carried

    text = "41 python3 -m http.server\n7 \nnoise\n"
    assert parse_not_carried(text) == ["python3 -m http.server (pid 41)", "? (pid 7)"]
