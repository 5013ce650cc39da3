"""The Docker backend's side of network policies: each sandbox's egress, opened with it and closed with it.

A pool with rules still creates its containers with the engine's network
"none"; the sandbox's link, proxy and resolver (sandboxd.backends.network)
are opened from the container's host pid before the sandbox is handed out.
Only runc sandboxes on an engine on this host can be given one: gVisor's
sandboxes have their own network stack that a host-side link does not reach,
and a remote engine's containers live in namespaces this process cannot enter.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace

from sandboxd.backends.base import GVISOR, BackendSandbox, SandboxSpec
from sandboxd.backends.network import netns
from sandboxd.backends.network.egress import SandboxEgress, command_env, open_egress
from sandboxd.backends.network.gateway import ModelGateway
from sandboxd.backends.network.policy import EgressPolicy
from sandboxd.backends.network.proxy import EgressLimits, EgressStats, system_resolve
from sandboxd.errors import FailedPrecondition, SandboxdError

log = logging.getLogger(__name__)

LABEL_NETWORK = "sandboxd.network"
"""On a sandbox with a policy: its rules (JSON), set by sandboxd only."""
LABEL_MODEL = "sandboxd.model"
"""On a sandbox with the model route: "true", set by sandboxd only."""


class DockerEgress:
    """Every sandbox's egress on this engine: opened with it, closed with it,
    linked again after a restart, and what a killed control plane left swept."""

    def __init__(
        self,
        *,
        local: bool,
        hosts: Mapping[str, str],
        limits: EgressLimits | None = None,
        instance: str = "",
    ) -> None:
        self._local = local
        self._instance = instance
        self.model: ModelGateway | None = None
        """The model gateway sandboxes with the model route are served by (set by the core)."""
        # Whether the first listing has swept what a previous control plane left.
        self._swept = False
        # Names answered from this table, before (and instead of) the host's resolver.
        self._hosts = {k.lower(): v for k, v in hosts.items()}
        self._limits = limits or EgressLimits()
        self._open: dict[str, SandboxEgress] = {}
        # Sandbox ids being created (their egress opens in create) and handles
        # being destroyed or relinked: a listing meanwhile leaves them alone.
        self._pending: set[str] = set()
        self._busy: set[str] = set()
        self._gone: set[str] = set()
        # A lease's narrower rules, by handle, whether or not the sandbox's
        # egress is open now: one linked (again) later is linked under them.
        self._narrowed: dict[str, tuple[str, ...]] = {}
        # By sandbox id: what a previous run had narrowed, until a listing links it.
        self._expected: dict[str, tuple[str, ...]] = {}

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

    def prepare(self, spec: SandboxSpec) -> SandboxSpec:
        """``spec`` with the proxy settings in its environment when it has rules
        (over the pool's own), and its rules on the container for a restarted
        control plane to link it again."""
        labels = {k: v for k, v in spec.labels.items() if k not in (LABEL_NETWORK, LABEL_MODEL)}
        if not spec.network and not spec.model_gateway:
            return replace(spec, labels=labels) if len(labels) != len(spec.labels) else spec
        self._pending.add(spec.sandbox_id)
        labels[LABEL_NETWORK] = json.dumps(list(spec.network))
        if spec.model_gateway:
            labels[LABEL_MODEL] = "true"
        return replace(spec, env={**spec.env, **command_env()}, labels=labels)

    def abandon(self, sandbox_id: str) -> None:
        """A create that failed before its egress opened."""
        self._pending.discard(sandbox_id)

    async def _resolve(self, host: str, port: int) -> list[str]:
        fixed = self._hosts.get(host)
        return [fixed] if fixed else await system_resolve(host, port)

    async def attach(self, spec: SandboxSpec, handle: str, pid: int) -> None:
        """Opens the sandbox's egress (none when its spec has no rules and no model route)."""
        if not spec.network and not spec.model_gateway:
            return
        try:
            await self._open_for(spec.sandbox_id, handle, pid, spec.network, spec.model_gateway)
        finally:
            self._pending.discard(spec.sandbox_id)

    def _policy(self, handle: str, rules: Sequence[str]) -> EgressPolicy:
        narrowed = self._narrowed.get(handle)
        return EgressPolicy.parse(rules) if narrowed is None else EgressPolicy.parse(narrowed, lease=True)

    async def narrow(self, handle: str, rules: tuple[str, ...]) -> None:
        """The sandbox's egress under ``rules`` (() = its pool's own) from now on."""
        if rules:
            policy = EgressPolicy.parse(rules, lease=True)
            self._narrowed[handle] = rules
        else:
            self._narrowed.pop(handle, None)
        egress = self._open.get(handle)
        if egress is not None:
            egress.set_policy(policy if rules else egress.base)
        # One whose link is being made applies this itself once made (_open_for).

    def expect(self, rules: Mapping[str, tuple[str, ...]]) -> None:
        """Sandbox id -> rules a previous run narrowed it to, for the listing that links it again."""
        self._expected = {sid: tuple(r) for sid, r in rules.items() if r}

    async def _open_for(
        self, sandbox_id: str, handle: str, pid: int, rules: Sequence[str], model: bool
    ) -> None:
        policy = self._policy(handle, rules)
        if not pid:
            raise FailedPrecondition(f"sandbox {sandbox_id}: no host pid to link its network to")
        if model and self.model is None:
            raise FailedPrecondition(
                f"sandbox {sandbox_id}: the model route needs the server's model gateway"
            )
        egress = await open_egress(
            sandbox_id,
            str(pid),
            policy,
            resolve=self._resolve,
            limits=self._limits,
            model=self.model if model else None,
            instance=self._instance,
        )
        egress.base = EgressPolicy.parse(rules)
        if handle in self._gone:
            # Destroyed while its link was being made (a listing relinked it meanwhile).
            await egress.close()
            return
        now = self._policy(handle, rules)
        if now != policy:
            # Narrowed (or widened back) while the link was being made.
            egress.set_policy(now)
        self._open[handle] = egress

    async def relink(
        self, found: Sequence[BackendSandbox], host_pid: Callable[[str], Awaitable[int]]
    ) -> None:
        """Opens the egress again of listed sandboxes that carry rules but have
        none open here (a restarted control plane's adopted ones). One that
        cannot be linked keeps no network at all (it fails closed). The first
        listing also sweeps what a killed control plane left."""
        listed = {s.handle for s in found}
        self._gone &= listed
        for s in found:
            rules_text = s.labels.get(LABEL_NETWORK)
            model = s.labels.get(LABEL_MODEL) == "true"
            if (
                not (rules_text or model)
                or not s.running
                or s.paused
                or s.handle in self._open
                or s.handle in self._busy
                or s.handle in self._gone
                or s.sandbox_id in self._pending
            ):
                continue
            self._busy.add(s.handle)
            expected = self._expected.pop(s.sandbox_id, None)
            if expected:
                self._narrowed[s.handle] = expected
            # Kept out of a concurrent listing's sweep while its namespace is made.
            self._pending.add(s.sandbox_id)
            try:
                rules = json.loads(rules_text or "[]")
                await self._open_for(s.sandbox_id, s.handle, await host_pid(s.handle), rules, model)
                log.info("egress of adopted sandbox %s linked again", s.sandbox_id)
            except (SandboxdError, OSError, ValueError) as e:
                log.warning("egress of sandbox %s not linked again (it has no network): %s", s.sandbox_id, e)
            finally:
                self._busy.discard(s.handle)
                self._pending.discard(s.sandbox_id)
        if not self._swept and self._local and os.geteuid() == 0:
            self._swept = True
            await self.sweep()

    async def sweep(self) -> list[str]:
        """Removes this instance's egress namespaces that no open egress owns,
        and its stray veth ends when no link is being made; returns what went."""
        keep = {e.link.netns for e in self._open.values()}
        keep |= {netns.egress_netns(sid, self._instance) for sid in self._pending}
        quiet = not self._pending and not self._busy
        removed = await asyncio.to_thread(netns.sweep, self._instance, keep, links=quiet)
        if removed:
            log.info("egress: removed %d namespaces and links a previous run left: %s", len(removed), removed)
        return removed

    async def detach(self, handle: str) -> None:
        """Closes the sandbox's egress; a listing never links it again."""
        self._gone.add(handle)
        self._narrowed.pop(handle, None)
        egress = self._open.pop(handle, None)
        if egress is not None:
            await egress.close()

    def stats(self, handle: str) -> EgressStats | None:
        egress = self._open.get(handle)
        return egress.stats if egress is not None else None

    def all_stats(self) -> dict[str, EgressStats]:
        """Each open egress's counts, by sandbox id."""
        return {e.sandbox_id: e.stats for e in self._open.values()}

    async def close(self) -> None:
        """Stops every proxy; the sandboxes' links end with their egress namespaces (they fail closed)."""
        opened, self._open = list(self._open.values()), {}
        for egress in opened:
            with contextlib.suppress(Exception):
                await egress.close()
