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
import http.server
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from sandboxd import errors
from sandboxd.app import build_app
from sandboxd.backends.base import Limits, SandboxSpec
from sandboxd.backends.kubernetes.client import KubeClient, KubeError
from sandboxd.backends.kubernetes.egress import ANNOTATION_NETWORK, pool_policy_name
from sandboxd.backends.kubernetes.ledger import KubeLedger, pools_configmap
from sandboxd.backends.kubernetes.podspec import PodOptions, build_pod, selector
from sandboxd.client import AsyncClient
from sandboxd.images.build import default_image_tag
from tests.kube.conftest import IMAGE, REAL_NODE_BACKEND, kube_settings, pods, poll, require_real_node
from tests.kube.proxy_pod import proxy_stand_in

pytestmark = [pytest.mark.kube, pytest.mark.timeout(180)]

PROXY = "egress-test"
PROXY_LABELS = {
    "app.kubernetes.io/name": "sandboxd-egress-proxy",
    "app.kubernetes.io/component": "egress-proxy",
}
RULES = ["pypi.internal", "*.corp.example:443", "10.1.0.0/16:22"]


async def _proxy_service(kube: KubeClient, namespace: str, port: int = 3128, dns_port: int = 5353) -> str:
    """The chart's egress-proxy Service (its shape), made by hand, its Pods'
    ports ``port`` and ``dns_port``; its cluster IP."""
    svc = await kube.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/services",
        body={
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": PROXY},
            "spec": {
                "selector": PROXY_LABELS,
                "ports": [
                    {"name": "proxy", "port": 3128, "targetPort": port, "protocol": "TCP"},
                    {"name": "dns", "port": 53, "targetPort": dns_port, "protocol": "UDP"},
                ],
            },
        },
    )
    return str(svc["spec"]["clusterIP"])


async def _policies(kube: KubeClient, namespace: str) -> dict[str, dict[str, Any]]:
    listed = await kube.request("GET", f"/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies")
    return {p["metadata"]["name"]: p for p in listed.get("items") or []}


def _env(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][0]["env"]}


async def test_a_pools_rules_become_its_networkpolicy_and_its_pods_proxy_settings(
    tmp_path: Path, kubeconfig: str, namespace: str, kube: KubeClient
) -> None:
    proxy_ip = await _proxy_service(kube, namespace)
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
    await _proxy_service(kube, namespace)
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
            await _proxy_service(kube, namespace)

            async def warm() -> bool:
                return (await client.get_pool("net")).status.ready >= 1

            await poll(warm, timeout=90, what="the pool to warm once the Service exists")
            assert pool_policy_name(settings.instance_id, "net") in await _policies(kube, namespace)
            await client.delete_pool("net", force=True)
    finally:
        await app.stop(grace=1)


class _Upstream(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"upstream ok\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def upstream() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def _free_port(kind: int) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _pod_at(kube: KubeClient, namespace: str, address: str, rules: list[str]) -> str:
    """A sandbox Pod on no node, its status said by hand: Running at ``address``."""
    spec = SandboxSpec(
        "sb-egress1", "p", IMAGE, Limits(memory_bytes=64 << 20, cpu_millis=100), network=tuple(rules)
    )
    body = build_pod(spec, PodOptions(namespace=namespace, instance="egress-test"))
    body["metadata"]["annotations"][ANNOTATION_NETWORK] = json.dumps(rules)
    # Never scheduled (no scheduler has this name): bound to a missing node,
    # the controller-manager's Pod garbage collector could delete it mid-test.
    body["spec"]["schedulerName"] = "sandboxd-test-none"
    name = str(body["metadata"]["name"])
    await kube.request("POST", f"/api/v1/namespaces/{namespace}/pods", body=body)
    await kube.request(
        "PATCH",
        f"/api/v1/namespaces/{namespace}/pods/{name}/status",
        body={"status": {"phase": "Running", "podIP": address, "podIPs": [{"ip": address}]}},
        content_type="application/merge-patch+json",
    )
    return name


def _query(name: str) -> bytes:
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.split("."))
    return struct.pack("!HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0) + labels + b"\0" + struct.pack("!HH", 1, 1)


@contextlib.asynccontextmanager
async def _egress_proxy(
    kubeconfig: str, namespace: str, listen: str = "127.0.0.1", metrics_port: int = 0
) -> AsyncIterator[tuple[int, int]]:
    """``sandboxd egress-proxy`` as the chart runs it, on this host at ``listen``."""
    port, dns = _free_port(socket.SOCK_STREAM), _free_port(socket.SOCK_DGRAM)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sandboxd.cli", "egress-proxy", f"--namespace={namespace}",
        f"--listen={listen}", f"--port={port}", f"--dns-port={dns}", "--dns-answer=10.96.0.53",
        f"--kubeconfig={kubeconfig}", f"--metrics-port={metrics_port}",
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip

    async def listening() -> bool:
        with contextlib.suppress(OSError):
            _, w = await asyncio.open_connection(listen, port)
            w.close()
            return True
        if proc.returncode is not None:
            raise AssertionError(await proc.stderr.read() if proc.stderr else b"the proxy exited")
        return False

    try:
        await poll(listening, timeout=60, what="the egress proxy to listen")
        yield port, dns
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 10)


def _metrics(port: int) -> dict[str, float]:
    """The proxy's /metrics, sample name with labels -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


async def _get(port: int, target: str) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET http://{target}/ HTTP/1.1\r\nHost: {target}\r\nConnection: close\r\n\r\n".encode())
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return data


async def _dns(port: int, name: str) -> bytes:
    loop = asyncio.get_running_loop()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.setblocking(False)
        await loop.sock_connect(s, ("127.0.0.1", port))
        await loop.sock_sendall(s, _query(name))
        return await asyncio.wait_for(loop.sock_recv(s, 512), 10)


async def test_the_egress_proxy_serves_each_source_under_its_pods_rules(
    kubeconfig: str, namespace: str, kube: KubeClient, upstream: int
) -> None:
    allowed = f"127.0.0.1:{upstream}"
    name = await _pod_at(kube, namespace, "127.0.0.1", [allowed, "pypi.internal"])
    metrics_port = _free_port(socket.SOCK_STREAM)
    async with _egress_proxy(kubeconfig, namespace, metrics_port=metrics_port) as (port, dns):
        ok = await _get(port, allowed)
        assert ok.startswith(b"HTTP/1.0 200") or ok.startswith(b"HTTP/1.1 200"), ok[:200]
        assert ok.endswith(b"upstream ok\n")
        denied = await _get(port, f"127.0.0.1:{_free_port(socket.SOCK_STREAM)}")
        assert denied.startswith(b"HTTP/1.1 403") and b"sandboxd egress denied" in denied, denied[:300]
        yes = await _dns(port=dns, name="pypi.internal")
        assert yes[3] & 0x0F == 0 and yes[-4:] == socket.inet_aton("10.96.0.53")
        no = await _dns(port=dns, name="evil.example")
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
            answer = await _get(port, allowed)
            return answer.startswith(b"HTTP/1.1 403") and b"no sandbox Pod" in answer

        await poll(refused, timeout=30, what="the proxy to refuse a deleted Pod's address")
        seen = await asyncio.to_thread(_metrics, metrics_port)
        assert seen["sandboxd_egress_refused_sources_total"] >= 1, seen
    assert not [
        p
        for p in await pods(kube, namespace, selector("egress-test"))
        if not p["metadata"].get("deletionTimestamp")
    ]
    with contextlib.suppress(KubeError):
        await kube.request("DELETE", f"/api/v1/namespaces/{namespace}/services/{PROXY}")


# Fetches argv[2] through the proxy argv[1]: the body, or the HTTP status and body of a refusal.
FETCH = """
import os, sys, urllib.error, urllib.request
# NO_PROXY names 127.0.0.1 (the sandbox's own loopback); here it is the proxy's host's.
os.environ.pop("NO_PROXY", None), os.environ.pop("no_proxy", None)
opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": sys.argv[1]}))
try:
    sys.stdout.write(opener.open(sys.argv[2], timeout=20).read().decode())
except urllib.error.HTTPError as e:
    sys.stdout.write(f"{e.code} {e.read().decode()}")
"""


def _bridge_address() -> str:
    """The real node's Pod bridge gateway: where its Pods reach this host."""
    shown = subprocess.run(
        ["ip", "-4", "-o", "addr", "show", "sbxtest0"],
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )
    words = shown.stdout.split()
    if "inet" not in words:
        pytest.skip("no sbxtest0 bridge (deploy/testcluster/node-up.sh)")
    return words[words.index("inet") + 1].split("/")[0]


async def test_a_real_pod_of_a_network_pool_reaches_what_its_rules_allow_through_the_proxy(
    tmp_path: Path, kubeconfig: str, namespace: str, kube: KubeClient, upstream: int
) -> None:
    require_real_node()
    gateway = await asyncio.to_thread(_bridge_address)
    backend = {**REAL_NODE_BACKEND, "egress_proxy_service": PROXY}
    app = build_app(kube_settings(tmp_path, kubeconfig, namespace, backend=backend))
    await app.start()
    try:
        async with (
            _egress_proxy(kubeconfig, namespace, listen=gateway) as (port, dns),
            # Where NetworkPolicy is enforced, the pool's policy lets its Pods reach this.
            proxy_stand_in(kube, namespace, PROXY_LABELS, gateway),
            AsyncClient(app.address) as client,
        ):
            proxy_ip = await _proxy_service(kube, namespace, port, dns)
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
                other = _free_port(socket.SOCK_STREAM)
                denied = await sb.exec(
                    ["python3", "-c", FETCH, via, f"http://127.0.0.1:{other}/"], timeout=30
                )
                assert denied.stdout.startswith(b"403 sandboxd egress denied"), denied
            await client.delete_pool("net", force=True)
    finally:
        await app.stop(grace=1)
