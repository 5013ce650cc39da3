"""Network policies on Kubernetes: a pool's allow-list as a NetworkPolicy, and
its Pods pointed at the egress proxy the chart runs.

A Pod of a pool with rules is selected by its pool's NetworkPolicy (made
before its first Pod, removed with the pool's spec): egress only to the egress
proxy's Pods, on the proxy's TCP port and DNS, nothing else. With the
namespace's deny-all policy (podspec.deny_all_policy) the Pod reaches nothing
but the proxy. Its commands get HTTP(S)_PROXY and the package managers' proxy
settings at the proxy Service's address (no DNS needed to find it), its
resolver is the proxy's DNS (allowed names only), and its rules ride on the
Pod (ANNOTATION_NETWORK), where the proxy reads them by the connection's
source address (sandboxd.backends.kubernetes.egress_proxy); a sandbox cannot
change its own Pod.

Each pool's policy is owned by the instance's pool-spec ConfigMap (deleting
the instance's record takes every one with it) and removed with the pool; a
listing sweeps those whose pool is gone (a control plane that stopped between
the two, or a create that made one as its pool was deleted). The API server
only stores the policies: a CNI that enforces NetworkPolicy (Calico, Cilium,
...) is what makes them hold.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from sandboxd.backends.base import LABEL_INSTANCE, LABEL_MANAGED, LABEL_POOL, SandboxSpec
from sandboxd.backends.kubernetes.client import KubeClient, KubeError, idempotent, wrap
from sandboxd.backends.kubernetes.podspec import ANNOTATION_POOL, label_value
from sandboxd.backends.kubernetes.services import ServiceShape, read_service
from sandboxd.backends.network.egress import PROXY_URL, command_env
from sandboxd.errors import BackendError, FailedPrecondition

if TYPE_CHECKING:
    from sandboxd.backends.kubernetes.model_gateway import GatewayTarget
    from sandboxd.backends.kubernetes.pods import KubernetesOptions

__all__ = [
    "ACK_PREFIX",
    "ANNOTATION_LEASE_NETWORK",
    "ANNOTATION_NETWORK",
    "ANNOTATION_NETWORK_REV",
    "ANNOTATION_PROXY_ACKS",
    "EgressProxyRef",
    "KubeEgress",
    "ProxyService",
    "egress_pod",
    "pool_policy",
    "pool_policy_name",
    "proxy_env",
]

log = logging.getLogger(__name__)

ANNOTATION_NETWORK = "sandboxd.io/network"
"""On a Pod of a pool with rules: the rules (JSON), for the egress proxy."""
ANNOTATION_LEASE_NETWORK = "sandboxd.io/lease-network"
"""On a Pod whose lease narrowed its pool's rules (AcquireRequest.network):
the lease's rules (JSON), which the egress proxy serves instead."""
ANNOTATION_NETWORK_REV = "sandboxd.io/network-rev"
"""On a Pod whose rules the control plane changed after it was made: a token
new with each change, which every egress proxy acknowledges (ACK_PREFIX)."""
ACK_PREFIX = "egress-ack.sandboxd.io/"
"""On a Pod, + the uid of an egress proxy's Pod: the ANNOTATION_NETWORK_REV
that proxy serves the Pod under (written by the proxy)."""
ANNOTATION_PROXY_ACKS = "sandboxd.io/egress-acks"
"""On the egress proxy's Service ("true", the chart's): its proxies
acknowledge each change of a Pod's rules, so a lease may narrow them."""
LABEL_EGRESS = "sandboxd.egress"
"""On each pool's NetworkPolicy ("pool"): what a sweep lists."""
_POLICIES = "/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies"
# How often listings sweep the pools' policies for ones whose pool is gone.
_SWEEP_SECONDS = 60.0


@dataclass(frozen=True)
class EgressProxyRef:
    """Where the chart's egress proxy runs: its Service (the rest is read from it)."""

    service: str
    namespace: str


@dataclass(frozen=True)
class ProxyService:
    """What the proxy's Service says: its address and port (for the Pods'
    proxy settings and resolver), the labels of its Pods and their ports
    (for the NetworkPolicy, which sees the Pods' own ports)."""

    namespace: str
    address: str
    port: int
    pod_labels: tuple[tuple[str, str], ...]
    pod_port: int
    dns_pod_port: int
    acks: bool = False
    """Its proxies acknowledge each change of a Pod's rules (ANNOTATION_PROXY_ACKS)."""

    @classmethod
    def of(cls, svc: ServiceShape) -> ProxyService:
        """From the proxy's Service as read (its ports ``proxy`` and ``dns``)."""
        return cls(
            namespace=svc.namespace,
            address=svc.address,
            port=svc.ports["proxy"][0],
            pod_labels=tuple(sorted(svc.selector.items())),
            pod_port=svc.ports["proxy"][1],
            dns_pod_port=svc.ports["dns"][1],
            acks=svc.annotations.get(ANNOTATION_PROXY_ACKS) == "true",
        )


def pool_policy_name(instance: str, pool: str) -> str:
    """The pool's NetworkPolicy name: a DNS label, one per (instance, pool)."""
    digest = hashlib.sha256(f"{instance}\0{pool}".encode()).hexdigest()[:20]
    return f"sandboxd-egress-{digest}"


def pool_policy(
    namespace: str,
    instance: str,
    pool: str,
    proxy: ProxyService | None,
    owner: dict[str, Any] | None = None,
    gateway: GatewayTarget | None = None,
) -> dict[str, Any]:
    """The NetworkPolicy of one pool's Pods: Egress only to the proxy's Pods
    on its port (TCP) and its DNS (UDP) for a pool with rules, and to the
    model gateway's listener (TCP) for one with the model route; nothing
    else, whatever other policies allow (a policy of type Egress that
    selects a Pod denies all it does not list)."""
    egress: list[dict[str, Any]] = []
    if proxy is not None:
        egress.append(
            {
                "to": [
                    {
                        "namespaceSelector": {
                            "matchLabels": {"kubernetes.io/metadata.name": proxy.namespace}
                        },
                        "podSelector": {"matchLabels": dict(proxy.pod_labels)},
                    }
                ],
                "ports": [
                    {"protocol": "TCP", "port": proxy.pod_port},
                    {"protocol": "UDP", "port": proxy.dns_pod_port},
                ],
            }
        )
    if gateway is not None:
        egress.append({"to": [gateway.peer], "ports": [{"protocol": "TCP", "port": gateway.peer_port}]})
    metadata: dict[str, Any] = {
        "name": pool_policy_name(instance, pool),
        "namespace": namespace,
        "labels": {
            LABEL_MANAGED: "true",
            LABEL_INSTANCE: label_value(instance),
            LABEL_POOL: label_value(pool),
            LABEL_EGRESS: "pool",
        },
        "annotations": {ANNOTATION_POOL: pool},
    }
    if owner is not None:
        metadata["ownerReferences"] = [owner]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata,
        "spec": {
            "podSelector": {
                "matchLabels": {
                    LABEL_MANAGED: "true",
                    LABEL_INSTANCE: label_value(instance),
                    LABEL_POOL: label_value(pool),
                }
            },
            "policyTypes": ["Egress"],
            "egress": egress,
        },
    }


def egress_pod(body: dict[str, Any], spec: SandboxSpec, proxy_ip: str) -> dict[str, Any]:
    """The Pod manifest ``body`` of a sandbox with rules, its rules on it and
    its resolver the proxy's DNS at ``proxy_ip``."""
    if not spec.network:
        return body
    body["metadata"].setdefault("annotations", {})[ANNOTATION_NETWORK] = json.dumps(list(spec.network))
    body["spec"]["dnsPolicy"] = "None"
    # Names are looked up as given (no search domains): the proxy's DNS answers allowed names only.
    body["spec"]["dnsConfig"] = {"nameservers": [proxy_ip], "options": [{"name": "ndots", "value": "1"}]}
    return body


def proxy_env(url: str, direct: str = "") -> dict[str, str]:
    """The Docker side's command settings (HTTP(S)_PROXY, ALL_PROXY, NO_PROXY,
    npm's), the proxy at ``url``; ``direct``, the model gateway's address,
    is reached without it."""
    env = {k: url if v == PROXY_URL else v for k, v in command_env().items()}
    if direct:
        for var in ("NO_PROXY", "no_proxy"):
            env[var] += f",{direct}"
    return env


class KubeEgress:
    """The pools' NetworkPolicies of one instance in one namespace, and the
    proxy's address their Pods are given."""

    def __init__(
        self,
        client: KubeClient,
        options: KubernetesOptions,
        owner_cm: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._ns = options.namespace
        self._instance = options.instance
        self._proxy = options.egress_proxy
        self._in_cluster = options.pool_specs_in_cluster
        self._gateway = options.model_gateway is not None
        self._owner_cm = owner_cm
        self._path = _POLICIES.format(ns=self._ns)
        self._made: set[str] = set()
        self._service: ProxyService | None = None
        self._clock = clock
        self._next_sweep = 0.0

    def refusal(self, runtime: str) -> str | None:
        """Why a pool with rules cannot be had; None when it can."""
        # A NetworkPolicy holds outside the sandbox, for runc and gVisor Pods alike.
        del runtime
        if self._proxy is None:
            return (
                "network policies on Kubernetes need the chart's egress proxy (egress.enabled in the "
                "chart's values, backend.egress_proxy_service in sandboxd.toml)"
            )
        if not self._in_cluster:
            return (
                'network policies on Kubernetes need backend.state = "cluster": a pool\'s NetworkPolicy '
                "is kept, and removed, with its spec in the API server"
            )
        return None

    async def prepare(
        self, spec: SandboxSpec, gateway: GatewayTarget | None = None
    ) -> tuple[SandboxSpec, str]:
        """For a sandbox with rules or the model route (at ``gateway``): its
        pool's NetworkPolicy made (once per pool), and with rules ``spec``
        with the proxy settings in its environment, with the proxy's address
        for its Pod (egress_pod). ``spec`` as it is with neither."""
        gateway = gateway if spec.model_gateway else None
        if not spec.network and gateway is None:
            return spec, ""
        service = None
        if spec.network:
            if self._proxy is None:
                raise FailedPrecondition(self.refusal(spec.runtime) or "no egress proxy")
            service = await self.proxy_service()
        if spec.pool not in self._made:
            await self._ensure_policy(spec.pool, service, gateway)
            self._made.add(spec.pool)
        if service is None:
            return spec, ""
        direct = gateway.address if gateway is not None else ""
        env = {**spec.env, **proxy_env(f"http://{service.address}:{service.port}", direct)}
        return replace(spec, env=env), service.address

    async def proxy_service(self) -> ProxyService:
        """The proxy's Service as read once (its address does not change while it exists)."""
        assert self._proxy is not None
        if self._service is None:
            svc = await read_service(
                self._client,
                self._proxy.namespace,
                self._proxy.service,
                what="the egress proxy",
                enabled_by="egress.enabled",
                ports=("proxy", "dns"),
            )
            self._service = ProxyService.of(svc)
        return self._service

    async def _owner(self) -> dict[str, Any] | None:
        """The instance's pool-spec ConfigMap as an owner (None before it exists)."""
        path = f"/api/v1/namespaces/{self._ns}/configmaps/{self._owner_cm}"
        try:
            cm = await idempotent(lambda: self._client.request("GET", path))
        except KubeError as e:
            if e.status in (403, 404):
                return None
            raise wrap(e, f"cannot read ConfigMap {self._owner_cm}") from e
        return {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "name": self._owner_cm,
            "uid": cm["metadata"]["uid"],
        }

    async def _ensure_policy(
        self, pool: str, service: ProxyService | None, gateway: GatewayTarget | None
    ) -> None:
        body = pool_policy(self._ns, self._instance, pool, service, await self._owner(), gateway)
        try:
            await self._client.request("POST", self._path, body=body)
        except KubeError as e:
            if e.status != 409:  # made by an earlier create or replica: the same object
                raise wrap(e, f"cannot create the NetworkPolicy of pool {pool!r}") from e

    async def remove(self, pool: str) -> None:
        """The pool's NetworkPolicy deleted (a missing one is no error)."""
        self._made.discard(pool)
        path = f"{self._path}/{pool_policy_name(self._instance, pool)}"
        try:
            await idempotent(lambda: self._client.request("DELETE", path))
        except KubeError as e:
            if e.status != 404:
                raise wrap(e, f"cannot delete the NetworkPolicy of pool {pool!r}") from e

    async def sweep(self, specs: Callable[[], Awaitable[Mapping[str, str]]]) -> None:
        """Deletes this instance's pool policies whose pool has no spec in
        ``specs()`` (pool key -> spec), at most once every _SWEEP_SECONDS
        (called with every listing): what a control plane that stopped
        between forgetting a pool and deleting its policy left, or a create
        that made one as its pool was deleted. A failure is logged and tried
        again on the next listing. Nothing to do where pool specs are not
        kept in the API server (no policy was made there)."""
        made = self._proxy is not None or self._gateway
        if not made or not self._in_cluster or self._clock() < self._next_sweep:
            return
        query = {
            "labelSelector": f"{LABEL_MANAGED}=true,{LABEL_INSTANCE}={label_value(self._instance)},"
            f"{LABEL_EGRESS}=pool"
        }
        try:
            # Policies first, specs second: a pool's spec is saved before its
            # first policy is made, so a pool made meanwhile is never taken for gone.
            listed = await idempotent(lambda: self._client.request("GET", self._path, query=query))
            pools = set(await specs())
            for item in listed.get("items") or []:
                pool = str(((item.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_POOL, ""))
                if pool and pool not in pools:
                    log.info("removing the NetworkPolicy of pool %s: the pool is gone", pool)
                    await self.remove(pool)
        except (KubeError, BackendError) as e:
            log.warning("pools' NetworkPolicies not swept (tried again on the next listing): %s", e)
            return
        self._next_sweep = self._clock() + _SWEEP_SECONDS
