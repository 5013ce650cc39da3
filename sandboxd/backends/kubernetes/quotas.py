"""Tenant quotas as ResourceQuotas in the sandbox namespace.

A ResourceQuota cannot select Pods by label; within one namespace the one
scope that tells tenants apart is the Pod's PriorityClass. With tenant
quotas on, each tenant gets a PriorityClass ``sandboxd-tenant-<tenant>``
(value 0, never preempts: it changes nothing about scheduling) that its Pods
name, and a ResourceQuota of the same name scoped to it, so the API server
itself refuses a tenant's Pod past its quota, whatever sandboxd's own
bookkeeping says. Namespace-wide quotas (unscoped) count for every tenant.
"""

from __future__ import annotations

from typing import Any

from sandboxd.backends.base import LABEL_MANAGED, QuotaHeadroom
from sandboxd.backends.kubernetes.client import KubeClient, KubeError, idempotent, wrap
from sandboxd.backends.kubernetes.podspec import parse_quantity, tenant_class

_APPLY = "application/apply-patch+yaml"
_POD_KEYS = ("pods", "count/pods")
_MEMORY_KEYS = ("limits.memory",)


def _scope(name: str) -> dict[str, Any]:
    return {"scopeName": "PriorityClass", "operator": "In", "values": [name]}


class TenantQuotaManager:
    """Each tenant's ResourceQuota and the PriorityClass that scopes it, so the API server enforces it."""

    def __init__(self, client: KubeClient, namespace: str) -> None:
        self._client = client
        self._ns = namespace
        self._quotas = f"/api/v1/namespaces/{namespace}/resourcequotas"
        self._classes: set[str] = set()

    async def set(self, tenant: str, pods: int, memory_bytes: int) -> None:
        """Applies the tenant's quota (0 = no limit on that resource; both 0 deletes the quota)."""
        name = tenant_class(tenant)
        try:
            await self._ensure_class(name, tenant)
            if not pods and not memory_bytes:
                await self._delete(name)
                return
            hard = {}
            if pods:
                hard["pods"] = str(pods)
            if memory_bytes:
                hard["limits.memory"] = str(memory_bytes)
            body = {
                "apiVersion": "v1",
                "kind": "ResourceQuota",
                "metadata": {"name": name, "namespace": self._ns, "labels": {LABEL_MANAGED: "true"}},
                "spec": {
                    "hard": hard,
                    "scopeSelector": {"matchExpressions": [_scope(name)]},
                },
            }
            # Server-side apply: one idempotent call creates or updates it.
            await idempotent(
                lambda: self._client.request(
                    "PATCH",
                    f"{self._quotas}/{name}",
                    query={"fieldManager": "sandboxd", "force": "true"},
                    body=body,
                    content_type=_APPLY,
                )
            )
        except KubeError as e:
            raise wrap(e, f"cannot set the ResourceQuota of tenant {tenant!r}") from e

    async def ensure_class(self, tenant: str) -> None:
        """The tenant's PriorityClass, which its Pods name (before its first Pod)."""
        try:
            await self._ensure_class(tenant_class(tenant), tenant)
        except KubeError as e:
            raise wrap(e, f"cannot create the PriorityClass of tenant {tenant!r}") from e

    async def _ensure_class(self, name: str, tenant: str) -> None:
        if name in self._classes:
            return
        body = {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": name, "labels": {LABEL_MANAGED: "true"}},
            "value": 0,
            "preemptionPolicy": "Never",
            "globalDefault": False,
            "description": f"sandboxd tenant {tenant}: scopes its ResourceQuota (no scheduling effect)",
        }
        try:
            await self._client.request("POST", "/apis/scheduling.k8s.io/v1/priorityclasses", body=body)
        except KubeError as e:
            if e.status != 409:
                raise
        self._classes.add(name)

    async def _delete(self, name: str) -> None:
        try:
            await self._client.request("DELETE", f"{self._quotas}/{name}")
        except KubeError as e:
            if e.status != 404:
                raise

    async def headroom(self, tenant: str) -> QuotaHeadroom:
        """The least room any quota that counts the tenant's Pods leaves:
        the namespace's unscoped ones and the tenant's own."""
        try:
            body = await self._client.request("GET", self._quotas)
        except KubeError as e:
            raise wrap(e, "cannot read ResourceQuotas") from e
        mine = tenant_class(tenant)
        pods: int | None = None
        memory: int | None = None
        for quota in body.get("items") or []:
            spec: dict[str, Any] = quota.get("spec") or {}
            scoped = spec.get("scopes") or spec.get("scopeSelector")
            if scoped and (quota.get("metadata") or {}).get("name") != mine:
                continue
            status = quota.get("status") or {}
            hard = status.get("hard") or spec.get("hard") or {}
            used = status.get("used") or {}
            for key in _POD_KEYS:
                if key in hard:
                    left = int(parse_quantity(hard[key]) - parse_quantity(used.get(key, "0")))
                    pods = left if pods is None else min(pods, left)
            for key in _MEMORY_KEYS:
                if key in hard:
                    left = int(parse_quantity(hard[key]) - parse_quantity(used.get(key, "0")))
                    memory = left if memory is None else min(memory, left)
        return QuotaHeadroom(
            pods=None if pods is None else max(0, pods),
            memory_bytes=None if memory is None else max(0, memory),
        )
