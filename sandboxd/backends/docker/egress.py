"""The Docker backend's side of network policies: each sandbox's egress, opened with it and closed with it.

A pool with rules still creates its containers with the engine's network
"none"; the sandbox's link, proxy and resolver (sandboxd.backends.network)
are opened from the container's host pid before the sandbox is handed out.
Only runc sandboxes on an engine on this host can be given one: gVisor's
sandboxes have their own network stack that a host-side link does not reach,
and a remote engine's containers live in namespaces this process cannot enter.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import replace

from sandboxd.backends.base import GVISOR, SandboxSpec
from sandboxd.backends.network import netns
from sandboxd.backends.network.egress import SandboxEgress, command_env, open_egress
from sandboxd.backends.network.policy import EgressPolicy
from sandboxd.backends.network.proxy import EgressLimits, EgressStats, system_resolve
from sandboxd.errors import FailedPrecondition


class DockerEgress:
    def __init__(self, *, local: bool, hosts: Mapping[str, str], limits: EgressLimits | None = None) -> None:
        self._local = local
        # Names answered from this table, before (and instead of) the host's resolver.
        self._hosts = {k.lower(): v for k, v in hosts.items()}
        self._limits = limits or EgressLimits()
        self._open: dict[str, SandboxEgress] = {}

    def refusal(self, runtime: str) -> str | None:
        """Why sandboxes of ``runtime`` cannot have a network policy here; None when they can."""
        if runtime == GVISOR:
            return (
                "network policies are enforced for runtime 'runc' only: a gVisor sandbox has its own "
                "network stack, which the host-side egress link does not reach"
            )
        if not self._local:
            return "network policies need the engine on this host (sandboxd enters its containers' netns)"
        if os.geteuid() != 0:
            return "network policies need sandboxd to run as root (it links sandboxes' network namespaces)"
        missing = netns.missing_tools()
        if missing:
            return f"network policies need {', '.join(missing)} on the host"
        return None

    @staticmethod
    def prepare(spec: SandboxSpec) -> SandboxSpec:
        """``spec`` with the proxy settings in its environment when it has rules (over the pool's own)."""
        if not spec.network:
            return spec
        return replace(spec, env={**spec.env, **command_env()})

    async def _resolve(self, host: str, port: int) -> list[str]:
        fixed = self._hosts.get(host)
        return [fixed] if fixed else await system_resolve(host, port)

    async def attach(self, spec: SandboxSpec, handle: str, pid: int) -> None:
        """Opens the sandbox's egress (none when its spec has no rules)."""
        if not spec.network:
            return
        policy = EgressPolicy.parse(spec.network)
        if not pid:
            raise FailedPrecondition(f"sandbox {spec.sandbox_id}: no host pid to link its network to")
        self._open[handle] = await open_egress(
            spec.sandbox_id, str(pid), policy, resolve=self._resolve, limits=self._limits
        )

    async def detach(self, handle: str) -> None:
        egress = self._open.pop(handle, None)
        if egress is not None:
            await egress.close()

    def stats(self, handle: str) -> EgressStats | None:
        egress = self._open.get(handle)
        return egress.stats if egress is not None else None

    async def close(self) -> None:
        """Stops every proxy; the sandboxes' links end with their egress namespaces (they fail closed)."""
        opened, self._open = list(self._open.values()), {}
        for egress in opened:
            with contextlib.suppress(Exception):
                await egress.close()
