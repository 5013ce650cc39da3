"""A sandbox's egress as one object: its link, its proxy and its resolver, opened and closed together."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

from sandboxd.backends.network import netns
from sandboxd.backends.network.dns import DnsResponder, serve_dns
from sandboxd.backends.network.gateway import Closer, ModelGateway
from sandboxd.backends.network.policy import EgressPolicy
from sandboxd.backends.network.proxy import EgressLimits, EgressProxy, EgressStats, Resolver, system_resolve
from sandboxd.errors import FailedPrecondition

PROXY_URL = f"http://{netns.EGRESS_ADDRESS}:{netns.PROXY_PORT}"
MODEL_URL = f"http://{netns.EGRESS_ADDRESS}:{netns.MODEL_PORT}/v1"
"""Where a sandbox with the model route sees the run's model (OPENAI_BASE_URL)."""


def command_env() -> dict[str, str]:
    """What a sandbox with a policy or the model route runs its commands with, so
    that pip, npm, git and curl use the proxy unchanged (both spellings: tools
    read one or the other) and OpenAI clients find the gateway, which is
    reached straight, not through the proxy."""
    env = {
        "NO_PROXY": f"localhost,127.0.0.1,::1,{netns.EGRESS_ADDRESS}",
        "npm_config_proxy": PROXY_URL,
        "npm_config_https_proxy": PROXY_URL,
    }
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        env[var] = PROXY_URL
        env[var.lower()] = PROXY_URL
    env["no_proxy"] = env["NO_PROXY"]
    return env


def model_env(key: str, url: str = "") -> dict[str, str]:
    """The model route's settings for one command: the gateway (at ``url``,
    "" = the in-sandbox MODEL_URL) and the lease's key."""
    url = url or MODEL_URL
    return {"OPENAI_BASE_URL": url, "OPENAI_API_BASE": url, "OPENAI_API_KEY": key}


@dataclass
class SandboxEgress:
    sandbox_id: str
    link: netns.Link
    proxy: EgressProxy
    dns: asyncio.DatagramTransport
    model: Closer | None = None
    """Stops the model gateway's listener (None: no model route)."""
    base: EgressPolicy = field(default_factory=EgressPolicy)
    """The sandbox's own rules (its pool's), which a lease may narrow for a while."""

    @property
    def stats(self) -> EgressStats:
        return self.proxy.stats

    @property
    def policy(self) -> EgressPolicy:
        """The rules in force now (a lease's narrower ones, or those it was opened with)."""
        return self.proxy.policy

    def set_policy(self, policy: EgressPolicy) -> None:
        """Proxy and resolver serve ``policy`` from now on; connections opened
        before are cut (sandboxd.backends.network.proxy.EgressProxy.set_policy)."""
        responder = self.dns.get_protocol()
        if not isinstance(responder, DnsResponder):
            raise FailedPrecondition(f"sandbox {self.sandbox_id}: its resolver is not sandboxd's own")
        responder.policy = policy
        self.proxy.set_policy(policy)

    async def close(self) -> None:
        self.dns.close()
        if self.model is not None:
            await self.model()
        await self.proxy.close()
        self.link.close()
        await asyncio.to_thread(netns.detach, self.link.netns)


async def open_egress(
    sandbox_id: str,
    target: str,
    policy: EgressPolicy,
    *,
    resolve: Resolver = system_resolve,
    limits: EgressLimits | None = None,
    model: ModelGateway | None = None,
    instance: str = "",
) -> SandboxEgress:
    """Links the sandbox's namespace (``target``: a pid in it, or a namespace name)
    and serves its policy there, and the model route with ``model`` (then a
    policy without rules is fine: the model is all the sandbox reaches; so is
    a lease's that allows nothing, which it may widen back later).
    FAILED_PRECONDITION when this host cannot."""
    if not policy.enabled and not policy.lease and model is None:
        raise FailedPrecondition("a network policy with no rules is no network: nothing to open")
    attaching = asyncio.ensure_future(
        asyncio.to_thread(netns.attach, sandbox_id, target, model=model is not None, instance=instance)
    )
    try:
        link = await asyncio.shield(attaching)
    except asyncio.CancelledError:
        # The thread goes on making the link whatever happens here: undone once made.
        with contextlib.suppress(Exception):
            made = await attaching
            made.close()
            await asyncio.to_thread(netns.detach, made.netns)
        raise
    proxy = EgressProxy(sandbox_id, policy, resolve=resolve, limits=limits)
    stop_model: Closer | None = None
    try:
        await proxy.start(link.proxy)
        transport = await serve_dns(link.dns, policy, netns.EGRESS_ADDRESS, proxy.deny)
        if model is not None and link.model is not None:
            try:
                stop_model = await model.serve(sandbox_id, link.model)
            except BaseException:
                transport.close()
                raise
    except BaseException:
        await proxy.close()
        link.close()
        await asyncio.to_thread(netns.detach, link.netns)
        raise
    return SandboxEgress(sandbox_id, link, proxy, transport, stop_model, base=policy)
