"""A sandbox's egress as one object: its link, its proxy and its resolver, opened and closed together."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from sandboxd.backends.network import netns
from sandboxd.backends.network.dns import serve_dns
from sandboxd.backends.network.policy import EgressPolicy
from sandboxd.backends.network.proxy import EgressLimits, EgressProxy, EgressStats, Resolver, system_resolve
from sandboxd.errors import FailedPrecondition

PROXY_URL = f"http://{netns.EGRESS_ADDRESS}:{netns.PROXY_PORT}"


def command_env() -> dict[str, str]:
    """What a sandbox with a policy runs its commands with, so that pip, npm, git
    and curl use the proxy unchanged (both spellings: tools read one or the other)."""
    env = {
        "NO_PROXY": "localhost,127.0.0.1,::1",
        "npm_config_proxy": PROXY_URL,
        "npm_config_https_proxy": PROXY_URL,
    }
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        env[var] = PROXY_URL
        env[var.lower()] = PROXY_URL
    env["no_proxy"] = env["NO_PROXY"]
    return env


@dataclass
class SandboxEgress:
    sandbox_id: str
    link: netns.Link
    proxy: EgressProxy
    dns: asyncio.DatagramTransport

    @property
    def stats(self) -> EgressStats:
        return self.proxy.stats

    async def close(self) -> None:
        self.dns.close()
        await self.proxy.close()
        self.link.proxy.close()
        await asyncio.to_thread(netns.detach, self.link.netns)


async def open_egress(
    sandbox_id: str,
    target: str,
    policy: EgressPolicy,
    *,
    resolve: Resolver = system_resolve,
    limits: EgressLimits | None = None,
) -> SandboxEgress:
    """Links the sandbox's namespace (``target``: a pid in it, or a namespace name)
    and serves its policy there. FAILED_PRECONDITION when this host cannot."""
    if not policy.enabled:
        raise FailedPrecondition("a network policy with no rules is no network: nothing to open")
    link = await asyncio.to_thread(netns.attach, sandbox_id, target)
    proxy = EgressProxy(sandbox_id, policy, resolve=resolve, limits=limits)
    try:
        await proxy.start(link.proxy)
        transport = await serve_dns(link.dns, policy, netns.EGRESS_ADDRESS, proxy.deny)
    except BaseException:
        await proxy.close()
        link.proxy.close()
        link.dns.close()
        await asyncio.to_thread(netns.detach, link.netns)
        raise
    return SandboxEgress(sandbox_id, link, proxy, transport)
