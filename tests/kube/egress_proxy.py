"""The egress proxy as the network tests run it: ``sandboxd egress-proxy`` as
a process on this host (the test cluster has no kube-proxy to carry its
Service's address), the chart's Service for it made by hand, an upstream on
this host's loopback for it to reach, and clients that ask it for HTTP and
DNS as a sandbox would."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from sandboxd.backends.kubernetes.client import KubeClient
from sandboxd.backends.kubernetes.egress import ANNOTATION_PROXY_ACKS
from tests.kube.conftest import create_service, poll

__all__ = [
    "FETCH",
    "PROXY",
    "PROXY_LABELS",
    "RULES",
    "bridge_address",
    "free_port",
    "host_proxy",
    "proxy_get",
    "proxy_resolve",
    "proxy_service",
    "upstream",
]

PROXY = "egress-test"
PROXY_LABELS = {
    "app.kubernetes.io/name": "sandboxd-egress-proxy",
    "app.kubernetes.io/component": "egress-proxy",
}
RULES = ["pypi.internal", "*.corp.example:443", "10.1.0.0/16:22"]

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


async def proxy_service(
    kube: KubeClient, namespace: str, port: int = 3128, dns_port: int = 5353, *, acks: bool = False
) -> str:
    """The chart's egress-proxy Service (its shape), made by hand, its Pods'
    ports ``port`` and ``dns_port``, its annotation saying (with ``acks``)
    that its proxies acknowledge changes of a Pod's rules; its cluster IP."""
    ports = [
        {"name": "proxy", "port": 3128, "targetPort": port, "protocol": "TCP"},
        {"name": "dns", "port": 53, "targetPort": dns_port, "protocol": "UDP"},
    ]
    annotations = {ANNOTATION_PROXY_ACKS: "true"} if acks else None
    return await create_service(kube, namespace, PROXY, PROXY_LABELS, ports, annotations)


def free_port(kind: int) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.asynccontextmanager
async def host_proxy(
    kubeconfig: str,
    namespace: str,
    *,
    listen: str = "127.0.0.1",
    port: int = 0,
    dns_port: int = 0,
    metrics_port: int = 0,
    ack_as: str = "",
) -> AsyncIterator[tuple[int, int]]:
    """``sandboxd egress-proxy`` as the chart runs it, on this host at
    ``listen``, acknowledging as the Pod of uid ``ack_as`` where given; its
    proxy and DNS ports (free ones unless given)."""
    port, dns_port = port or free_port(socket.SOCK_STREAM), dns_port or free_port(socket.SOCK_DGRAM)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sandboxd.cli", "egress-proxy", f"--namespace={namespace}",
        f"--listen={listen}", f"--port={port}", f"--dns-port={dns_port}", "--dns-answer=10.96.0.53",
        f"--kubeconfig={kubeconfig}", f"--metrics-port={metrics_port}", f"--ack-as={ack_as}",
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
        yield port, dns_port
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 10)


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
    """An HTTP server on this host's loopback: what a network pool's rules allow; its port."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


async def proxy_get(port: int, target: str) -> bytes:
    """A plain-HTTP GET of ``target`` through the proxy at ``port``: the whole answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET http://{target}/ HTTP/1.1\r\nHost: {target}\r\nConnection: close\r\n\r\n".encode())
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return data


def _query(name: str) -> bytes:
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.split("."))
    return struct.pack("!HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0) + labels + b"\0" + struct.pack("!HH", 1, 1)


async def proxy_resolve(port: int, name: str) -> bytes:
    """The proxy's resolver at ``port`` asked for the A record of ``name``: its answer."""
    loop = asyncio.get_running_loop()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.setblocking(False)
        await loop.sock_connect(s, ("127.0.0.1", port))
        await loop.sock_sendall(s, _query(name))
        return await asyncio.wait_for(loop.sock_recv(s, 512), 10)


def bridge_address() -> str:
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
