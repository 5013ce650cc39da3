"""The chart's Services the control plane sends sandbox Pods to (the egress
proxy's, its own for the model gateway): read once, checked for what the
Pods' settings and NetworkPolicies need (a cluster IP, a Pod selector, named
ports and the Pods' own ports behind them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sandboxd.backends.kubernetes.client import KubeClient, KubeError, idempotent, wrap
from sandboxd.errors import TransientBackendError

__all__ = ["ServiceShape", "read_service"]


@dataclass(frozen=True)
class ServiceShape:
    """What a Service says about where its Pods are."""

    namespace: str
    name: str
    address: str
    """Its cluster IP."""
    selector: dict[str, str]
    ports: dict[str, tuple[int, int]]
    """By port name: (the Service's port, its Pods' own port)."""
    annotations: dict[str, str] = field(default_factory=dict)

    def peer(self) -> dict[str, Any]:
        """The NetworkPolicy ``to`` entry of the Service's Pods."""
        return {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": self.namespace}},
            "podSelector": {"matchLabels": dict(self.selector)},
        }


def _pods_port(port: dict[str, Any]) -> int:
    # A named target port is the Pods' business: policies then see the Service's number.
    target = port.get("targetPort", port["port"])
    return int(target) if isinstance(target, int) or str(target).isdigit() else int(port["port"])


async def read_service(
    client: KubeClient, namespace: str, name: str, *, what: str, enabled_by: str, ports: tuple[str, ...]
) -> ServiceShape:
    """The Service ``name`` of ``what`` ("the egress proxy"), which must have
    a cluster IP, a Pod selector and the named ``ports``. TransientBackendError
    naming what is missing (a create is retried with backoff: the chart may
    yet make or fix it; ``enabled_by`` is the chart value that makes it)."""
    path = f"/api/v1/namespaces/{namespace}/services/{name}"
    try:
        svc = await idempotent(lambda: client.request("GET", path))
    except KubeError as e:
        if e.status == 404:
            raise TransientBackendError(
                f"{what}'s Service {name} is not in namespace {namespace!r} "
                f"({enabled_by} in the chart's values)"
            ) from e
        raise wrap(e, f"cannot read {what}'s Service {name}") from e
    spec = svc.get("spec") or {}
    address = str(spec.get("clusterIP") or "")
    named = {str(p.get("name", "")): p for p in spec.get("ports") or []}
    selector = spec.get("selector") or {}
    if not address or address == "None" or not selector or not set(ports) <= set(named):
        raise TransientBackendError(
            f"{what}'s Service {name} needs a cluster IP, a Pod selector and ports named "
            f"{' and '.join(ports)} (the chart's Service has them)"
        )
    return ServiceShape(
        namespace=namespace,
        name=name,
        address=address,
        selector={str(k): str(v) for k, v in selector.items()},
        ports={p: (int(named[p]["port"]), _pods_port(named[p])) for p in ports},
        annotations={
            str(k): str(v) for k, v in ((svc.get("metadata") or {}).get("annotations") or {}).items()
        },
    )
