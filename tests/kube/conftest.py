"""Kubernetes tier: the real server in-process against a real API server
(deploy/testcluster/up.sh: etcd, kube-apiserver, controller-manager,
scheduler, kwok nodes). Skipped, with the reason, when KUBECONFIG is unset or
the API server does not answer; scripts/test.sh starts the cluster and sets
it. kwok nodes run Pod lifecycles without containers, so nothing here execs
into a Pod: those tests are marked ``kube_node`` and need a real kubelet."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from sandboxd.app import App, build_app
from sandboxd.backends.kubernetes.client import KubeClient, KubeError, load_configuration
from sandboxd.settings import Settings, load_settings

pytestmark = pytest.mark.kube

IMAGE = "sandboxd/rollout:kube-test"


def _reachable(kubeconfig: str) -> str:
    """'' when the API server answers /version, else why not."""
    try:
        from kubernetes import client as k8s_client

        cfg = load_configuration(kubeconfig, None)
        api = k8s_client.ApiClient(cfg)
        try:
            params = api.param_serialize("GET", "/version", auth_settings=["BearerToken"])
            response = api.call_api(*params, _request_timeout=5)
            response.read()
            return "" if response.status == 200 else f"/version answered {response.status}"
        finally:
            api.close()
    except Exception as e:
        return f"{type(e).__name__}: {e}"


@pytest.fixture(scope="session")
def kubeconfig() -> str:
    path = os.environ.get("KUBECONFIG", "")
    if not path:
        pytest.skip("KUBECONFIG is not set: start the test cluster with deploy/testcluster/up.sh")
    why = _reachable(path)
    if why:
        pytest.skip(f"the Kubernetes API server in {path} is not reachable: {why}")
    return path


@pytest.fixture
async def kube(kubeconfig: str) -> AsyncIterator[KubeClient]:
    client = KubeClient(load_configuration(kubeconfig, None), threads=8)
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
async def namespace(kube: KubeClient) -> AsyncIterator[str]:
    """A fresh namespace that enforces the ``restricted`` Pod Security
    Standard, so the API server's own admission proves sandbox Pods are
    hardened."""
    name = "sbx-test-" + secrets.token_hex(4)
    await kube.request(
        "POST",
        "/api/v1/namespaces",
        body={
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": name,
                "labels": {
                    "pod-security.kubernetes.io/enforce": "restricted",
                    "pod-security.kubernetes.io/enforce-version": "latest",
                },
            },
        },
    )
    # The controller manager makes the default ServiceAccount, without which
    # the ServiceAccount admission plugin rejects Pods.
    await poll(lambda: _has_default_sa(kube, name), timeout=30, what="default ServiceAccount")
    try:
        yield name
    finally:
        with contextlib.suppress(KubeError):
            await kube.request("DELETE", f"/api/v1/namespaces/{name}", body={"gracePeriodSeconds": 0})


async def _has_default_sa(kube: KubeClient, namespace: str) -> bool:
    try:
        await kube.request("GET", f"/api/v1/namespaces/{namespace}/serviceaccounts/default")
        return True
    except KubeError:
        return False


async def poll(
    predicate: Callable[[], Awaitable[bool] | bool], timeout: float = 30.0, what: str = ""
) -> None:
    """Polls until ``predicate`` holds, failing after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if not isinstance(value, bool):
            value = await value
        if value:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        await asyncio.sleep(0.05)


async def pods(kube: KubeClient, namespace: str, selector: str) -> list[dict[str, Any]]:
    body = await kube.request(
        "GET", f"/api/v1/namespaces/{namespace}/pods", query={"labelSelector": selector}
    )
    return list(body.get("items") or [])


async def create_service(
    kube: KubeClient,
    namespace: str,
    name: str,
    selector: dict[str, str],
    ports: list[dict[str, Any]],
    annotations: dict[str, str] | None = None,
) -> str:
    """A Service as a chart would make it, made by hand; its cluster IP."""
    metadata: dict[str, Any] = {"name": name}
    if annotations:
        metadata["annotations"] = annotations
    svc = await kube.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/services",
        body={
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": metadata,
            "spec": {"selector": selector, "ports": ports},
        },
    )
    return str(svc["spec"]["clusterIP"])


REAL_NODE = os.environ.get("SANDBOXD_KUBE_REAL_NODE") == "1"
REAL_NODE_NAME = os.environ.get("KUBE_REAL_NODE", "real-node-0")
# Backend settings that put sandboxes on the real kubelet node of
# deploy/testcluster/node-up.sh (tainted so only Pods that tolerate it land
# there), with the image imported into its containerd.
REAL_NODE_BACKEND: dict[str, Any] = {
    "node_selector": {"kubernetes.io/hostname": REAL_NODE_NAME},
    "tolerations": [{"key": "sandboxd.io/real-node", "operator": "Exists", "effect": "NoSchedule"}],
    "image_pull_policy": "Never",
    "exec_health_check": True,
}


def require_real_node() -> None:
    if not REAL_NODE:
        pytest.skip("needs the real kubelet node (deploy/testcluster/node-up.sh; SANDBOXD_KUBE_REAL_NODE=1)")


# kube-router enforcing NetworkPolicy on the real node (deploy/testcluster/netpol-up.sh).
NETPOL = os.environ.get("SANDBOXD_KUBE_NETPOL") == "1"


def require_netpol() -> None:
    require_real_node()
    if not NETPOL:
        pytest.skip(
            "needs NetworkPolicy enforced on the real node: deploy/testcluster/netpol-up.sh says why it "
            "is not (log: kube-router.log beside the node's); SANDBOXD_KUBE_NETPOL=1"
        )


def kube_settings(tmp_path: Path, kubeconfig: str, namespace: str, **overrides: Any) -> Settings:
    """Settings of a server on the test cluster; a ``backend`` override is
    merged into the Kubernetes backend's table, other overrides replace."""
    backend = overrides.pop("backend", {})
    base: dict[str, Any] = {
        "instance_id": "kt-" + secrets.token_hex(4),
        "state_dir": str(tmp_path / "state"),
        "server.port": 0,
        "leases.reap_interval_seconds": 0.1,
        "backend": {
            "kind": "kubernetes",
            "namespace": namespace,
            "kubeconfig": kubeconfig,
            "threads": 8,
            "ready_timeout_seconds": 60.0,
        },
        # kwok nodes: 4 x 64 CPUs; keep test sandboxes small.
        "limits.cpu_millis": 100,
        "limits.memory_bytes": 64 << 20,
    }
    base["backend"].update(backend)
    base.update(overrides)
    return load_settings(None, base)


@contextlib.asynccontextmanager
async def real_node_app(
    tmp_path: Path, kubeconfig: str, namespace: str, **overrides: Any
) -> AsyncIterator[App]:
    """A started server whose Pods run on the real kubelet node (the test is
    skipped without one); stopped at the end."""
    require_real_node()
    backend = {**REAL_NODE_BACKEND, **overrides.pop("backend", {})}
    async with started_app(
        kube_settings(tmp_path, kubeconfig, namespace, backend=backend, **overrides)
    ) as app:
        yield app


@contextlib.asynccontextmanager
async def started_app(settings: Settings) -> AsyncIterator[App]:
    """A server of ``settings``, started; stopped at the end."""
    app = build_app(settings)
    await app.start()
    try:
        yield app
    finally:
        await app.stop(grace=1)
