"""One sandbox's egress proxy: HTTP by Host, HTTPS by CONNECT target and SNI, checked against its policy.

It listens on a socket made in the sandbox's egress namespace
(sandboxd.backends.network.netns) and connects upstream from sandboxd's own,
so the sandbox reaches nothing but what this code lets through. A denied
request is answered at once with 403 naming why (429 past the connection
bound), counted and logged; a ClientHello whose SNI is not the CONNECT host is
cut before any of it goes upstream.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from sandboxd.backends.network.policy import EgressPolicy, as_address, normalize_host
from sandboxd.backends.network.sni import NotTls, read_client_hello

log = logging.getLogger(__name__)

MAX_HEAD = 64 << 10
_CHUNK = 64 << 10
_HOP_HEADERS = {b"connection", b"keep-alive", b"proxy-connection", b"proxy-authorization", b"te", b"upgrade"}

Resolver = Callable[[str, int], Awaitable[list[str]]]


async def system_resolve(host: str, port: int) -> list[str]:
    """The host's own resolver (getaddrinfo on the loop's executor)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


@dataclass(frozen=True)
class EgressLimits:
    max_connections: int = 64
    """Proxied connections open at once; more are answered 429."""
    bytes_per_second: int = 64 << 20
    """Both directions together, all the sandbox's connections; 0 = unbounded."""
    connect_timeout: float = 10.0
    head_timeout: float = 30.0


@dataclass
class EgressStats:
    allowed: int = 0
    denied: int = 0
    active: int = 0
    bytes_out: int = 0
    """Sandbox to upstream."""
    bytes_in: int = 0
    recent_denials: deque[str] = field(default_factory=lambda: deque(maxlen=32))


class Denied(Exception):
    def __init__(self, reason: str, status: int = 403) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


class Bucket:
    """Token bucket over bytes (one second's worth of burst); a connection
    waits for its share rather than being cut."""

    def __init__(
        self,
        rate: int,
        now: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.rate = rate
        self._now = now
        self._sleep = sleep
        self.tokens = float(rate)
        self.stamp = now()

    async def take(self, n: int) -> None:
        if self.rate <= 0:
            return
        now = self._now()
        self.tokens = min(float(self.rate), self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        self.tokens -= n
        if self.tokens < 0:
            await self._sleep(-self.tokens / self.rate)


def _split_hostport(target: str, default: int | None) -> tuple[str, int]:
    if target.startswith("["):
        host, _, rest = target[1:].partition("]")
        port_s = rest[1:] if rest.startswith(":") else ""
    elif target.count(":") == 1:
        host, port_s = target.split(":")
    else:
        host, port_s = target, ""
    if not port_s:
        if default is None:
            raise Denied(f"CONNECT target {target!r} names no port", 400)
        return normalize_host(host), default
    if not port_s.isdigit() or not 1 <= int(port_s) <= 65535:
        raise Denied(f"bad port in {target!r}", 400)
    return normalize_host(host), int(port_s)


class EgressProxy:
    def __init__(
        self,
        sandbox_id: str,
        policy: EgressPolicy,
        *,
        resolve: Resolver = system_resolve,
        limits: EgressLimits | None = None,
    ) -> None:
        self.sandbox_id = sandbox_id
        self.policy = policy
        self.resolve = resolve
        self.limits = limits or EgressLimits()
        self.stats = EgressStats()
        self._bucket = Bucket(self.limits.bytes_per_second)
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self, sock: socket.socket) -> None:
        """Serve on ``sock``, a listening TCP socket (made in the egress namespace)."""
        sock.setblocking(False)
        self._server = await asyncio.start_server(self._accept, sock=sock, limit=MAX_HEAD)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    def set_policy(self, policy: EgressPolicy) -> None:
        """Serves every later connection under ``policy`` and cuts those still
        open, which were let through under the rules before (a lease's
        narrower rules hold from this moment, not from the next connection)."""
        self.policy = policy
        for task in list(self._tasks):
            task.cancel()

    def deny(self, reason: str) -> None:
        """Count and log one denied attempt (also called by the DNS responder)."""
        self.stats.denied += 1
        self.stats.recent_denials.append(reason)
        log.info("egress denied: sandbox %s: %s", self.sandbox_id, reason)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Serves one connection accepted elsewhere (a proxy shared by many
        sandboxes, each connection handed to its sandbox's EgressProxy)."""
        await self._accept(reader, writer)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # start_server runs each connection as a task of its own; close() cancels those still open.
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        # A connection cut by close() ends quietly (the streams callback logs any other end as an error).
        with contextlib.suppress(asyncio.CancelledError):
            await self._serve(reader, writer)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream: asyncio.StreamWriter | None = None
        counted = False
        try:
            if self.stats.active >= self.limits.max_connections:
                raise Denied(f"more than {self.limits.max_connections} connections open at once", 429)
            self.stats.active += 1
            counted = True
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.limits.head_timeout)
            up_reader, upstream, first = await self._open(head, reader, writer)
            self.stats.allowed += 1
            upstream.write(first)
            await asyncio.gather(
                self._pump(reader, upstream, out=True), self._pump(up_reader, writer, out=False)
            )
        except Denied as e:
            self.deny(e.reason)
            await self._refuse(writer, e)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, OSError):
            pass
        finally:
            if counted:
                self.stats.active -= 1
            for w in (upstream, writer):
                if w is not None:
                    w.close()
                    with contextlib.suppress(Exception):
                        await w.wait_closed()

    async def _refuse(self, writer: asyncio.StreamWriter, denied: Denied) -> None:
        if writer.is_closing():
            return
        words = {400: "Bad Request", 403: "Forbidden", 429: "Too Many Requests", 502: "Bad Gateway"}
        body = f"sandboxd egress denied: {denied.reason}\n".encode()
        header = (
            f"HTTP/1.1 {denied.status} {words.get(denied.status, 'Forbidden')}\r\n"
            "Content-Type: text/plain\r\nConnection: close\r\n"
            f"X-Sandboxd-Denied: {denied.reason}\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode("ascii", "replace")
        with contextlib.suppress(ConnectionError, OSError):
            writer.write(header + body)
            await writer.drain()

    async def _open(
        self, head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
        """Checks the request, connects upstream; returns the upstream streams and the bytes to send first."""
        lines = head[:-4].split(b"\r\n")
        parts = lines[0].decode("latin-1").split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise Denied("not an HTTP/1.x proxy request", 400)
        method, target, version = parts
        headers = [line.split(b":", 1) for line in lines[1:] if b":" in line]
        if method == "CONNECT":
            host, port = _split_hostport(target, None)
            self._allow(host, port)
            up_reader, up_writer = await self._connect(host, port)
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await writer.drain()
            try:
                hello, sni = await asyncio.wait_for(read_client_hello(reader), self.limits.head_timeout)
            except NotTls as e:
                up_writer.close()
                raise Denied(f"CONNECT {host}:{port}: {e} (only TLS passes a CONNECT tunnel)") from e
            if as_address(host) is None and sni != host:
                up_writer.close()
                # The tunnel is open, so this cannot be an HTTP answer: the client sees its handshake cut.
                self.deny(f"CONNECT {host}:{port}: TLS server name {sni or '(none)'!r} is not {host!r}")
                raise ConnectionResetError
            return up_reader, up_writer, hello
        url = urlsplit(target)
        hosts = [v.strip().decode("latin-1") for k, v in headers if k.strip().lower() == b"host"]
        if len(hosts) > 1:
            raise Denied("more than one Host header", 400)
        host_header = hosts[0] if hosts else ""
        if url.scheme:
            if url.scheme != "http" or not url.hostname:
                raise Denied(f"only http:// URLs go in the clear ({target[:80]!r}); https is CONNECT", 400)
            host, port = normalize_host(url.hostname), url.port or 80
            path = (url.path or "/") + (f"?{url.query}" if url.query else "")
            if host_header and _split_hostport(host_header, 80)[0] != host:
                raise Denied(f"Host header {host_header!r} does not match the request's host {host!r}")
        else:
            if not host_header:
                raise Denied("request names no host", 400)
            host, port = _split_hostport(host_header, 80)
            path = target
        self._allow(host, port)
        up_reader, up_writer = await self._connect(host, port)
        kept = b"".join(k + b":" + v + b"\r\n" for k, v in headers if k.strip().lower() not in _HOP_HEADERS)
        first = f"{method} {path} {version}\r\n".encode("latin-1") + kept + b"Connection: close\r\n\r\n"
        return up_reader, up_writer, first

    def _allow(self, host: str, port: int) -> None:
        if self.policy.rule_for(host, port) is None:
            if self.policy.lease and not self.policy.rules:
                raise Denied(f"no network rule allows {host}:{port} (the lease's rules: no network at all)")
            allowed = ", ".join(self.policy.describe())
            whose = "; the lease's rules" if self.policy.lease else ""
            raise Denied(f"no network rule allows {host}:{port} (allowed: {allowed}{whose})")

    async def _connect(self, host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        literal = as_address(host)
        if literal is not None:
            candidates = [literal]
        else:
            try:
                found = await asyncio.wait_for(self.resolve(host, port), self.limits.connect_timeout)
            except (OSError, TimeoutError) as e:
                raise Denied(f"{host} does not resolve ({e})", 502) from e
            candidates = [ipaddress.ip_address(a) for a in found]
            # A name allowed by a name rule may not lead to this host's own services (a
            # rebinding name's trick): only an address rule lets a sandbox reach those.
            candidates = [a for a in candidates if not _special(a) or self.policy.address_allowed(a, port)]
            if not candidates:
                raise Denied(
                    f"{host} resolves only to this host's own, loopback, link-local or unspecified addresses"
                )
        last: Exception | None = None
        for address in candidates:
            try:
                return await asyncio.wait_for(
                    asyncio.open_connection(str(address), port, limit=MAX_HEAD), self.limits.connect_timeout
                )
            except (OSError, TimeoutError) as e:
                last = e
        raise Denied(f"cannot connect to {host}:{port} ({last})", 502)

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, *, out: bool) -> None:
        try:
            while chunk := await src.read(_CHUNK):
                await self._bucket.take(len(chunk))
                dst.write(chunk)
                await dst.drain()
                if out:
                    self.stats.bytes_out += len(chunk)
                else:
                    self.stats.bytes_in += len(chunk)
            if dst.can_write_eof():
                dst.write_eof()
        except (ConnectionError, OSError):
            dst.close()


def _special(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if address.is_loopback or address.is_link_local or address.is_unspecified or address.is_multicast:
        return True
    return _is_local(address)


def _is_local(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Whether ``address`` is one of this host's own (in sandboxd's namespace): only those can be bound."""
    family = socket.AF_INET if address.version == 4 else socket.AF_INET6
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((str(address), 0))
        except OSError:
            return False
    return True
