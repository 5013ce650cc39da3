"""Tenant quotas mirrored as ResourceQuotas on the real API server: the
tenant's Pods name its PriorityClass, its ResourceQuota (scoped to that
class) holds max_sandboxes and max_memory_bytes plus its pools' warm
ceilings, the API server refuses a Pod past it, and Preflight reports the
headroom the quotas leave."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from sandboxd.app import build_app
from sandboxd.backends.base import Limits, SandboxSpec
from sandboxd.backends.kubernetes import KubernetesBackend
from sandboxd.backends.kubernetes.client import KubeClient, KubeError
from sandboxd.backends.kubernetes.podspec import selector, tenant_class
from sandboxd.client import AsyncClient
from sandboxd.errors import TransientBackendError
from tests.kube.conftest import IMAGE, kube_settings, pods, poll

pytestmark = [pytest.mark.kube, pytest.mark.timeout(180)]

MEMORY = 64 << 20


async def test_a_tenants_quota_is_a_resource_quota_and_preflight_reports_its_headroom(
    tmp_path: Path, kubeconfig: str, namespace: str, kube: KubeClient
) -> None:
    settings = kube_settings(
        tmp_path,
        kubeconfig,
        namespace,
        backend={"tenant_quotas": True},
        tenants={"alice": {"token": "tok-alice", "max_sandboxes": 2, "max_memory_bytes": 4 * MEMORY}},
    )
    klass = tenant_class("alice")
    app = build_app(settings)
    await app.start()
    try:
        async with AsyncClient(app.address, token="tok-alice") as client:
            await client.create_pool("q", IMAGE, min_ready=1, max_size=4)

            async def warm() -> bool:
                return (await client.get_pool("q")).status.ready >= 1

            await poll(warm, timeout=90, what="the pool to warm")
            quota = await kube.request("GET", f"/api/v1/namespaces/{namespace}/resourcequotas/{klass}")
            # 2 leased + 1 warm; 4 x 64 MiB leased + 1 x 64 MiB warm.
            assert quota["spec"]["hard"] == {"pods": "3", "limits.memory": str(5 * MEMORY)}
            (pod,) = await pods(kube, namespace, selector(settings.instance_id))
            assert pod["spec"]["priorityClassName"] == klass

            async def counted() -> bool:
                q = await kube.request("GET", f"/api/v1/namespaces/{namespace}/resourcequotas/{klass}")
                return (q.get("status") or {}).get("used", {}).get("pods") == "1"

            await poll(counted, timeout=60, what="the quota controller to count the warm Pod")
            report = await client.preflight(pool="q", concurrent=4)
            assert report.capacity.quota_sandboxes_left == 2
            assert report.capacity.quota_memory_left_bytes == 4 * MEMORY
            kinds = {p.field for p in report.problems}
            assert "backend quota (pods)" in kinds  # 3 more do not fit in 2
            assert "tenants.alice.max_sandboxes" in kinds
            fits = await client.preflight(pool="q", concurrent=2)
            assert fits.ok, fits.problems

            # The API server itself refuses the tenant's Pods past the quota.
            assert isinstance(app.backend, KubernetesBackend)
            handles = []
            try:
                for i in range(2):
                    spec = SandboxSpec(
                        f"sb-extra{i}", "alice/q", IMAGE, Limits(memory_bytes=MEMORY, cpu_millis=100)
                    )
                    handles.append(await app.backend.create(spec))
                with pytest.raises(TransientBackendError, match="quota"):
                    spec = SandboxSpec(
                        "sb-over", "alice/q", IMAGE, Limits(memory_bytes=MEMORY, cpu_millis=100)
                    )
                    await app.backend.create(spec)
            finally:
                for h in handles:
                    await app.backend.destroy(h)

            # Deleting the pool shrinks the quota to the lease allowance.
            await client.delete_pool("q", force=True)
            quota = await kube.request("GET", f"/api/v1/namespaces/{namespace}/resourcequotas/{klass}")
            assert quota["spec"]["hard"] == {"pods": "2", "limits.memory": str(4 * MEMORY)}
    finally:
        await app.stop(grace=1)
        with contextlib.suppress(KeyError, KubeError):
            await kube.request("DELETE", f"/apis/scheduling.k8s.io/v1/priorityclasses/{klass}")
