"""A pool's root setting: its checks and default, what the backend is told,
the file calls that reach the whole root, and the snapshots and recycling
it refuses."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandboxd import errors
from sandboxd.backends.base import GVISOR, Limits, SandboxSpec
from sandboxd.backends.docker import rootfs
from sandboxd.backends.docker.containerspec import DockerOptions, container_spec
from sandboxd.backends.fake import FakeBackend
from sandboxd.client import AsyncClient
from sandboxd.core.pools import PoolConfig
from sandboxd.core.state import pool_from_json, pool_to_json
from sandboxd.core.validation import file_path
from tests.unit.conftest import IMAGE, MakeApp

pytestmark = pytest.mark.timeout(60)


def test_a_writable_root_container_is_created_writable() -> None:
    spec = SandboxSpec("sb-1", "p", IMAGE, Limits(disk_bytes=1 << 20, max_files=64))
    assert container_spec(spec, DockerOptions(instance="i"), None)["read_only"] is True
    writable = SandboxSpec("sb-1", "p", IMAGE, Limits(), writable_root=True)
    assert container_spec(writable, DockerOptions(instance="i"), None)["read_only"] is False


def test_the_setting_survives_the_store() -> None:
    config = PoolConfig("t/w", IMAGE, 0, 2, Limits(), root="writable")
    assert pool_from_json(pool_to_json(config)).root == "writable"
    legacy = pool_to_json(PoolConfig("t/w", IMAGE, 0, 2, Limits())).replace(', "root": ""', "")
    assert "root" not in legacy and pool_from_json(legacy).root == ""


def test_file_paths_reach_the_whole_root_only_when_writable() -> None:
    with pytest.raises(errors.InvalidArgument, match="escapes the workspace"):
        file_path("path", "/tests/x")
    assert file_path("path", "/tests/../tests/x", anywhere=True) == "/tests/x"
    assert file_path("path", "//etc/x", anywhere=True) == "/etc/x"
    assert file_path("path", "rel/x", anywhere=True) == "/workspace/rel/x"


async def test_defaults_refusals_and_the_backend_told(make_app: MakeApp) -> None:
    backend = FakeBackend()
    app = await make_app(backend=backend)
    async with AsyncClient(app.address) as client:
        assert (await client.create_pool("ro", IMAGE, max_size=2)).spec.root == "read-only"
        assert (await client.create_pool("ro2", IMAGE, max_size=2, root="read-only")).spec.root == "read-only"
        with pytest.raises(errors.InvalidArgument, match=r"spec\.root"):
            await client.create_pool("bad", IMAGE, max_size=2, root="rw")
        with pytest.raises(errors.InvalidArgument, match=r"spec\.root.*spec\.recycle"):
            await client.create_pool("rec", IMAGE, max_size=2, root="writable", recycle="same-tenant")
        pool = await client.create_pool("w", IMAGE, min_ready=1, max_size=2, root="writable")
        assert pool.spec.root == "writable"
        assert (await client.get_pool("w")).spec.root == "writable"
        g = await client.create_pool("wg", IMAGE, max_size=2, root="writable", runtime=GVISOR)
        assert g.spec.root == "writable"
        async with client.acquire("w", timeout=10) as sandbox:
            box = next(b for b in backend.sandboxes.values() if b.spec.sandbox_id == sandbox.id)
            assert box.spec.writable_root
            await sandbox.write_files({"/tests/x": b"hi", "/workspace/a": b"a"})
            assert await sandbox.read_files(["/tests/x", "a"]) == {"/tests/x": b"hi", "a": b"a"}
            await sandbox.write_file("/solution/s.sh", b"echo", user="root")
            assert await sandbox.read_file("/solution/s.sh", user="root") == b"echo"
            with pytest.raises(errors.FailedPrecondition, match=r'file snapshot.*spec\.root "writable"'):
                await sandbox.snapshot()
        async with client.acquire("ro", timeout=10) as sandbox:
            box = next(b for b in backend.sandboxes.values() if b.spec.sandbox_id == sandbox.id)
            assert not box.spec.writable_root
            with pytest.raises(errors.InvalidArgument, match="escapes the workspace"):
                await sandbox.write_files({"/tests/x": b"hi"})


async def test_a_backend_that_cannot_bound_it_refuses_and_preflight_says_so(make_app: MakeApp) -> None:
    backend = FakeBackend()
    app = await make_app(backend=backend)
    async with AsyncClient(app.address) as client:
        await client.create_pool("w", IMAGE, max_size=2, root="writable")
        backend.root_refusal_text = "the engine's storage driver is 'vfs', not overlay2"
        with pytest.raises(errors.FailedPrecondition, match=r"spec\.root.*vfs"):
            await client.create_pool("w2", IMAGE, max_size=2, root="writable")
        report = await client.preflight(concurrent=1, pool="w")
        kinds = {p.kind: p for p in report.problems}
        assert 11 in kinds and kinds[11].field == "spec.root" and "vfs" in kinds[11].message
        backend.root_refusal_text = None
        assert not (await client.preflight(concurrent=1, pool="w")).problems


def test_the_docker_backend_says_why_it_cannot_bound_a_root(tmp_path: Path) -> None:
    (tmp_path / "overlay2").mkdir()
    info = {"Driver": "overlay2", "DockerRootDir": str(tmp_path)}
    assert "remote" in (rootfs.refusal(info, local=False, inboxes=True) or "")
    assert "'vfs', not overlay2" in (rootfs.refusal({**info, "Driver": "vfs"}, True, True) or "")
    assert "inbox" in (rootfs.refusal(info, True, inboxes=False) or "")
    missing = {**info, "DockerRootDir": str(tmp_path / "nowhere")}
    if os.geteuid() == 0:
        assert "not visible here" in (rootfs.refusal(missing, True, True) or "")


def test_a_layer_directory_is_copied_whole(tmp_path: Path) -> None:
    # What the engine leaves in a created container's layer directory.
    src = tmp_path / "src"
    (src / "diff").mkdir(parents=True)
    (src / "work" / "work").mkdir(parents=True)
    (src / "link").write_text("ABC")
    (src / "lower").write_text("l/A:l/B")
    os.symlink("../x/diff", src / "l")
    (src / "work" / "work").chmod(0)
    entries = rootfs._read_layer(src)
    dst = tmp_path / "dst"
    dst.mkdir()
    rootfs._write_layer(dst, entries)
    for rel in ("diff", "work", "work/work", "link", "lower", "l"):
        a, b = os.lstat(src / rel), os.lstat(dst / rel)
        assert (a.st_mode, a.st_uid, a.st_gid) == (b.st_mode, b.st_uid, b.st_gid), rel
    assert (dst / "lower").read_text() == "l/A:l/B" and os.readlink(dst / "l") == "../x/diff"
