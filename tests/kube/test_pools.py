"""The control plane on the Kubernetes backend: pools warm up as Pods on
kwok nodes, release destroys Pods, and a restarted control plane adopts the
leased Pods (labels + the SQLite store) and deletes the rest."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandboxd.app import build_app
from sandboxd.backends.base import Limits, SandboxSpec
from sandboxd.backends.kubernetes import KubernetesBackend
from sandboxd.backends.kubernetes.client import KubeClient
from sandboxd.backends.kubernetes.podspec import selector
from sandboxd.client import AsyncClient
from tests.kube.conftest import IMAGE, kube_settings, pods, poll

pytestmark = [pytest.mark.kube, pytest.mark.timeout(180)]


async def running_pods(kube: KubeClient, namespace: str, instance: str) -> dict[str, str]:
    """Pod name -> sandbox id of the instance's Running, not-deleting Pods."""
    return {
        p["metadata"]["name"]: p["metadata"]["labels"]["sandboxd.sandbox"]
        for p in await pods(kube, namespace, selector(instance))
        if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    }


async def test_pool_warms_acquire_and_release_destroys_pods(
    tmp_path: Path, kubeconfig: str, namespace: str, kube: KubeClient
) -> None:
    settings = kube_settings(tmp_path, kubeconfig, namespace)
    app = build_app(settings)
    await app.start()
    try:
        async with AsyncClient(app.address) as client:
            await client.create_pool("kw", IMAGE, min_ready=6, max_size=12)

            async def warm() -> bool:
                return (await client.get_pool("kw")).status.ready >= 6

            await poll(warm, timeout=90, what="pool to warm 6 Pods")
            assert len(await running_pods(kube, namespace, settings.instance_id)) >= 6

            lease = await client.lease("kw", n=2, lease_ttl=300, timeout=30)
            leased = {s.id for s in lease.sandboxes}
            by_sandbox = {
                v: k for k, v in (await running_pods(kube, namespace, settings.instance_id)).items()
            }
            assert leased <= set(by_sandbox)
            await client.release(lease.id)

            async def destroyed() -> bool:
                now = set((await running_pods(kube, namespace, settings.instance_id)).values())
                return not (leased & now)

            await poll(destroyed, timeout=60, what="released Pods to be deleted")
            await poll(warm, timeout=90, what="pool to re-warm")
            await client.delete_pool("kw")
    finally:
        await app.stop(grace=1)

    async def none_left() -> bool:
        return not await running_pods(kube, namespace, settings.instance_id)

    await poll(none_left, timeout=60, what="no Pods left after delete_pool and stop")


async def test_restart_adopts_leased_pods_and_deletes_the_rest(
    tmp_path: Path, kubeconfig: str, namespace: str, kube: KubeClient
) -> None:
    settings = kube_settings(tmp_path, kubeconfig, namespace)
    app = build_app(settings)
    await app.start()
    async with AsyncClient(app.address) as client:
        await client.create_pool("ad", IMAGE, min_ready=3, max_size=8)
        lease = await client.lease("ad", n=2, lease_ttl=600, timeout=60)
        leased = {s.id for s in lease.sandboxes}
    await app.stop(grace=1)  # leased Pods stay for the next start

    # A warm Pod a crash would have left behind (stop() removes warm ones):
    # made directly, with this instance's labels.
    backend = app.backend
    assert isinstance(backend, KubernetesBackend)
    stray = KubernetesBackend(backend._options)
    stray_handle = await stray.create(
        SandboxSpec("sb-0000deadbeef", "ad", IMAGE, Limits(memory_bytes=64 << 20, cpu_millis=100))
    )
    await stray.close()
    before = await running_pods(kube, namespace, settings.instance_id)
    assert leased <= set(before.values()) and stray_handle in before

    app2 = build_app(settings)  # same instance id, same state dir
    await app2.start()
    try:
        async with AsyncClient(app2.address) as client:
            await client.heartbeat(lease.id)
            for sid in leased:
                sb = await client.get_sandbox(sid)
                assert sb.lease_id == lease.id
            pool = await client.get_pool("ad")
            assert pool.status.leased == 2

            async def stray_gone() -> bool:
                return stray_handle not in await running_pods(kube, namespace, settings.instance_id)

            await poll(stray_gone, timeout=60, what="the unleased Pod to be deleted")
            now = await running_pods(kube, namespace, settings.instance_id)
            assert leased <= set(now.values()), "leased Pods survive the restart"
            await client.release(lease.id)
            await client.delete_pool("ad")
    finally:
        await app2.stop(grace=1)

    async def none_left() -> bool:
        return not await running_pods(kube, namespace, settings.instance_id)

    await poll(none_left, timeout=60, what="no Pods left")
