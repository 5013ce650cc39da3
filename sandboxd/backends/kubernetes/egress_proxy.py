"""The egress proxy the chart runs for sandbox Pods (``sandboxd egress-proxy``).

One proxy serves every Pod of pools with network rules: each connection
(and each DNS query) is matched to its sandbox by its source address, the
Pod its watch of the API server says has that address (egress_pods), and
served by that sandbox's own EgressProxy (sandboxd.backends.network.proxy:
HTTP by Host, HTTPS by CONNECT target and SNI, its bounds and counters)
under the rules on the Pod (its pool's, or its lease's narrower ones),
which only the control plane writes. A change of a Pod's rules is put on
its EgressProxy as the watch brings it, cutting the connections opened
under the rules before. A source that is no sandbox Pod with rules is
refused at once (403), and its DNS queries answered NXDOMAIN. The pools'
NetworkPolicies let sandbox Pods reach nothing but this proxy; that a Pod
cannot use another's address is the CNI's part (as it is for
NetworkPolicy itself).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from opentelemetry.metrics import Meter, Observation

from sandboxd.backends.kubernetes.egress_pods import NO_RULES, PodPolicies, SandboxOf
from sandboxd.backends.network.dns import answer
from sandboxd.backends.network.policy import EgressPolicy
from sandboxd.backends.network.proxy import EgressLimits, EgressProxy, Resolver, system_resolve

__all__ = ["PodPolicies", "SandboxOf", "SharedEgress", "register_proxy_meters"]

log = logging.getLogger(__name__)

_MAX_PROXIES = 4096
# How long a refused source's request is waited for before the answer.
_REFUSAL_READ_SECONDS = 2.0


class SharedEgress:
    """The proxy and resolver of every sandbox Pod with rules, on one address."""

    def __init__(
        self,
        policies: PodPolicies,
        *,
        dns_answer: str,
        resolve: Resolver = system_resolve,
        limits: EgressLimits | None = None,
    ) -> None:
        """``dns_answer`` is the address allowed names resolve to (the
        proxy's Service: a proxy-less connection to one meets no listener)."""
        self._policies = policies
        self._dns_answer = dns_answer
        self._resolve = resolve
        self._limits = limits or EgressLimits()
        self._proxies: dict[str, EgressProxy] = {}
        self._pools: dict[str, str] = {}
        self.refused_sources = 0
        """Connections and queries from addresses that are no sandbox Pod with rules."""
        self._server: asyncio.Server | None = None
        self._dns: asyncio.DatagramTransport | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        policies.on_rules = self.rules_changed

    def rules_changed(self, uid: str, policy: EgressPolicy) -> None:
        """The Pod ``uid``'s rules are ``policy`` from now on (NO_RULES: it
        has none, or is gone): its connections opened before are cut."""
        proxy = self._proxies.get(uid)
        if proxy is not None and proxy.policy != policy:
            proxy.set_policy(policy)

    def proxy_of(self, sandbox: SandboxOf) -> EgressProxy:
        """The sandbox's own EgressProxy (its counters and bounds), made on first use."""
        proxy = self._proxies.get(sandbox.uid)
        if proxy is None and len(self._proxies) >= _MAX_PROXIES:
            # Pods come and go: forget the idle sandboxes' proxies (their counters with them).
            self._proxies = {uid: p for uid, p in self._proxies.items() if p.stats.active}
            self._pools = {uid: self._pools.get(uid, "") for uid in self._proxies}
        self._pools[sandbox.uid] = sandbox.pool
        if proxy is None:
            proxy = EgressProxy(
                sandbox.sandbox_id, sandbox.policy, resolve=self._resolve, limits=self._limits
            )
            self._proxies[sandbox.uid] = proxy
        elif proxy.policy != sandbox.policy:
            proxy.set_policy(sandbox.policy)
        return proxy

    def counts(self) -> list[tuple[str, str, int, int]]:
        """(sandbox id, pool, allowed, denied) of each sandbox Pod served so far
        (bounded: idle ones are forgotten past _MAX_PROXIES)."""
        return sorted(
            (p.sandbox_id, self._pools.get(uid, ""), p.stats.allowed, p.stats.denied)
            for uid, p in self._proxies.items()
        )

    async def start(self, host: str, port: int, dns_port: int) -> tuple[int, int]:
        """Listens (TCP ``port``, UDP ``dns_port``; 0 = any); the ports bound."""
        self._server = await asyncio.start_server(self._accept, host, port)
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(lambda: _Dns(self), local_addr=(host, dns_port))
        self._dns = transport
        tcp = self._server.sockets[0].getsockname()[1]
        udp = self._dns.get_extra_info("sockname")[1]
        return int(tcp), int(udp)

    async def serve_forever(self) -> None:
        """Until cancelled."""
        assert self._server is not None
        await self._server.serve_forever()

    async def close(self) -> None:
        if self._dns is not None:
            self._dns.close()
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for proxy in list(self._proxies.values()):
            await proxy.close()
        if self._server is not None:
            await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        address = str(peer[0]) if peer else ""
        sandbox = self._policies.lookup(address) if address else None
        if sandbox is None:
            self.refused_sources += 1
            log.info("egress denied: %s is no sandbox Pod with a network policy", address)
            body = f"sandboxd egress denied: {address} is no sandbox Pod with a network policy\n".encode()
            with contextlib.suppress(
                OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError
            ):
                # The request read first: a socket closed on unread bytes is
                # reset, and the client would see that, not the answer.
                await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _REFUSAL_READ_SECONDS)
            with contextlib.suppress(OSError):
                writer.write(
                    b"HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nConnection: close\r\n"
                    + f"Content-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                await writer.drain()
            writer.close()
            return
        await self.proxy_of(sandbox).handle(reader, writer)

    def query(self, data: bytes, addr: tuple[str, int]) -> None:
        """One DNS query from ``addr``: answered under its sandbox's rules."""
        task = asyncio.ensure_future(self._answer(data, addr))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, data: bytes, addr: tuple[str, int]) -> None:
        sandbox = self._policies.lookup(addr[0])
        policy = sandbox.policy if sandbox is not None else NO_RULES
        if sandbox is None:
            self.refused_sources += 1
        reply, name = answer(data, policy, self._dns_answer)
        if name and not policy.names_allowed(name) and sandbox is not None:
            self.proxy_of(sandbox).deny(f"DNS query for {name!r}: no network rule names it")
        if reply and self._dns is not None:
            self._dns.sendto(reply, addr)


class _Dns(asyncio.DatagramProtocol):
    def __init__(self, egress: SharedEgress) -> None:
        self._egress = egress

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self._egress.query(data, addr)


def register_proxy_meters(meter: Meter, egress: SharedEgress) -> None:
    """The proxy's counters, named as the control plane's on Docker
    (sandboxd.core.egress_meters): ``sandboxd_egress_allowed_total`` and
    ``sandboxd_egress_denied_total`` per {sandbox, pool}, and
    ``sandboxd_egress_refused_sources_total`` (no sandbox Pod with rules)."""

    def counts(denied: bool) -> list[Observation]:
        return [
            Observation(no if denied else yes, {"sandbox": sandbox, "pool": pool})
            for sandbox, pool, yes, no in egress.counts()
        ]

    meter.create_observable_counter(
        "sandboxd_egress_denied_total",
        callbacks=[lambda options: counts(True)],
        description="Denied egress attempts of each sandbox Pod with rules (proxy, resolver, TLS name).",
    )
    meter.create_observable_counter(
        "sandboxd_egress_allowed_total",
        callbacks=[lambda options: counts(False)],
        description="Egress connections let through, per sandbox Pod with rules.",
    )
    meter.create_observable_counter(
        "sandboxd_egress_refused_sources_total",
        callbacks=[lambda options: [Observation(egress.refused_sources)]],
        description="Connections and DNS queries from addresses that are no sandbox Pod with rules.",
    )
