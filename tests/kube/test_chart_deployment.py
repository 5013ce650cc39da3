"""The chart's Deployment running the control plane in the test cluster.

`helm install charts/sandboxd` with a control-plane image built here without
a registry (deploy/testcluster/control-plane-image.sh, imported into the real
node's containerd): the Deployment becomes Ready through its gRPC health
probes, the control plane reaches the API server with the chart's
ServiceAccount (in-cluster configuration, no kubeconfig) and RBAC only, a
client with a tenant token creates a pool whose sandbox Pods start on the
real node, acquires one, runs a command in it and releases it, and
`helm uninstall` after deleting the pool leaves no Pod behind.

The test cluster has no kube-proxy, so the `kubernetes` Service is not
routable from Pods: the control plane runs with `hostNetwork` and reaches the
API server at its own address (`extraEnv` KUBERNETES_SERVICE_HOST/PORT), and
the client dials the Pod's (the node's) address on a free port.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import socket
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from sandboxd.backends.kubernetes.client import KubeClient, KubeError
from sandboxd.client import AsyncClient
from sandboxd.images.build import default_image_tag
from tests.kube.conftest import REAL_NODE_NAME, pods, poll, require_real_node
from tests.kube.test_chart import CHART, ROOT, run, tool

pytestmark = [pytest.mark.kube, pytest.mark.kube_node, pytest.mark.timeout(600)]

NODE = REAL_NODE_NAME
RELEASE = "sandboxd"
TENANT = "ci"


def _build_image() -> str:
    """The control-plane image reference (built and imported on a cold cache)."""
    proc = subprocess.run(
        ["bash", str(ROOT / "deploy/testcluster/control-plane-image.sh")],
        capture_output=True, text=True, timeout=540,
    )  # fmt: skip
    assert proc.returncode == 0, f"control-plane-image.sh failed: {proc.stderr[-3000:]}"
    return proc.stdout.split()[-1]


def _free_port() -> int:
    """A port free on this host, which the control plane's node shares."""
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return int(s.getsockname()[1])


async def _deployment_ready(kube: KubeClient, ns: str, name: str) -> bool:
    """Ready through the probes; fails at once if the control plane exits."""
    # The control plane's own Pods (not the chart's egress proxy's).
    for pod in await pods(kube, ns, f"app.kubernetes.io/name=sandboxd,app.kubernetes.io/instance={name}"):
        for c in pod["status"].get("containerStatuses") or []:
            if c.get("restartCount"):
                raise AssertionError(f"the control plane restarted: {c.get('lastState')}")
    status = (await kube.request("GET", f"/apis/apps/v1/namespaces/{ns}/deployments/{name}"))["status"]
    return bool(status.get("readyReplicas") == 1 and status.get("updatedReplicas") == 1)


def _diagnose(kubectl: str, kubeconfig: str, ns: str) -> str:
    """Pod status and the control plane's log, for a failure message."""
    out = []
    logs = ["logs", "deploy/" + RELEASE, "--tail=60"]
    for argv in (["get", "pods", "-o", "wide"], ["describe", "pods"], logs):
        proc = subprocess.run(
            [kubectl, "--kubeconfig", kubeconfig, "-n", ns, *argv], capture_output=True, text=True, timeout=30
        )
        out.append(proc.stdout[-4000:] + proc.stderr[-1000:])
    return "\n".join(out)


async def test_the_chart_runs_the_control_plane_in_the_cluster(
    kubeconfig: str, kube: KubeClient, namespace: str, tmp_path: Path
) -> None:
    require_real_node()
    helm, kubectl = tool("helm", "HELM_VERSION"), tool("kubectl", "KUBE_VERSION")
    image = await asyncio.to_thread(_build_image)
    sandbox_image = default_image_tag()  # on the node since node-up.sh
    api = urlsplit(kube.cfg.host)
    port, token = _free_port(), secrets.token_urlsafe(24)
    # The control plane in one fresh namespace (no Pod Security enforcement:
    # it runs with hostNetwork), its sandboxes in `namespace` ("restricted").
    release_ns = namespace + "-cp"
    await kube.request("POST", "/api/v1/namespaces", body={"metadata": {"name": release_ns}})
    repository, _, tag = image.rpartition(":")
    real_node = {
        "nodeSelector": {"kubernetes.io/hostname": NODE},
        "tolerations": [{"key": "sandboxd.io/real-node", "operator": "Exists", "effect": "NoSchedule"}],
    }
    values = {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "instanceId": "cp-" + secrets.token_hex(3),
        "sandboxNamespace": {"name": namespace},
        "server": {"port": port},
        "metrics": {"port": 0},
        "hostNetwork": True,
        "dnsPolicy": "Default",  # the test cluster has no cluster DNS
        "extraEnv": [
            {"name": "KUBERNETES_SERVICE_HOST", "value": api.hostname},
            {"name": "KUBERNETES_SERVICE_PORT", "value": str(api.port)},
        ],
        **real_node,
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "1Gi"}},
        # Sandboxes on the real node too, small enough to fit beside other tests.
        "sandbox": real_node,
        "limits": {"memory_bytes": 128 << 20, "cpu_millis": 100, "disk_bytes": 64 << 20, "max_files": 20000},
    }
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    env = {"KUBECONFIG": kubeconfig}
    # Tenant tokens as deploy/README.md says: the rendered sandboxd.toml plus
    # a [tenants.<name>] section, in a Secret named by `configSecret`.
    rendered = await asyncio.to_thread(
        run, helm, "template", RELEASE, str(CHART), "-n", release_ns, "-f", str(values_file),
        "-s", "templates/configmap.yaml",
    )  # fmt: skip
    config = yaml.safe_load(rendered)["data"]["sandboxd.toml"]
    assert "kubeconfig" not in config  # in-cluster: the ServiceAccount's token
    config += f'\n[tenants.{TENANT}]\ntoken = "{token}"\nmax_sandboxes = 4\n'
    await kube.request(
        "POST",
        f"/api/v1/namespaces/{release_ns}/secrets",
        body={"metadata": {"name": "sandboxd-config"}, "stringData": {"sandboxd.toml": config}},
    )
    installed = True  # from here on, uninstall whatever part of the release exists
    try:
        await asyncio.to_thread(
            run, helm, "install", RELEASE, str(CHART), "-n", release_ns, "-f", str(values_file),
            "--set", "configSecret=sandboxd-config", env=env,
        )  # fmt: skip
        try:
            await poll(
                lambda: _deployment_ready(kube, release_ns, RELEASE), timeout=300, what="Deployment Ready"
            )
        except AssertionError as e:
            why = await asyncio.to_thread(_diagnose, kubectl, kubeconfig, release_ns)
            raise AssertionError(f"{e}\n{why}") from None
        (cp,) = await pods(
            kube, release_ns, f"app.kubernetes.io/name=sandboxd,app.kubernetes.io/instance={RELEASE}"
        )
        # The chart's ServiceAccount, its token mounted, no kubeconfig: the
        # API server's RBAC is all the control plane is allowed.
        assert cp["spec"]["serviceAccountName"] == RELEASE
        assert cp["spec"]["nodeName"] == NODE and cp["spec"]["hostNetwork"] is True
        # Ready means the kubelet's gRPC health probe answered SERVING.
        assert cp["spec"]["containers"][0]["readinessProbe"]["grpc"]["port"] == port
        target = f"{cp['status']['podIP']}:{port}"

        async with AsyncClient(target, token=token) as client:
            await client.create_pool("cp", sandbox_image, min_ready=1, max_size=2)

            async def warm() -> bool:
                return any(
                    p["status"].get("phase") == "Running"
                    for p in await pods(kube, namespace, "sandboxd.managed=true")
                )

            await poll(warm, timeout=180, what="a Running sandbox Pod")
            async with client.acquire("cp", timeout=120) as sb:
                assert (await sb.exec(["python3", "-c", "print(6 * 7)"])).stdout == b"42\n"
                leased: list[dict[str, Any]] = []

                async def lease_recorded() -> bool:
                    # The lease is recorded as an annotation on the Pod (patch).
                    leased[:] = [
                        p
                        for p in await pods(kube, namespace, "sandboxd.managed=true")
                        if "sandboxd.io/lease" in (p["metadata"].get("annotations") or {})
                    ]
                    return bool(leased)

                await poll(lease_recorded, timeout=60, what="the lease annotation")
                assert len(leased) == 1 and leased[0]["spec"]["nodeName"] == NODE
            # Released sandboxes are destroyed, never recycled.
            uid = leased[0]["metadata"]["uid"]

            async def released() -> bool:
                return all(
                    p["metadata"]["uid"] != uid for p in await pods(kube, namespace, "sandboxd.managed=true")
                )

            await poll(released, timeout=120, what="the released sandbox's Pod deleted")
            await client.delete_pool("cp")

        await asyncio.to_thread(
            run, helm, "uninstall", RELEASE, "-n", release_ns, "--wait", "--timeout", "120s", env=env
        )
        installed = False

        async def gone() -> bool:
            return not await pods(kube, namespace, "sandboxd.managed=true") and not await pods(
                kube, release_ns, f"app.kubernetes.io/instance={RELEASE}"
            )

        await poll(gone, timeout=120, what="no sandbox and no control-plane Pods")
    finally:
        if installed:
            with contextlib.suppress(AssertionError, subprocess.SubprocessError):
                await asyncio.to_thread(run, helm, "uninstall", RELEASE, "-n", release_ns, env=env)
        with contextlib.suppress(KubeError):
            await kube.request("DELETE", f"/api/v1/namespaces/{release_ns}", body={"gracePeriodSeconds": 0})
