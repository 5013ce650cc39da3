"""What the chart's egress proxy knows of sandbox Pods: their rules by
source address, from a watch, and its acknowledgement of each change.

The proxy lists the sandbox Pods of its namespace once, then watches them
(sandboxd.backends.kubernetes.cache.PodCache: a resumed watch, events in the
API server's order), so it never decides by a view of a Pod older than what
its watch has delivered; it serves nothing before the first list is in. A
Pod's rules are its lease's (egress.ANNOTATION_LEASE_NETWORK) where its
lease narrowed them, else its pool's (egress.ANNOTATION_NETWORK).

That alone leaves the watch's delay: a Pod whose lease narrowed its rules
could be served under its pool's for the moment before the change arrives.
So the control plane writes a new token (egress.ANNOTATION_NETWORK_REV) with
each change, and does not hand the Pod out until every proxy has written the
token back under its own key (egress.ACK_PREFIX + its Pod's uid); a proxy
writes it only once the new rules are on the Pod's live proxy, which cuts
the connections opened under the rules before (EgressProxy.set_policy).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass

from sandboxd.backends.base import LABEL_MANAGED, LABEL_SANDBOX
from sandboxd.backends.kubernetes.cache import PodCache, PodInfo
from sandboxd.backends.kubernetes.client import KubeClient, KubeError, idempotent
from sandboxd.backends.kubernetes.egress import (
    ACK_PREFIX,
    ANNOTATION_LEASE_NETWORK,
    ANNOTATION_NETWORK,
    ANNOTATION_NETWORK_REV,
)
from sandboxd.backends.kubernetes.podspec import ANNOTATION_POOL
from sandboxd.backends.network.policy import EgressPolicy
from sandboxd.errors import InvalidArgument

__all__ = ["NO_RULES", "PodPolicies", "SandboxOf"]

log = logging.getLogger(__name__)

NO_RULES = EgressPolicy.parse([])
_MERGE = "application/merge-patch+json"


@dataclass(frozen=True)
class SandboxOf:
    """The sandbox Pod behind a source address, with its rules."""

    uid: str
    sandbox_id: str
    policy: EgressPolicy
    pool: str = ""


def _rules_of(pod: PodInfo) -> EgressPolicy | None:
    """The rules the Pod is served under; None for none, or unreadable ones
    (refused: a lease's unreadable rules never fall back to its pool's)."""
    lease = pod.annotations.get(ANNOTATION_LEASE_NETWORK)
    text = lease or pod.annotations.get(ANNOTATION_NETWORK)
    if not text:
        return None
    try:
        return EgressPolicy.parse(json.loads(text), lease=bool(lease))
    except (ValueError, TypeError, InvalidArgument) as e:
        log.warning("Pod %s has unreadable network rules: %s", pod.name, e)
        return None


class PodPolicies:
    """Source address -> its sandbox Pod and rules, from a watch of the
    sandbox Pods of ``namespace``; with ``ack_as`` (the proxy's own Pod's
    uid), each change of a Pod's rules acknowledged on the Pod."""

    def __init__(self, client: KubeClient, namespace: str, ack_as: str = "") -> None:
        self._client = client
        self._path = f"/api/v1/namespaces/{namespace}/pods"
        self.ack_key = ACK_PREFIX + ack_as if ack_as else ""
        keep = (ANNOTATION_NETWORK, ANNOTATION_LEASE_NETWORK, ANNOTATION_NETWORK_REV, ANNOTATION_POOL)
        self.cache = PodCache(
            client,
            namespace,
            f"{LABEL_MANAGED}=true",
            keep + ((self.ack_key,) if self.ack_key else ()),
            on_change=self._changed,
        )
        # By Pod name: (its rules' annotation texts, what they parse to).
        self._sandboxes: dict[str, tuple[tuple[str, str], SandboxOf | None]] = {}
        self.on_rules: Callable[[str, EgressPolicy], None] | None = None
        """Called with (Pod uid, its rules now; NO_RULES for none) when a Pod's rules change."""
        # By Pod name: the token whose acknowledgement is being written.
        self._acking: dict[str, str] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.acks_written = 0

    async def start(self) -> None:
        """Returns once the first list is in (the watch goes on behind)."""
        await self.cache.start()

    async def stop(self) -> None:
        await self.cache.stop()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def lookup(self, address: str) -> SandboxOf | None:
        """The running sandbox Pod with rules at ``address`` now; None when there is none."""
        pod = self.cache.at(address)
        if pod is None or not pod.running:
            return None
        known = self._sandboxes.get(pod.name)
        return known[1] if known is not None else None

    def _changed(self, name: str, pod: PodInfo | None) -> None:
        before = self._sandboxes.get(name)
        if pod is None:
            # Its address serves no one from now on; its open connections
            # are left to end with the Pod (its rules did not change).
            self._sandboxes.pop(name, None)
            self._acking.pop(name, None)
            return
        texts = (
            pod.annotations.get(ANNOTATION_NETWORK, ""),
            pod.annotations.get(ANNOTATION_LEASE_NETWORK, ""),
        )
        if before is None or before[0] != texts or (before[1] is not None and before[1].uid != pod.uid):
            policy = _rules_of(pod)
            sandbox = (
                SandboxOf(
                    pod.uid,
                    pod.labels.get(LABEL_SANDBOX, pod.name),
                    policy,
                    pod.annotations.get(ANNOTATION_POOL, ""),
                )
                if policy is not None
                else None
            )
            self._sandboxes[name] = (texts, sandbox)
            if self.on_rules is not None:
                # Before the acknowledgement below: it says these rules are in force.
                self.on_rules(pod.uid, policy or NO_RULES)
        rev = pod.annotations.get(ANNOTATION_NETWORK_REV, "")
        if (
            self.ack_key
            and rev
            and pod.annotations.get(self.ack_key) != rev
            and self._acking.get(name) != rev
        ):
            self._acking[name] = rev
            task = asyncio.ensure_future(self._ack(name, rev))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _ack(self, name: str, rev: str) -> None:
        body = {"metadata": {"annotations": {self.ack_key: rev}}}
        try:
            await idempotent(
                lambda: self._client.request(
                    "PATCH", f"{self._path}/{name}", body=body, content_type=_MERGE, timeout=5
                )
            )
            self.acks_written += 1
        except KubeError as e:
            if e.status != 404:  # a Pod gone needs no acknowledgement
                log.warning("Pod %s: its rules' change %s not acknowledged: %s", name, rev, e)
        finally:
            if self._acking.get(name) == rev:
                # Done or given up: the next event of the Pod writes it again if it is missing.
                del self._acking[name]
