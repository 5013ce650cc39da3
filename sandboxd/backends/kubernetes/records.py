"""What KubernetesBackend keeps in the API server, mixed into it: tenant
quotas as ResourceQuotas (quotas.py), and the pool and lease ledger
(ledger.py), a pool's NetworkPolicy going with its spec (egress.py)."""

from __future__ import annotations

import builtins

from sandboxd.backends.base import LeaseMark, QuotaHeadroom
from sandboxd.backends.kubernetes.egress import KubeEgress
from sandboxd.backends.kubernetes.ledger import KubeLedger
from sandboxd.backends.kubernetes.pods import KubernetesOptions
from sandboxd.backends.kubernetes.quotas import TenantQuotaManager


class KubeRecords:
    """TenantQuotas and Ledger for KubernetesBackend."""

    _options: KubernetesOptions
    _egress: KubeEgress
    quotas: TenantQuotaManager
    ledger: KubeLedger

    # -- TenantQuotas: ResourceQuotas per tenant -----------------------------

    async def set_tenant_quota(self, tenant: str, pods: int, memory_bytes: int) -> None:
        if self._options.tenant_quotas:
            await self.quotas.set(tenant, pods, memory_bytes)

    async def quota_headroom(self, tenant: str) -> QuotaHeadroom:
        return await self.quotas.headroom(tenant)

    # -- Ledger: the API server keeps pools and leases -----------------------

    async def load_pool_specs(self) -> dict[str, str]:
        return await self.ledger.load_pool_specs()

    async def save_pool_spec(self, key: str, spec: str) -> None:
        await self.ledger.save_pool_spec(key, spec)

    async def delete_pool_spec(self, key: str) -> None:
        await self.ledger.delete_pool_spec(key)
        await self._egress.remove(key)

    async def mark_leased(self, handle: str, mark: LeaseMark) -> None:
        await self.ledger.mark_leased(handle, mark)

    async def lease_marks(self) -> builtins.list[tuple[str, str, LeaseMark]]:
        return await self.ledger.lease_marks()
