"""A writable root on Kubernetes (PoolSpec.root "writable"): the Pod's root
filesystem is writable and its ephemeral-storage limit leaves the root
disk_bytes of its own; a Pod the kubelet evicts for its storage is a typed
disk-limit loss. Against the real API server: the Pod it accepts; on the
real kubelet node: a write in the root, kept from another Pod."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from sandboxd.backends.base import ExecOutcome, ExecResult, Limits, SandboxSpec
from sandboxd.backends.kubernetes.cache import disk_eviction, summarize
from sandboxd.backends.kubernetes.client import KubeClient
from sandboxd.backends.kubernetes.podspec import PodOptions, build_pod
from sandboxd.client import AsyncClient
from tests.kube.conftest import IMAGE, kube_settings, pods, poll, real_node_app, started_app
from tests.kube.test_exec import _real_image

pytestmark = [pytest.mark.kube, pytest.mark.timeout(240)]

_MIB = 1 << 20


def _container(writable: bool) -> dict[str, Any]:
    spec = SandboxSpec("sb-1", "p", "img:1", Limits(disk_bytes=100 * _MIB), writable_root=writable)
    container: dict[str, Any] = build_pod(spec, PodOptions(namespace="ns", instance="i"))["spec"][
        "containers"
    ][0]
    return container


def test_the_pod_root_is_writable_and_its_storage_limit_covers_it() -> None:
    ro, rw = _container(False), _container(True)
    assert ro["securityContext"]["readOnlyRootFilesystem"] is True
    assert rw["securityContext"]["readOnlyRootFilesystem"] is False
    extra = int(rw["resources"]["limits"]["ephemeral-storage"]) - int(
        ro["resources"]["limits"]["ephemeral-storage"]
    )
    assert extra == 100 * _MIB
    # The rest of the hardening stays.
    assert rw["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert rw["securityContext"]["runAsNonRoot"] is True


def test_an_eviction_for_storage_is_a_typed_disk_loss() -> None:
    lost = ExecResult(ExecOutcome.SANDBOX_LOST, -1, 1.0, detail="cut", sandbox_gone=True)
    evicted = {
        "metadata": {"name": "p"},
        "status": {
            "phase": "Failed",
            "reason": "Evicted",
            "message": "Pod ephemeral local storage usage exceeds the total limit of containers 420Mi. ",
        },
    }
    named = disk_eviction(summarize(evicted), lost)
    assert named is not None and named.outcome is ExecOutcome.DISK_FULL and named.sandbox_gone
    assert "ephemeral local storage" in named.detail
    workspace = {
        **evicted,
        "status": {**evicted["status"], "message": 'Usage of EmptyDir volume "workspace" '},
    }
    assert disk_eviction(summarize(workspace), lost) is not None
    memory = {**evicted, "status": {**evicted["status"], "message": "The node was low on resource: memory."}}
    assert disk_eviction(summarize(memory), lost) is None
    assert disk_eviction(None, lost) is None


async def test_the_api_server_takes_the_writable_root_pod(
    tmp_path: Path, kubeconfig: str, namespace: str, kube: KubeClient
) -> None:
    settings = kube_settings(tmp_path, kubeconfig, namespace)
    async with started_app(settings) as app, AsyncClient(app.address) as client:
        pool = await client.create_pool("wr", IMAGE, min_ready=1, max_size=2, root="writable")
        assert pool.spec.root == "writable"

        async def made() -> bool:
            return bool(await pods(kube, namespace, f"sandboxd.instance={settings.instance_id}"))

        await poll(made, timeout=60, what="the pool's Pod")
        pod = (await pods(kube, namespace, f"sandboxd.instance={settings.instance_id}"))[0]
        container = pod["spec"]["containers"][0]
        assert container["securityContext"]["readOnlyRootFilesystem"] is False
        assert "ephemeral-storage" in container["resources"]["limits"]
        await client.delete_pool("wr", force=True)


@contextlib.asynccontextmanager
async def _real_node_client(tmp_path: Path, kubeconfig: str, namespace: str) -> AsyncIterator[AsyncClient]:
    """A client of a started server whose Pods run on the real kubelet node,
    256 MiB of memory each."""
    async with (
        real_node_app(tmp_path, kubeconfig, namespace, **{"limits.memory_bytes": 256 << 20}) as app,
        AsyncClient(app.address) as client,
    ):
        yield client


@pytest.mark.kube_node
async def test_a_pod_writes_its_root_and_another_does_not_see_it(
    tmp_path: Path, kubeconfig: str, namespace: str
) -> None:
    async with _real_node_client(tmp_path, kubeconfig, namespace) as client:
        await client.create_pool("wroot", _real_image(), min_ready=0, max_size=2, root="writable")
        lease = await client.lease("wroot", n=2, lease_ttl=600, timeout=120)
        try:
            writer, other = lease.sandboxes
            # /var/tmp is the image's own (mode 1777), not a mount.
            made = await writer.exec("echo hi > /var/tmp/x && cat /var/tmp/x")
            assert made.text == "hi\n", made
            assert await writer.write_file("/var/tmp/y", b"root") == 4
            assert await writer.read_file("/var/tmp/y") == b"root"
            # The image's permissions still hold: / is root's.
            denied = await writer.exec("mkdir /tests")
            assert not denied.ok and "Permission denied" in denied.stderr.decode(), denied
            assert (await other.exec("test -e /var/tmp/x && echo seen || echo unseen")).text == "unseen\n"
        finally:
            await lease.release()


@pytest.mark.kube_node
async def test_a_root_written_past_its_bound_is_evicted_as_a_disk_loss(
    tmp_path: Path, kubeconfig: str, namespace: str
) -> None:
    async with _real_node_client(tmp_path, kubeconfig, namespace) as client:
        limits = {"disk_bytes": 16 * _MIB}
        await client.create_pool(
            "wfill", _real_image(), min_ready=0, max_size=1, root="writable", limits=limits
        )
        async with client.acquire("wfill", timeout=120) as sb:
            # Past the Pod's ephemeral-storage limit (disk_bytes twice, /tmp and 64 MiB), then
            # held until the kubelet's next measurement evicts the Pod.
            fill = await sb.exec("head -c 300M /dev/zero > /var/tmp/big && sleep 120", timeout=150)
            assert fill.outcome == "DISK_FULL", fill
            assert "evicted" in fill.detail and "ephemeral" in fill.detail, fill
