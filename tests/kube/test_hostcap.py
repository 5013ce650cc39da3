"""Honest capacity on Kubernetes against a real API server and scheduler:
host_facts from simulated (kwok) nodes of known allocatable and the
namespace's ResourceQuotas, and unschedulable() counting the Pods the
scheduler cannot place, with its message.

The nodes are this test's own: labelled and tainted with a token, so only the
backends here (which select and tolerate them) see them, and other tests'
Pods never land on them."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator
from typing import Any

import pytest

from sandboxd.backends.base import Limits
from sandboxd.backends.kubernetes import KubernetesBackend
from sandboxd.backends.kubernetes.client import KubeClient, KubeError
from sandboxd.backends.kubernetes.hostcap import POD_OVERHEAD_BYTES
from sandboxd.backends.kubernetes.podspec import selector
from sandboxd.core import capacity
from tests.kube.conftest import pods, poll
from tests.kube.test_backend import make_backend, spec

pytestmark = [pytest.mark.kube, pytest.mark.timeout(120)]

GiB = 1 << 30
KEY = "sandboxd.io/hostcap-test"
# Two nodes: means of 5 GiB, 4 CPUs and 40 Pods per node.
NODES = (
    {"memory": "4Gi", "cpu": "4", "pods": "30", "ephemeral-storage": "100Gi"},
    {"memory": "6Gi", "cpu": "4", "pods": "50", "ephemeral-storage": "100Gi"},
)


def kwok_node(name: str, token: str, allocatable: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"node.alpha.kubernetes.io/ttl": "0", "kwok.x-k8s.io/node": "fake"},
            "labels": {
                "type": "kwok",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                KEY: token,
            },
        },
        "spec": {"taints": [{"key": KEY, "value": token, "effect": "NoSchedule"}]},
        "status": {"allocatable": allocatable, "capacity": allocatable},
    }


@pytest.fixture
async def test_nodes(kube: KubeClient) -> AsyncIterator[str]:
    """Two kwok nodes of known allocatable, Ready; their token (label and taint value)."""
    token = secrets.token_hex(4)
    names = [f"kwok-hostcap-{token}-{i}" for i in range(len(NODES))]
    try:
        for name, alloc in zip(names, NODES, strict=True):
            await kube.request("POST", "/api/v1/nodes", body=kwok_node(name, token, alloc))

        def usable(n: dict[str, Any]) -> bool:
            # Ready, and the node lifecycle controller has lifted its
            # not-ready taint (it lags the condition): only the test's taint.
            conditions = n["status"].get("conditions") or []
            ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
            return ready and [t["key"] for t in n["spec"].get("taints") or []] == [KEY]

        async def ready() -> bool:
            body = await kube.request("GET", "/api/v1/nodes", query={"labelSelector": f"{KEY}={token}"})
            return sum(usable(n) for n in body.get("items") or []) == len(names)

        await poll(ready, timeout=60, what="the test's kwok nodes Ready")
        yield token
    finally:
        for name in names:
            with contextlib.suppress(KubeError):
                await kube.request("DELETE", f"/api/v1/nodes/{name}")


@pytest.fixture
async def backend(kubeconfig: str, namespace: str, test_nodes: str) -> AsyncIterator[KubernetesBackend]:
    """A backend whose Pods may land on the test's nodes only."""
    b = make_backend(
        kubeconfig,
        namespace,
        node_selector={KEY: test_nodes},
        tolerations=({"key": KEY, "operator": "Exists", "effect": "NoSchedule"},),
    )
    await b.ping()
    try:
        yield b
    finally:
        for s in await b.list():
            await b.destroy(s.handle)
        await b.close()


async def test_host_facts_are_the_nodes_allocatable(backend: KubernetesBackend) -> None:
    facts = await backend.host_facts()
    assert facts.nodes == 2
    assert facts.memory_bytes == 5 * GiB  # the mean: x nodes = the total allocatable
    assert (facts.cpus, facts.engine_max, facts.threads_max) == (4, 40, 0)
    assert facts.overhead_memory_bytes == POD_OVERHEAD_BYTES and not facts.measured
    assert facts.quota_max == 0
    est = capacity.estimate(facts, Limits(memory_bytes=GiB, pids=256), overcommit=1.0)
    assert (est.bound_by, est.per_node, est.sandboxes) == ("memory", 4, 8)


async def test_a_pods_quota_caps_quota_max(
    backend: KubernetesBackend, kube: KubeClient, namespace: str
) -> None:
    quotas = f"/api/v1/namespaces/{namespace}/resourcequotas"
    await kube.request(
        "POST",
        quotas,
        body={"metadata": {"name": "q"}, "spec": {"hard": {"pods": "3", "limits.memory": "2Gi"}}},
    )
    facts = await backend.host_facts()
    assert facts.quota_max == 3 and "ResourceQuota q: pods 3" in facts.quota_detail
    assert facts.memory_bytes * facts.nodes == 2 * GiB  # the memory quota lowers the per-node figure
    assert capacity.estimate(facts, Limits(memory_bytes=64 << 20)).bound_by == "quota"

    # The backend's own Pod does not shrink its room; another's does.
    await backend.create(spec())
    await poll(lambda: backend.cache.pods != {}, timeout=30, what="own Pod in the cache")
    assert (await backend.host_facts()).quota_max == 3
    other = {
        "metadata": {"name": "not-a-sandbox"},
        "spec": {
            "nodeSelector": {"no-such-label": "x"},
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 1000,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "c",
                    "image": "busybox:1",
                    "resources": {"limits": {"memory": "64Mi", "cpu": "10m"}},
                    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                }
            ],
        },
    }
    await kube.request("POST", f"/api/v1/namespaces/{namespace}/pods", body=other)

    async def others_counted() -> bool:
        return (await backend.host_facts()).quota_max == 2

    await poll(others_counted, timeout=30, what="quota_max to count the other Pod")


async def test_unschedulable_pods_are_counted_with_the_schedulers_message(
    backend: KubernetesBackend, kube: KubeClient, namespace: str
) -> None:
    assert backend.unschedulable() == (0, "")
    # More memory than either node has: the scheduler cannot place it, and
    # the create waits for it (its ready timeout is 60 s).
    creating = asyncio.create_task(backend.create(spec(memory_bytes=8 * GiB)))
    try:
        await poll(
            lambda: backend.unschedulable()[0] == 1 or creating.done(), timeout=60, what="unschedulable Pod"
        )
        count, message = backend.unschedulable()
        assert count == 1, creating
        assert "Insufficient memory" in message, message
        assert message.startswith("0/"), message
    finally:
        creating.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await creating
    # The cancelled create deleted its Pod: the watch sees it go.
    await poll(lambda: backend.unschedulable() == (0, ""), timeout=30, what="unschedulable count back to 0")

    async def none_left() -> bool:
        return not await pods(kube, namespace, selector(backend._options.instance))

    await poll(none_left, timeout=30, what="the unschedulable Pod deleted")
