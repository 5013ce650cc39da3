"""NetworkPolicy enforced on the wire, on the real kubelet node: kube-router's
firewall (deploy/testcluster/netpol-up.sh) turns the namespace's deny-all and
a pool's policy into iptables rules and ipsets, and what they do not allow
never arrives. A Pod of a network pool reaches the egress proxy, and through
it what its rules allow, but neither a TCP nor a UDP listener on the proxy's
own host address; a Pod of a pool without network reaches nothing, not even
the proxy. With the policies deleted the same Pods reach those listeners, at
their own addresses: the drops were the policies' doing, not the set-up's.
Every packet stays on this host (the node's bridge address and loopback)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sandboxd.app import build_app
from sandboxd.backends.kubernetes.client import KubeClient
from sandboxd.backends.kubernetes.egress import pool_policy_name
from sandboxd.backends.kubernetes.podspec import NETWORK_POLICY_NAME
from sandboxd.client import AsyncClient, Sandbox
from sandboxd.images.build import default_image_tag
from tests.kube.conftest import REAL_NODE_BACKEND, kube_settings, pods, poll, require_netpol
from tests.kube.egress_proxy import (
    FETCH,
    PROXY,
    PROXY_LABELS,
    bridge_address,
    host_proxy,
    proxy_service,
    upstream,
)
from tests.kube.proxy_pod import proxy_stand_in

pytestmark = [pytest.mark.kube, pytest.mark.timeout(300)]

__all__ = ["upstream"]  # the fixture

# kube-router lets Pods reach the node's own addresses on the NodePort range
# whatever the policies (--service-node-port-range, 30000-32767 by default).
NODE_PORTS = range(30000, 32768)

# In a Pod: UDP datagrams of argv[4] to argv[1]:argv[3], then a TCP connection
# to argv[1]:argv[2]; prints "connected <greeting>" or "failed <error>".
PROBE = """
import socket, sys
host, tcp, udp, tag = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
    for _ in range(3):
        try:
            u.sendto(tag.encode(), (host, udp))
        except OSError:
            pass
try:
    with socket.create_connection((host, tcp), timeout=5) as s:
        print("connected", s.recv(64).decode().strip())
except OSError as e:
    print("failed", type(e).__name__, e)
"""


@dataclass
class _Heard:
    """What reached the listeners: TCP peers accepted, UDP datagrams with their source."""

    tcp_port: int = 0
    udp_port: int = 0
    accepted: list[str] = field(default_factory=list)
    datagrams: list[tuple[bytes, str]] = field(default_factory=list)


class _Datagrams(asyncio.DatagramProtocol):
    def __init__(self, heard: _Heard) -> None:
        self._heard = heard

    def datagram_received(self, data: bytes, addr: tuple[str | object, ...]) -> None:
        self._heard.datagrams.append((data, str(addr[0])))


@contextlib.asynccontextmanager
async def _listeners(address: str) -> AsyncIterator[_Heard]:
    """A TCP and a UDP listener at ``address`` (outside the NodePort range), recording who got through."""
    heard = _Heard()

    async def greet(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        heard.accepted.append(str(writer.get_extra_info("peername")[0]))
        writer.write(b"hello\n")
        await writer.drain()
        writer.close()

    loop = asyncio.get_running_loop()
    servers: list[asyncio.Server] = []
    transports: list[asyncio.DatagramTransport] = []
    try:
        while not heard.tcp_port or heard.tcp_port in NODE_PORTS:
            servers.append(await asyncio.start_server(greet, address, 0))
            heard.tcp_port = servers[-1].sockets[0].getsockname()[1]
        while not heard.udp_port or heard.udp_port in NODE_PORTS:
            transport, _ = await loop.create_datagram_endpoint(
                lambda: _Datagrams(heard), local_addr=(address, 0)
            )
            transports.append(transport)
            heard.udp_port = transport.get_extra_info("sockname")[1]
        yield heard
    finally:
        for transport in transports:
            transport.close()
        for server in servers:
            server.close()
            await server.wait_closed()


def _filter_table() -> str:
    return subprocess.run(
        ["iptables-save", "-t", "filter"], capture_output=True, text=True, timeout=30, check=True
    ).stdout


def _runs_through(table: str, namespace: str, pod: str, policies: list[str]) -> bool:
    """Whether kube-router's firewall chain of ``pod`` runs its packets through each of ``policies``."""
    lines = table.splitlines()
    jump = f"POD name:{pod} namespace: {namespace} "
    chains = {
        line.rsplit("-j ", 1)[1].strip() for line in lines if jump in line and "-j KUBE-POD-FW-" in line
    }
    rules = [line for line in lines for chain in chains if line.startswith(f"-A {chain} ")]
    return bool(chains) and all(any(f'run through nw policy {p}"' in r for r in rules) for p in policies)


async def _probe(sb: Sandbox, host: str, tcp: int, udp: int, tag: str) -> str:
    result = await sb.exec(["python3", "-c", PROBE, host, str(tcp), str(udp), tag], timeout=30)
    assert result.ok, result
    return result.text.strip()


async def test_policies_drop_what_they_do_not_allow_and_the_same_pods_get_through_without_them(
    tmp_path: Path, kubeconfig: str, namespace: str, kube: KubeClient, upstream: int
) -> None:
    require_netpol()
    gateway = await asyncio.to_thread(bridge_address)
    backend = {**REAL_NODE_BACKEND, "egress_proxy_service": PROXY}
    app = build_app(kube_settings(tmp_path, kubeconfig, namespace, backend=backend))
    instance = app.settings.instance_id
    await app.start()
    try:
        async with (
            host_proxy(kubeconfig, namespace, listen=gateway) as (port, dns),
            proxy_stand_in(kube, namespace, PROXY_LABELS, gateway),
            _listeners(gateway) as heard,
            AsyncClient(app.address) as client,
        ):
            await proxy_service(kube, namespace, port, dns)
            image = os.environ.get("SANDBOXD_KUBE_IMAGE", "") or default_image_tag()
            await client.create_pool("net", image, min_ready=0, max_size=1, network=[f"127.0.0.1:{upstream}"])
            await client.create_pool("closed", image, min_ready=0, max_size=1)
            async with (
                client.acquire("net", timeout=120) as net,
                client.acquire("closed", timeout=120) as closed,
            ):
                (net_pod,) = await pods(kube, namespace, f"sandboxd.sandbox={net.id}")
                (closed_pod,) = await pods(kube, namespace, f"sandboxd.sandbox={closed.id}")
                names = {
                    sb.id: str(p["metadata"]["name"]) for sb, p in ((net, net_pod), (closed, closed_pod))
                }
                addresses = {
                    sb.id: str(p["status"]["podIP"]) for sb, p in ((net, net_pod), (closed, closed_pod))
                }
                expected = {
                    names[net.id]: [NETWORK_POLICY_NAME, pool_policy_name(instance, "net")],
                    names[closed.id]: [NETWORK_POLICY_NAME],
                }

                async def programmed() -> bool:
                    table = await asyncio.to_thread(_filter_table)
                    return all(_runs_through(table, namespace, pod, ps) for pod, ps in expected.items())

                await poll(programmed, timeout=90, what="kube-router to program both Pods' policies")

                # The network pool's Pod: the proxy, and through it what its rules allow ...
                via = f"http://{gateway}:{port}"
                ok = await net.exec(
                    ["python3", "-c", FETCH, via, f"http://127.0.0.1:{upstream}/"], timeout=30
                )
                assert ok.ok and ok.stdout == b"upstream ok\n", ok
                # ... but no other port of the proxy's own address, TCP or UDP.
                seen = await _probe(net, gateway, heard.tcp_port, heard.udp_port, "net-denied")
                assert seen.startswith("failed"), seen
                # The pool without network: nothing, not the listeners, not the proxy.
                seen = await _probe(closed, gateway, heard.tcp_port, heard.udp_port, "closed-denied")
                assert seen.startswith("failed"), seen
                seen = await _probe(closed, gateway, port, dns, "closed-proxy")
                assert seen.startswith("failed"), seen
                assert heard.accepted == [], heard

                # Without the policies, the same Pods get through to the same listeners.
                for name in (NETWORK_POLICY_NAME, pool_policy_name(instance, "net")):
                    await kube.request(
                        "DELETE", f"/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies/{name}"
                    )
                for sb in (net, closed):
                    tag = f"open-{sb.id}"

                    async def through(sb: Sandbox = sb, tag: str = tag) -> bool:
                        seen = await _probe(sb, gateway, heard.tcp_port, heard.udp_port, tag)
                        return seen == "connected hello" and any(
                            d == tag.encode() for d, _ in heard.datagrams
                        )

                    await poll(through, timeout=90, what=f"{sb.id} to get through once no policy selects it")
                    assert addresses[sb.id] in heard.accepted, (addresses, heard)
                    assert (tag.encode(), addresses[sb.id]) in heard.datagrams, (addresses, heard)
                # The datagrams sent under the policies, long before these, never arrived.
                assert not {d for d, _ in heard.datagrams} & {b"net-denied", b"closed-denied"}, heard
            await client.delete_pool("net", force=True)
            await client.delete_pool("closed", force=True)
    finally:
        await app.stop(grace=1)
