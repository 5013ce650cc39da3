"""A writable root (PoolSpec.root "writable") on the real engine: a sandbox
writes anywhere the image's permissions allow, and the file calls reach
there as its user or as root; its changes are its own; a fill stops at the
pool's disk_bytes (ENOSPC, DISK_FULL) and max_files (FILE_LIMIT) with the
server healthy; the engine's /etc files stay read-only; removal leaves no
mount and no container; a read-only pool is unchanged."""

from __future__ import annotations

import asyncio
import contextlib
import io
import tarfile
from pathlib import Path

import docker
import pytest

from sandboxd import errors
from sandboxd.app import App
from sandboxd.backends.base import GVISOR
from sandboxd.backends.docker import rootfs
from sandboxd.client import AsyncClient
from tests.integration.conftest import (
    NO_GVISOR,
    gvisor_registered,
    instance_containers,
    make_settings,
    poll,
    running_app,
)

pytestmark = [pytest.mark.docker, pytest.mark.timeout(240)]

_MIB = 1 << 20
_LIMITS = {"disk_bytes": 16 * _MIB, "max_files": 300}
_LIMITS_G = {"disk_bytes": 16 * _MIB}
"""gVisor takes no max_files: its root's upper layer is one file in the bounded tmpfs."""


def _mounts(instance: str) -> list[Path]:
    return rootfs.mounted_roots(instance)


async def test_a_writable_root_is_the_sandboxes_own_and_bounded(
    app: App, client: AsyncClient, image: str, each_runtime: str
) -> None:
    instance = app.settings.instance_id
    gvisor = each_runtime == GVISOR
    limits = _LIMITS_G if gvisor else _LIMITS
    await client.create_pool(
        "wr", image, min_ready=0, max_size=2, root="writable", runtime=each_runtime, limits=limits
    )
    lease = await client.lease("wr", n=2, lease_ttl=300, timeout=120)
    try:
        one, two = lease.sandboxes
        assert len(_mounts(instance)) == 2
        # The sandbox user writes where the image lets it, and not elsewhere.
        assert (await one.exec("echo mine > /var/tmp/x && cat /var/tmp/x")).text == "mine\n"
        denied = await one.exec("mkdir /tests")
        assert not denied.ok and "Permission denied" in denied.stderr.decode(), denied
        # Root (no capabilities) creates /tests and edits a file the image ships.
        assert await one.write_file("/tests/x", b"test\n", user="root") == 5
        assert await one.read_file("/tests/x") == b"test\n"
        with pytest.raises(errors.PermissionDenied):
            await one.write_file("/tests/y", b"no")
        # Larger transfers take an engine exec of their own; directories come as tars.
        big = bytes(range(256)) * 1024
        assert await one.write_file("/var/tmp/big.bin", big) == len(big)
        assert await one.read_file("/var/tmp/big.bin") == big
        with tarfile.open(fileobj=io.BytesIO(await one.download_dir("/tests"))) as tar:
            assert "./x" in tar.getnames() or "x" in tar.getnames(), tar.getnames()
        assert (await one.exec("rm /var/tmp/big.bin")).ok
        shipped = (await two.exec("cat /etc/debian_version")).text
        edit = await one.exec("echo edited > /etc/debian_version && cat /etc/debian_version", user="root")
        assert edit.text == "edited\n", edit
        # The workspace is there as before.
        await one.write_file("w.txt", b"w")
        assert (await one.exec("cat /workspace/w.txt")).text == "w"
        # The other sandbox of the image sees none of it.
        assert (await two.exec("cat /etc/debian_version")).text == shipped
        unseen = await two.exec("for p in /tests /var/tmp/x; do test -e $p && echo $p; done; echo end")
        assert unseen.text == "end\n", unseen
        # The engine's own files stay read-only, even for root.
        for name in ("hosts", "hostname", "resolv.conf"):
            r = await one.exec(f"echo x >> /etc/{name}", user="root")
            assert not r.ok and "Read-only file system" in r.stderr.decode(), (name, r)
        # Filling the root stops at disk_bytes, named; the server stays healthy.
        fill = await one.exec("head -c 64M /dev/zero > /var/tmp/big", timeout=60)
        assert not fill.ok and "No space left on device" in fill.stderr.decode(), fill
        assert fill.outcome == "DISK_FULL" and "root" in fill.detail, fill
        size = int((await one.exec("stat -c %s /var/tmp/big")).text)
        assert 12 * _MIB <= size <= 16 * _MIB, size
        assert (await one.exec("rm /var/tmp/big && echo alive")).text == "alive\n"
        if not gvisor:  # And at max_files.
            many = await one.exec(
                "mkdir /var/tmp/m && cd /var/tmp/m && for i in $(seq 1 400); do : > f$i || exit 1; done"
            )
            assert not many.ok and "No space left on device" in many.stderr.decode(), many
            assert many.outcome == "FILE_LIMIT", many
        assert (await two.exec("echo fine")).text == "fine\n"
        assert (await client.get_pool("wr")).status.failed_total == 0
    finally:
        await lease.release()
    await poll(lambda: not _mounts(instance), timeout=60, what="the roots' mounts to go")
    await poll(
        lambda: not [c for c in instance_containers(docker.from_env(), instance) if "wr" in str(c.labels)],
        timeout=60,
        what="the containers to go",
    )


async def test_a_read_only_pool_is_unchanged(client: AsyncClient, image: str) -> None:
    await client.create_pool("ro", image, min_ready=0, max_size=1)
    async with client.acquire("ro", timeout=60) as sb:
        r = await sb.exec("echo x > /var/tmp/x", user="root")
        assert not r.ok and "Read-only file system" in r.stderr.decode(), r
        with pytest.raises(errors.InvalidArgument, match="escapes the workspace"):
            await sb.write_file("/tests/x", b"x", user="root")


async def test_refusals(client: AsyncClient, image: str) -> None:
    with pytest.raises(errors.InvalidArgument, match=r"spec\.recycle"):
        await client.create_pool("bad", image, max_size=1, root="writable", recycle="same-tenant")
    await client.create_pool("wr", image, min_ready=0, max_size=1, root="writable")
    async with client.acquire("wr", timeout=60) as sb:
        with pytest.raises(errors.FailedPrecondition, match=r'spec\.root "writable"'):
            await sb.snapshot()


async def test_a_restart_sweeps_a_mount_whose_container_is_gone(
    tmp_path: Path, engine: docker.DockerClient, image: str
) -> None:
    settings = make_settings(tmp_path)
    instance = settings.instance_id
    async with running_app(settings, engine) as app, AsyncClient(app.address) as client:
        await client.create_pool("wr", image, min_ready=1, max_size=1, root="writable")
        await poll(lambda: len(_mounts(instance)) == 1, timeout=120, what="the warm sandbox's root")
        # A stray mount of this instance over a directory no container uses,
        # as a crash between mount and start would leave if the engine lost the container.
        stray = tmp_path / "stray-layer"
        stray.mkdir()
        await asyncio.to_thread(rootfs._mount_tmpfs, f"{rootfs.MOUNT_SOURCE}.{instance}", stray, "size=1m")
        try:
            await poll(lambda: stray not in _mounts(instance), timeout=30, what="the sweep to unmount it")
            assert len(_mounts(instance)) == 1, "the live sandbox's root stays mounted"
        finally:
            with contextlib.suppress(OSError):
                rootfs.unmount(stray)
    assert not _mounts(instance)


async def test_a_live_snapshot_carries_the_root_and_restores_only_alike(
    engine: docker.DockerClient, client: AsyncClient, image: str
) -> None:
    if not gvisor_registered(engine):
        pytest.skip(NO_GVISOR)
    await client.create_pool(
        "lw", image, min_ready=0, max_size=2, runtime=GVISOR, root="writable", limits=_LIMITS_G
    )
    await client.create_pool("lr", image, min_ready=0, max_size=1, runtime=GVISOR)
    async with client.acquire("lw", timeout=120) as sb:
        assert (await sb.exec("echo root > /var/tmp/x && echo ws > /workspace/w")).ok
        snap = await client.snapshot(sb.id, live=True)
    with pytest.raises(errors.FailedPrecondition, match=r'spec\.root is "writable"'):
        await client.restore(snap.id, n=1, pool="lr")
    group = await client.restore(snap.id, n=1)
    try:
        (restored,) = group
        assert (await restored.exec("cat /var/tmp/x /workspace/w")).text == "root\nws\n"
        # The restored sandbox's root is bounded as its pool says.
        fill = await restored.exec("head -c 64M /dev/zero > /var/tmp/big", timeout=60)
        assert fill.outcome == "DISK_FULL" and "root" in fill.detail, fill
    finally:
        await group.release()
