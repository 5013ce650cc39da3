"""What a sandbox's own side of its egress answers: the proxy's status line
for a raw request and the resolver's answer code for a name.

Blocking socket calls, made on a thread inside the sandbox's network
namespace (sandboxd.backends.network.netns.in_netns), where the proxy and
resolver listen on the link's egress address.
"""

from __future__ import annotations

import socket

from sandboxd.backends.network import netns

NXDOMAIN = 3


def proxy_status(request: bytes, timeout: float = 5.0) -> int:
    """The status code of the proxy's (or upstream's, passed through) first
    answer line to ``request``; 0 when the connection ends without one."""
    with socket.create_connection((netns.EGRESS_ADDRESS, netns.PROXY_PORT), timeout=timeout) as s:
        s.sendall(request)
        head = b""
        while b"\r\n" not in head and len(head) < 4096:
            try:
                chunk = s.recv(4096)
            except ConnectionError:
                return 0
            if not chunk:
                break
            head += chunk
    parts = head.split(b"\r\n", 1)[0].split(b" ")
    return int(parts[1]) if len(parts) >= 2 and parts[0].startswith(b"HTTP/1.") and parts[1].isdigit() else 0


def proxy_says(request: bytes, status: int) -> bool:
    return proxy_status(request) == status


def dns_query(name: str) -> bytes:
    """An A query for ``name``, recursion desired."""
    labels = b"".join(bytes([len(label)]) + label.encode() for label in name.split("."))
    return b"\x00\x07\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00" + labels + b"\x00\x00\x01\x00\x01"


def dns_rcode(name: str, timeout: float = 5.0) -> int:
    """The response code the sandbox's resolver gives an A query for ``name`` (3: NXDOMAIN)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(timeout)
        s.sendto(dns_query(name), (netns.EGRESS_ADDRESS, 53))
        return s.recv(512)[3] & 0x0F
