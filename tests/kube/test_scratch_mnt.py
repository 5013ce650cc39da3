"""Scratch outside the workspace on Kubernetes, as on Docker: each Pod has a
64 MiB tmpfs at /mnt (an emptyDir of medium Memory with a sizeLimit), where
programs expect to write (SandboxFusion's own tests write /mnt). On the real
kubelet node: the sandbox's user writes it, a fill ends at the bound and is
named DISK_FULL with /mnt in the detail, and another Pod's /mnt is its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandboxd.backends.base import Limits, SandboxSpec
from sandboxd.backends.kubernetes.podspec import PodOptions, build_pod
from sandboxd.client import AsyncClient
from tests.kube.conftest import real_node_app
from tests.kube.test_exec import _real_image

pytestmark = [pytest.mark.kube, pytest.mark.timeout(240)]

SCRATCH_BYTES = 64 << 20


def test_every_pod_has_a_sized_memory_scratch_at_mnt() -> None:
    for workspace in ("emptydir", "memory", "ephemeral"):
        pod = build_pod(
            SandboxSpec("sb-1", "p", "img:1", Limits(memory_bytes=1 << 30)),
            PodOptions(namespace="ns", instance="i", workspace=workspace),
        )
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        assert volumes["mnt"]["emptyDir"] == {"medium": "Memory", "sizeLimit": str(SCRATCH_BYTES)}
        mounts = pod["spec"]["containers"][0]["volumeMounts"]
        assert {"name": "mnt", "mountPath": "/mnt"} in mounts, mounts


@pytest.mark.kube_node
async def test_a_fill_of_mnt_is_disk_full_and_each_pod_has_its_own(
    tmp_path: Path, kubeconfig: str, namespace: str
) -> None:
    limits = {"limits.memory_bytes": 256 << 20}
    async with (
        real_node_app(tmp_path, kubeconfig, namespace, **limits) as app,
        AsyncClient(app.address) as client,
    ):
        await client.create_pool("scratch", _real_image(), min_ready=0, max_size=2)
        lease = await client.lease("scratch", n=2, lease_ttl=600, timeout=120)
        try:
            filler, other = lease.sandboxes
            mount = (await filler.exec("grep ' /mnt ' /proc/mounts")).text
            assert mount.startswith("tmpfs /mnt tmpfs"), mount
            mine = await filler.exec("echo hi > /mnt/mine && cat /mnt/mine")
            assert mine.text == "hi\n", mine
            fill = await filler.exec("head -c 100M /dev/zero > /mnt/big", timeout=60)
            assert not fill.ok and "No space left on device" in fill.stderr.decode(), fill
            assert fill.outcome == "DISK_FULL" and "/mnt is full" in fill.detail, fill
            size = int((await filler.exec("stat -c %s /mnt/big")).text)
            assert SCRATCH_BYTES - (1 << 20) <= size <= SCRATCH_BYTES, size
            assert (await filler.exec("rm /mnt/big && echo alive")).text == "alive\n"
            assert (await other.exec("ls -A /mnt | wc -l")).text == "0\n"
        finally:
            await lease.release()
