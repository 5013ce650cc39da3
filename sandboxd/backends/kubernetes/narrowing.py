"""A lease's network rules narrower than its pool's, on Kubernetes
(EgressNarrowing): written onto the sandbox's Pod, and in force at every
egress proxy before the call returns.

The proxy learns a Pod's rules from its watch (egress_pods), so a change
reaches it a moment after the API server has it. To be exact, each change
carries a new token (egress.ANNOTATION_NETWORK_REV), and ``narrow`` waits
until every proxy Pod that could be serving has written that token back on
the sandbox's Pod (egress.ACK_PREFIX + its uid), which it does only once the
new rules are in force and the connections opened before are cut. The
proxies to wait for are listed after the change is written: a proxy whose
process starts later lists the Pods after the change, so it starts under the
new rules. A proxy that does not answer within ACK_TIMEOUT_SECONDS fails the
call (the sandbox is given up, never handed out under wider rules); one that
is gone meanwhile is no longer waited for.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Mapping

from sandboxd.backends.kubernetes.cache import PodCache, PodInfo
from sandboxd.backends.kubernetes.client import Json, KubeClient, KubeError, idempotent, wrap
from sandboxd.backends.kubernetes.egress import (
    ACK_PREFIX,
    ANNOTATION_LEASE_NETWORK,
    ANNOTATION_NETWORK_REV,
    ANNOTATION_PROXY_ACKS,
    KubeEgress,
    ProxyService,
)
from sandboxd.errors import BackendError, FailedPrecondition, SandboxLost

__all__ = ["ACK_TIMEOUT_SECONDS", "KubeEgressNarrowing", "KubeNarrowing", "awaited_proxies"]

ACK_TIMEOUT_SECONDS = 10.0
"""How long a change of a Pod's rules waits for the egress proxies' acknowledgement."""
# How often a wait looks again for proxies gone meanwhile.
_RELIST_SECONDS = 1.0
_MERGE = "application/merge-patch+json"


def awaited_proxies(listed: Json) -> dict[str, str]:
    """Proxy Pod uid -> name, of the Pods of a Pod list that may run a proxy
    process now: bound to a node (or running) and not ended. A Pod not yet
    bound starts its process later, under the rules as they are then."""
    out: dict[str, str] = {}
    for pod in listed.get("items") or []:
        meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
        phase = status.get("phase") or "Pending"
        if phase in ("Succeeded", "Failed"):
            continue
        if phase == "Running" or spec.get("nodeName"):
            out[str(meta.get("uid", ""))] = str(meta.get("name", ""))
    return out


class KubeNarrowing:
    """Writes a sandbox Pod's lease rules and waits for the proxies to serve them."""

    def __init__(
        self,
        client: KubeClient,
        cache: PodCache,
        namespace: str,
        egress: KubeEgress,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._cache = cache
        self._pods = f"/api/v1/namespaces/{namespace}/pods"
        self._egress = egress
        self._clock = clock

    async def refusal(self, runtime: str) -> str | None:
        """Why a lease cannot narrow its pool's rules here; None when it can."""
        why = self._egress.refusal(runtime)
        if why is not None:
            return why
        service = await self._egress.proxy_service()
        if not service.acks:
            return (
                "the chart's egress proxy does not acknowledge changes of a Pod's rules (its Service lacks "
                f"the {ANNOTATION_PROXY_ACKS!r} annotation: a chart older than this control plane), so a "
                "lease's narrower rules could not be known to hold when Acquire answers; upgrade the "
                "chart, or create a pool with the narrower rules"
            )
        return None

    async def narrow(self, handle: str, rules: tuple[str, ...]) -> None:
        """The Pod ``handle`` served under ``rules`` (() = its pool's) by every
        egress proxy when this returns. FailedPrecondition where the proxy
        cannot acknowledge, SandboxLost for a Pod gone, BackendError when a
        proxy did not acknowledge in time."""
        service = await self._egress.proxy_service()
        if not service.acks:
            raise FailedPrecondition(await self.refusal("") or "the egress proxy cannot acknowledge")
        rev = secrets.token_hex(8)
        lease = json.dumps(list(rules)) if rules else None
        body = {"metadata": {"annotations": {ANNOTATION_LEASE_NETWORK: lease, ANNOTATION_NETWORK_REV: rev}}}
        try:
            await idempotent(
                lambda: self._client.request(
                    "PATCH", f"{self._pods}/{handle}", body=body, content_type=_MERGE, timeout=5, urgent=True
                ),
                within=4.0,
            )
        except KubeError as e:
            if e.status == 404:
                raise SandboxLost(f"the sandbox's Pod {handle} is gone") from e
            raise wrap(e, f"cannot write the network rules of Pod {handle}") from e
        # Listed after the change is written: see the module's docstring.
        awaited = await self._proxies(service)
        deadline = self._clock() + ACK_TIMEOUT_SECONDS
        while awaited:

            def acknowledged(pod: PodInfo | None, uids: tuple[str, ...] = tuple(awaited)) -> bool:
                return pod is None or all(pod.annotations.get(ACK_PREFIX + uid) == rev for uid in uids)

            left = deadline - self._clock()
            if left <= 0:
                names = ", ".join(sorted(awaited.values()))
                raise BackendError(
                    f"the egress proxy Pods {names} did not acknowledge the new network rules of Pod "
                    f"{handle} within {ACK_TIMEOUT_SECONDS:g}s (are they running and able to patch Pods?)"
                )
            try:
                pod = await self._cache.wait(handle, acknowledged, min(left, _RELIST_SECONDS))
            except TimeoutError:
                # A proxy Pod gone meanwhile serves nothing: no longer waited for.
                still = await self._proxies(service)
                awaited = {uid: name for uid, name in awaited.items() if uid in still}
                continue
            if pod is None:
                raise SandboxLost(f"the sandbox's Pod {handle} is gone")
            return

    async def _proxies(self, service: ProxyService) -> dict[str, str]:
        selector = ",".join(f"{k}={v}" for k, v in service.pod_labels)
        path = f"/api/v1/namespaces/{service.namespace}/pods"
        try:
            listed = await idempotent(
                lambda: self._client.request("GET", path, query={"labelSelector": selector}, timeout=10)
            )
        except KubeError as e:
            raise wrap(e, "cannot list the egress proxy's Pods") from e
        return awaited_proxies(listed)


class KubeEgressNarrowing:
    """EgressNarrowing for KubernetesBackend (mixed in)."""

    _narrowing: KubeNarrowing

    async def narrowing_refusal(self, runtime: str) -> str | None:
        return await self._narrowing.refusal(runtime)

    async def narrow_egress(self, handle: str, rules: tuple[str, ...]) -> None:
        await self._narrowing.narrow(handle, rules)

    def expect_narrowed(self, rules: Mapping[str, tuple[str, ...]]) -> None:
        """Nothing to keep: a lease's rules ride on its Pod, which outlives a
        restart of the control plane, so the Pod is served under them until
        the adoption's narrow_egress writes them again."""
        del rules
