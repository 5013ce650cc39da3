"""Network policies on Kubernetes against the real API server: a pool's
rules become its NetworkPolicy (egress only to the egress proxy's Pods and
DNS) and its Pods' proxy settings, resolver and rules; the policy goes with
the pool, and one left by a control plane that stopped is swept by the next;
the egress proxy (``sandboxd egress-proxy``) serves each source address
under the rules of the Pod the API server says has it. What is checked here
is the policies' shape and what they select; that their packets are dropped
on the wire is test_network_enforced.py's part (kube-router on the real
node)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from sandboxd import errors
from sandboxd.app import build_app
from sandboxd.backends.kubernetes.client import KubeClient, KubeError
from sandboxd.backends.kubernetes.egress import ANNOTATION_NETWORK, pool_policy_name
from sandboxd.backends.kubernetes.ledger import KubeLedger, pools_configmap
from sandboxd.backends.kubernetes.podspec import selector
from sandboxd.client import AsyncClient
from sandboxd.images.build import default_image_tag
from tests.kube.conftest import IMAGE, REAL_NODE_BACKEND, kube_settings, pods, poll, require_real_node
from tests.kube.egress_proxy import (
    FETCH,
    PROXY,
    PROXY_LABELS,
    RULES,
    bridge_address,
    free_port,
    host_proxy,
    proxy_get,
    proxy_resolve,
    proxy_service,
    upstream,
)
from tests.kube.proxy_pod import PODS_INSTANCE, proxy_stand_in, sandbox_pod_at

pytestmark = [pytest.mark.kube, pytest.mark.timeout(180)]

__all__ = ["upstream"]  # the fixture


async def _policies(kube: KubeClient, namespace: str) -> dict[str, dict[str, Any]]:
    listed = await kube.request("GET", f"/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies")
    return {p["metadata"]["name"]: p for p in listed.get("items") or []}


def _env(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][0]["env"]}


async def test_a_pools_rules_become_its_networkpolicy_and_its_pods_proxy_settings(
    tmp_path: Path, kubeconfig: str, namespace: str, kube: KubeClient
) -> None:
    proxy_ip = await proxy_service(kube, namespace)
    settings = kube_settings(tmp_path, kubeconfig, namespace, backend={"egress_proxy_service": PROXY})
    instance = settings.instance_id
    app = build_app(settings)
    await app.start()
    try:
        async with AsyncClient(app.address) as client:
            await client.create_pool("net", IMAGE, min_ready=1, max_size=2, network=RULES)
            await client.create_pool("plain", IMAGE, min_ready=1, max_size=2)
            async with client.acquire("net", timeout=60) as sb, client.acquire("plain", timeout=60) as other:
                policy = (await _policies(kube, namespace))[pool_policy_name(instance, "net")]
                (pod,) = await pods(kube, namespace, f"sandboxd.sandbox={sb.id}")
                (plain,) = await pods(kube, namespace, f"sandboxd.sandbox={other.id}")
                report = await client.preflight(pool="net", concurrent=1)
                assert report.ok, report
                # It selects the pool's Pods, and only them (asked while the leased ones exist).
                match = ",".join(f"{k}={v}" for k, v in policy["spec"]["podSelector"]["matchLabels"].items())
                chosen = {p["metadata"]["name"] for p in await pods(kube, namespace, match)}
            spec = policy["spec"]
            assert spec["policyTypes"] == ["Egress"]
            (rule,) = spec["egress"]
            assert rule["to"] == [
                {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                    "podSelector": {"matchLabels": PROXY_LABELS},
                }
            ]
            # The proxy Pods' own ports (a NetworkPolicy sees them after the Service's translation).
            assert rule["ports"] == [{"protocol": "TCP", "port": 3128}, {"protocol": "UDP", "port": 5353}]
            assert pod["metadata"]["name"] in chosen and plain["metadata"]["name"] not in chosen
            # Owned by the instance's record of its pools: gone with it at the latest.
            (owner,) = policy["metadata"]["ownerReferences"]
            assert (owner["kind"], owner["name"]) == ("ConfigMap", pools_configmap(instance))
            # The Pod: its rules for the proxy, the proxy's address for its
            # commands (no name to resolve), the proxy's DNS as its resolver.
            assert json.loads(pod["metadata"]["annotations"][ANNOTATION_NETWORK]) == RULES
            env = _env(pod)
            url = f"http://{proxy_ip}:3128"
            for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "npm_config_proxy"):
                assert env[name] == url, name
            assert "localhost" in env["NO_PROXY"]
            assert pod["spec"]["dnsPolicy"] == "None"
            assert pod["spec"]["dnsConfig"]["nameservers"] == [proxy_ip]
            assert ANNOTATION_NETWORK not in plain["metadata"]["annotations"]
            assert "HTTP_PROXY" not in _env(plain) and "dnsConfig" not in plain["spec"]
            assert len([n for n in await _policies(kube, namespace) if n.startswith("sandboxd-egress-")]) == 1

            await client.delete_pool("net", force=True)

            async def policy_gone() -> bool:
                return pool_policy_name(instance, "net") not in await _policies(kube, namespace)

            await poll(policy_gone, timeout=30, what="the pool's NetworkPolicy to go with the pool")
            await client.delete_pool("plain", force=True)
    finally:
        await app.stop(grace=1)


async def test_a_policy_whose_pool_is_gone_is_swept_by_the_next_control_plane(
    tmp_path: Path, kubeconfig: str, namespace: str, kube: KubeClient
) -> None:
    await proxy_service(kube, namespace)
    settings = kube_settings(tmp_path, kubeconfig, namespace, backend={"egress_proxy_service": PROXY})
    instance = settings.instance_id
    app = build_app(settings)
    await app.start()
    try:
        async with AsyncClient(app.address) as client:
            await client.create_pool("kept", IMAGE, min_ready=1, max_size=1, network=["pypi.internal"])
            await client.create_pool("lost", IMAGE, min_ready=1, max_size=1, network=["pypi.internal"])
            for pool in ("kept", "lost"):

                async def ready(pool: str = pool) -> bool:
                    return (await client.get_pool(pool)).status.ready >= 1

                await poll(ready, timeout=60, what=f"pool {pool} to warm")
    finally:
        await app.stop(grace=1)
    made = await _policies(kube, namespace)
    assert {pool_policy_name(instance, p) for p in ("kept", "lost")} <= set(made)
    # As if the control plane had stopped after forgetting "lost" but before deleting its policy.
    await KubeLedger(kube, namespace, instance, selector(instance)).delete_pool_spec("lost")
    again = build_app(settings)
    await again.start()
    try:

        async def swept() -> bool:
            return pool_policy_name(instance, "lost") not in await _policies(kube, namespace)

        await poll(swept, timeout=30, what="the stale NetworkPolicy to be swept")
        assert pool_policy_name(instance, "kept") in await _policies(kube, namespace)
        async with AsyncClient(again.address) as client:
            await client.delete_pool("kept", force=True)
            with contextlib.suppress(errors.NotFound):
                await client.delete_pool("lost", force=True)
    finally:
        await again.stop(grace=1)


async def test_network_pools_are_refused_without_the_proxy_or_the_cluster_state(
    tmp_path: Path, kubeconfig: str, namespace: str
) -> None:
    for backend, refused in (
        ({}, "egress proxy"),
        ({"egress_proxy_service": PROXY, "state": "sqlite"}, "cluster"),
    ):
        app = build_app(kube_settings(tmp_path, kubeconfig, namespace, backend=backend))
        await app.start()
        try:
            async with AsyncClient(app.address) as client:
                with pytest.raises(errors.FailedPrecondition, match=refused):
                    await client.create_pool("net", IMAGE, max_size=1, network=["pypi.internal"])
                assert not await client.list_pools()
        finally:
            await app.stop(grace=1)


async def test_a_network_pool_waits_for_the_proxys_service_and_makes_nothing_meanwhile(
    tmp_path: Path, kubeconfig: str, namespace: str, kube: KubeClient
) -> None:
    settings = kube_settings(tmp_path, kubeconfig, namespace, backend={"egress_proxy_service": PROXY})
    app = build_app(settings)
    await app.start()
    try:
        async with AsyncClient(app.address) as client:
            await client.create_pool("net", IMAGE, min_ready=1, max_size=1, network=["pypi.internal"])

            async def named() -> bool:
                return (
                    f"Service {PROXY} is not in namespace" in (await client.get_pool("net")).status.last_error
                )

            await poll(named, timeout=30, what="the pool's last error to name the missing Service")
            assert not await pods(kube, namespace, selector(settings.instance_id))
            assert pool_policy_name(settings.instance_id, "net") not in await _policies(kube, namespace)
            await proxy_service(kube, namespace)

            async def warm() -> bool:
                return (await client.get_pool("net")).status.ready >= 1

            await poll(warm, timeout=90, what="the pool to warm once the Service exists")
            assert pool_policy_name(settings.instance_id, "net") in await _policies(kube, namespace)
            await client.delete_pool("net", force=True)
    finally:
        await app.stop(grace=1)


def _metrics(port: int) -> dict[str, float]:
    """The proxy's /metrics, sample name with labels -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


async def test_the_egress_proxy_serves_each_source_under_its_pods_rules(
    kubeconfig: str, namespace: str, kube: KubeClient, upstream: int
) -> None:
    allowed = f"127.0.0.1:{upstream}"
    name = await sandbox_pod_at(kube, namespace, "sb-egress1", "127.0.0.1", [allowed, "pypi.internal"])
    metrics_port = free_port(socket.SOCK_STREAM)
    async with host_proxy(kubeconfig, namespace, metrics_port=metrics_port) as (port, dns):
        ok = await proxy_get(port, allowed)
        assert ok.startswith(b"HTTP/1.0 200") or ok.startswith(b"HTTP/1.1 200"), ok[:200]
        assert ok.endswith(b"upstream ok\n")
        denied = await proxy_get(port, f"127.0.0.1:{free_port(socket.SOCK_STREAM)}")
        assert denied.startswith(b"HTTP/1.1 403") and b"sandboxd egress denied" in denied, denied[:300]
        yes = await proxy_resolve(port=dns, name="pypi.internal")
        assert yes[3] & 0x0F == 0 and yes[-4:] == socket.inet_aton("10.96.0.53")
        no = await proxy_resolve(port=dns, name="evil.example")
        assert no[3] & 0x0F == 3, "NXDOMAIN for a name no rule names"
        # Counted per sandbox and pool, under the control plane's names.
        seen = await asyncio.to_thread(_metrics, metrics_port)
        assert seen['sandboxd_egress_denied_total{pool="p",sandbox="sb-egress1"}'] == 2, seen
        assert seen['sandboxd_egress_allowed_total{pool="p",sandbox="sb-egress1"}'] == 1, seen
        # The Pod gone, its address is no sandbox's: refused (the proxy's watch sees it go).
        await kube.request(
            "DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}", body={"gracePeriodSeconds": 0}
        )

        async def refused() -> bool:
            answer = await proxy_get(port, allowed)
            return answer.startswith(b"HTTP/1.1 403") and b"no sandbox Pod" in answer

        await poll(refused, timeout=30, what="the proxy to refuse a deleted Pod's address")
        seen = await asyncio.to_thread(_metrics, metrics_port)
        assert seen["sandboxd_egress_refused_sources_total"] >= 1, seen
    assert not [
        p
        for p in await pods(kube, namespace, selector(PODS_INSTANCE))
        if not p["metadata"].get("deletionTimestamp")
    ]
    with contextlib.suppress(KubeError):
        await kube.request("DELETE", f"/api/v1/namespaces/{namespace}/services/{PROXY}")


async def test_a_real_pod_of_a_network_pool_reaches_what_its_rules_allow_through_the_proxy(
    tmp_path: Path, kubeconfig: str, namespace: str, kube: KubeClient, upstream: int
) -> None:
    require_real_node()
    gateway = await asyncio.to_thread(bridge_address)
    backend = {**REAL_NODE_BACKEND, "egress_proxy_service": PROXY}
    app = build_app(kube_settings(tmp_path, kubeconfig, namespace, backend=backend))
    await app.start()
    try:
        async with (
            host_proxy(kubeconfig, namespace, listen=gateway) as (port, dns),
            # Where NetworkPolicy is enforced, the pool's policy lets its Pods reach this.
            proxy_stand_in(kube, namespace, PROXY_LABELS, gateway),
            AsyncClient(app.address) as client,
        ):
            proxy_ip = await proxy_service(kube, namespace, port, dns)
            # The default image: the real node imports the cached rootfs of every image.
            image = os.environ.get("SANDBOXD_KUBE_IMAGE", "") or default_image_tag()
            await client.create_pool("net", image, min_ready=0, max_size=1, network=[f"127.0.0.1:{upstream}"])
            async with client.acquire("net", timeout=120) as sb:
                conf = await sb.exec("cat /etc/resolv.conf; echo $HTTP_PROXY")
                assert f"nameserver {proxy_ip}" in conf.text and f"http://{proxy_ip}:3128" in conf.text, conf
                # The Service's address needs kube-proxy, which the test cluster lacks: the
                # Pod names the proxy on this host instead; it is told apart by its own address.
                via = f"http://{gateway}:{port}"
                ok = await sb.exec(["python3", "-c", FETCH, via, f"http://127.0.0.1:{upstream}/"], timeout=30)
                assert ok.ok and ok.stdout == b"upstream ok\n", ok
                other = free_port(socket.SOCK_STREAM)
                denied = await sb.exec(
                    ["python3", "-c", FETCH, via, f"http://127.0.0.1:{other}/"], timeout=30
                )
                assert denied.stdout.startswith(b"403 sandboxd egress denied"), denied
            await client.delete_pool("net", force=True)
    finally:
        await app.stop(grace=1)
