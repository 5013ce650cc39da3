"""Run in a sandbox's network namespace: tries every way around the egress policy, prints what happened.

Usage: python3 egress_probe.py UPSTREAM_ADDRESS. Prints one JSON object, probe name -> outcome.
"""

from __future__ import annotations

import errno
import json
import socket
import ssl
import struct
import sys

EGRESS = "169.254.77.1"
PROXY = (EGRESS, 3128)


def outcome(e: BaseException) -> str:
    if isinstance(e, socket.timeout | TimeoutError):
        return "timeout"
    if isinstance(e, OSError) and e.errno is not None:
        return errno.errorcode.get(e.errno, str(e.errno))
    return type(e).__name__


def tcp(address: tuple[str, int]) -> str:
    try:
        with socket.create_connection(address, timeout=5):
            return "connected"
    except OSError as e:
        return outcome(e)


def udp(address: tuple[str, int], payload: bytes) -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(5)
        try:
            s.connect(address)
            s.send(payload)
            return "reply:" + s.recv(512)[:4].hex()
        except OSError as e:
            return outcome(e)


def dns_query(name: str) -> bytes:
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
    return struct.pack("!HHHHHH", 7, 0x0100, 1, 0, 0, 0) + labels + struct.pack("!HH", 1, 1)


def dns(name: str) -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(5)
        try:
            s.sendto(dns_query(name), (EGRESS, 53))
            reply = s.recv(512)
        except OSError as e:
            return outcome(e)
    rcode = reply[3] & 0x0F
    if rcode:
        return f"rcode:{rcode}"
    return "A:" + ".".join(str(b) for b in reply[-4:])


def via_proxy(request: bytes) -> str:
    try:
        with socket.create_connection(PROXY, timeout=5) as s:
            s.sendall(request)
            data = s.recv(4096)
    except OSError as e:
        return outcome(e)
    return data.split(b"\r\n", 1)[0].decode() if data else "closed"


def tunnel_tls(host: str, sni: str) -> str:
    try:
        with socket.create_connection(PROXY, timeout=5) as s:
            s.sendall(f"CONNECT {host}:443 HTTP/1.1\r\nHost: {host}:443\r\n\r\n".encode())
            head = s.recv(4096)
            if not head.startswith(b"HTTP/1.1 200"):
                return head.split(b"\r\n", 1)[0].decode()
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
            with context.wrap_socket(s, server_hostname=sni) as tls:
                tls.sendall(b"GET / HTTP/1.1\r\nHost: " + host.encode() + b"\r\n\r\n")
                return "tls:" + tls.recv(64).split(b"\r\n", 1)[0].decode()
    except (OSError, ssl.SSLError) as e:
        return "cut:" + type(e).__name__


def main() -> None:
    up = sys.argv[1]
    results = {
        "egress_other_port": tcp((EGRESS, 22)),
        "raw_ip_tcp": tcp((up, 80)),
        "proxy_less_https": tcp((up, 443)),
        "udp_elsewhere": udp((up, 9999), b"x"),
        "dns_other_resolver": udp((up, 53), dns_query("pypi.test")),
        "udp_egress_other_port": udp((EGRESS, 9999), b"x"),
        "dns_denied": dns("evil.test"),
        "dns_allowed": dns("pypi.test"),
        "proxy_other_port": via_proxy(b"GET http://pypi.test:8080/ HTTP/1.1\r\nHost: pypi.test:8080\r\n\r\n"),
        "proxy_raw_ip": via_proxy(f"GET http://{up}/ HTTP/1.1\r\nHost: {up}\r\n\r\n".encode()),
        "proxy_host_mismatch": via_proxy(b"GET http://pypi.test/ HTTP/1.1\r\nHost: evil.test\r\n\r\n"),
        "proxy_two_hosts": via_proxy(b"GET / HTTP/1.1\r\nHost: pypi.test\r\nHost: evil.test\r\n\r\n"),
        "connect_denied": via_proxy(b"CONNECT evil.test:443 HTTP/1.1\r\nHost: evil.test:443\r\n\r\n"),
        "connect_other_port": via_proxy(b"CONNECT secure.test:8443 HTTP/1.1\r\nHost: secure.test\r\n\r\n"),
        "name_to_loopback": via_proxy(b"GET http://loop.test/ HTTP/1.1\r\nHost: loop.test\r\n\r\n"),
        "name_to_host": via_proxy(b"GET http://hostlocal.test/ HTTP/1.1\r\nHost: hostlocal.test\r\n\r\n"),
        "sni_mismatch": tunnel_tls("secure.test", "other.test"),
        "sni_match": tunnel_tls("secure.test", "secure.test"),
    }
    print(json.dumps(results))


if __name__ == "__main__":
    main()
