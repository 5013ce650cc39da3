"""The sandbox's resolver: allowed names resolve to the egress proxy's address, others do not exist.

Answering with the proxy's address rather than the name's own means that even
a program ignoring the proxy settings ends at the proxy, never elsewhere.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import struct
from collections.abc import Callable
from typing import cast

from sandboxd.backends.network.policy import EgressPolicy

_A = 1
_IN = 1
_NOERROR, _FORMERR, _NXDOMAIN = 0, 1, 3
TTL = 30


def _question(packet: bytes) -> tuple[str, int, int, int]:
    """(name, qtype, qclass, end of question) of a query with one question; ValueError otherwise."""
    _, flags, qdcount = struct.unpack("!HHH", packet[:6])
    if flags & 0x8000 or qdcount != 1:
        raise ValueError("not a one-question query")
    labels: list[str] = []
    pos = 12
    while True:
        size = packet[pos]
        if size & 0xC0:
            raise ValueError("compressed name in a question")
        pos += 1
        if size == 0:
            break
        labels.append(packet[pos : pos + size].decode("ascii").lower())
        pos += size
    qtype, qclass = struct.unpack("!HH", packet[pos : pos + 4])
    return ".".join(labels), qtype, qclass, pos + 4


def answer(packet: bytes, policy: EgressPolicy, address: str) -> tuple[bytes, str]:
    """The reply to one query and the name it asked ('' when malformed)."""
    try:
        name, qtype, qclass, end = _question(packet)
    except (ValueError, IndexError, struct.error, UnicodeDecodeError):
        if len(packet) < 12:
            return b"", ""
        return packet[:2] + struct.pack("!HHHHH", 0x8180 | _FORMERR, 0, 0, 0, 0), ""
    allowed = policy.names_allowed(name)
    rcode = _NOERROR if allowed else _NXDOMAIN
    records = b""
    count = 0
    if allowed and qtype == _A and qclass == _IN:
        records = struct.pack("!HHHIH", 0xC00C, _A, _IN, TTL, 4) + ipaddress.IPv4Address(address).packed
        count = 1
    # QR, RD copied, RA; one question echoed.
    flags = 0x8180 | (struct.unpack("!H", packet[2:4])[0] & 0x0100) | rcode
    header = packet[:2] + struct.pack("!HHHHH", flags, 1, count, 0, 0)
    return header + packet[12:end] + records, name


class DnsResponder(asyncio.DatagramProtocol):
    def __init__(self, policy: EgressPolicy, address: str, on_denied: Callable[[str], None]) -> None:
        self.policy = policy
        self.address = address
        self.on_denied = on_denied
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        reply, name = answer(data, self.policy, self.address)
        if name and not self.policy.names_allowed(name):
            self.on_denied(f"DNS query for {name!r}: no network rule names it")
        if reply and self.transport is not None:
            self.transport.sendto(reply, addr)


async def serve_dns(
    sock: socket.socket, policy: EgressPolicy, address: str, on_denied: Callable[[str], None]
) -> asyncio.DatagramTransport:
    sock.setblocking(False)
    transport, _ = await asyncio.get_running_loop().create_datagram_endpoint(
        lambda: DnsResponder(policy, address, on_denied), sock=sock
    )
    return transport
