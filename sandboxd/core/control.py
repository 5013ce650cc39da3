"""The control plane: the composition root of the core. It owns the parts,
wires them to one another and starts and stops them in order; the logic is
in the parts, each with a public face the others use:

- ``SandboxRegistry`` (sandboxd.core.registry): pools, sandbox records,
  limits resolution, tenant quota mirroring, adoption of records at start;
- ``Leasing`` (sandboxd.core.leasing): acquire, heartbeat, release, expiry
  (the reaper), orphan sweep, restored leases;
- ``Operations`` (sandboxd.core.operations): exec and file transfer;
- ``Reconciler`` (sandboxd.core.reconciler): scaling every pool.

The API layer, snapshots and rollouts call the control plane's methods, which
are the parts' own. Everything here speaks sandboxd types and raises
sandboxd errors."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import overload

from opentelemetry.metrics import Meter

from sandboxd.backends.base import Backend, ExecSpec, Limits, ModelRoutes
from sandboxd.clock import Clock
from sandboxd.core import capacity
from sandboxd.core.acquire_request import AcquireRequest
from sandboxd.core.egress_meters import register_egress_meters
from sandboxd.core.images import ImageCache
from sandboxd.core.leases import Lease, LeaseTable
from sandboxd.core.leasing import Leasing
from sandboxd.core.lifecycle import SandboxRecord
from sandboxd.core.model_route import ModelLedger, ModelRoute
from sandboxd.core.operations import ExecRequest, Operations, paths_in_order
from sandboxd.core.quotas import Quotas
from sandboxd.core.reconciler import Reconciler
from sandboxd.core.registry import SandboxRegistry
from sandboxd.core.state import StateStore
from sandboxd.core.tenancy import current_tenant, pool_key
from sandboxd.errors import SandboxdError
from sandboxd.settings import Settings

__all__ = ["AcquireRequest", "ControlPlane", "ExecRequest", "paths_in_order"]


class ControlPlane:
    """Owns the registry, leasing, operations and the reconciler, and starts
    and stops them; its methods are theirs."""

    def __init__(
        self,
        settings: Settings,
        backend: Backend,
        store: StateStore,
        clock: Clock,
        *,
        meter: Meter | None = None,
    ) -> None:
        self.settings = settings
        self.backend = backend
        self.store = store
        self.clock = clock
        self.quotas = Quotas(settings.tenants, clock)
        # Scales every pool from its demand, within the global budget.
        self.reconciler = Reconciler.from_settings(settings.pools, backend, clock, meter)
        self.leases = LeaseTable()
        self.registry = SandboxRegistry(settings, backend, store, clock, self.quotas, self.reconciler)
        self.leasing = Leasing(settings, backend, store, clock, self.quotas, self.registry, self.leases)
        self.operations = Operations(settings, backend, self.registry, self.leasing)
        self.pools = self.registry.pools
        self.model_route = ModelRoute(
            self.leases, self._model_endpoint, ModelLedger(clock), gateway=settings.model_gateway.check()
        )
        """The metered model route: lease keys, the gateway, the calls recorded per trajectory."""
        if isinstance(backend, ModelRoutes):
            backend.use_model_gateway(self.model_route.gateway)
            self.operations.model_route = self.model_route
            if meter is not None:
                register_egress_meters(meter, backend, self.registry, self.model_route.ledger)
        self.images: ImageCache | None = None
        """The image cache, when the server runs one: pools pull the images
        acquires and announcements name through it, and pin them while used."""

        # The face callers have always used; each name is a part's own method.
        registry, leasing, operations = self.registry, self.leasing, self.operations
        self.create_pool = registry.create_pool
        self.get_pool = registry.get_pool
        self.list_pools = registry.list_pools
        self.update_pool = registry.update_pool
        self.resolve_limits = registry.resolve_limits
        self.sync_tenant_quotas = registry.sync_tenant_quotas
        self.get_sandbox = registry.get_sandbox
        self.list_sandboxes = registry.list_sandboxes
        self.leased = registry.leased
        self.is_live = registry.is_live
        self.delete_pool = leasing.delete_pool
        self.get_lease = leasing.get_lease
        self.heartbeat = leasing.heartbeat
        self.set_network = leasing.set_network
        self.release = leasing.release
        self.abandon = leasing.abandon
        self.release_request = leasing.release_request
        self.usage = leasing.usage
        self.using = leasing.using
        self.reap_expired = leasing.reap_expired
        self.sweep_orphans = leasing.sweep_orphans
        self.exec = operations.exec
        self.usage_of = operations.usage_of
        self.write_files = operations.write_files
        self.read_files = operations.read_files
        self.upload_directory = operations.upload_directory
        self.download_directory = operations.download_directory

    def _model_endpoint(self, pool_key: str) -> str:
        pool = self.registry.pools.get(pool_key)
        return pool.config.model_endpoint if pool is not None else ""

    # -- start and stop -----------------------------------------------------

    async def start(self) -> None:
        """Opens the store, re-creates the pools, takes back what a previous
        run left leased (destroying the rest), then starts the pools, the
        reconciler and the reaper."""
        await self.store.open()
        await self.backend.ping()
        # Set before the pools exist: each pool is handed the cache when made.
        self.registry.images = self.images
        await self.registry.load()
        await self.leasing.adopt()
        await self.registry.sync_tenant_quotas()
        # The host's capacity is the default ceiling of the global budget.
        overcommit = self.settings.pools.memory_overcommit
        limits = self.resolve_limits(Limits())
        await self.reconciler.estimate_capacity(lambda facts: capacity.estimate(facts, limits, overcommit))
        self.registry.start()
        self.reconciler.start()
        self.leasing.start()

    async def stop(self) -> None:
        """Stops without touching what clients hold: leased sandboxes stay and
        are adopted by the next start; warm and half-created ones are removed."""
        await self.leasing.stop()
        await self.reconciler.stop()
        await self.registry.stop()
        await self.model_route.gateway.close()
        await self.store.close()

    # -- acquire --------------------------------------------------------------

    @overload
    async def acquire(self, request: AcquireRequest, /) -> tuple[Lease, list[SandboxRecord]]: ...

    @overload
    async def acquire(
        self,
        request: str,
        n: int,
        min_n: int,
        labels: dict[str, str],
        ttl: float,
        timeout: float,
        call_remaining: float | None,
        limits: Limits | None = None,
        image: str = "",
        network: tuple[str, ...] = (),
        request_id: str = "",
    ) -> tuple[Lease, list[SandboxRecord]]: ...

    async def acquire(
        self,
        request: AcquireRequest | str,
        n: int = 1,
        min_n: int = 0,
        labels: dict[str, str] | None = None,
        ttl: float = 0.0,
        timeout: float = 0.0,
        call_remaining: float | None = None,
        limits: Limits | None = None,
        image: str = "",
        network: tuple[str, ...] = (),
        request_id: str = "",
    ) -> tuple[Lease, list[SandboxRecord]]:
        """``Leasing.acquire``. The positional form (pool name first) is kept
        for callers written before ``AcquireRequest``."""
        if isinstance(request, str):
            request = AcquireRequest(
                request,
                n,
                min_n,
                labels,
                ttl,
                timeout,
                call_remaining,
                limits,
                image=image,
                network=network,
                request_id=request_id,
            )
        # What a rollout's lifecycle reads of this acquire: when it was asked
        # for (a sandbox ready before then came warm) and whether it waited
        # for its image to be pulled.
        requested_at, pulled = self.clock.time(), self._will_pull(request)
        lease, records = await self.leasing.acquire(request)
        if not lease.requested_at:  # a repeated request id answers its first grant
            lease.requested_at, lease.image_pulled = requested_at, pulled
            for rec in records:
                rec.first_command_at = 0.0  # a recycled sandbox's first command was its last lease's
        return lease, records

    def _will_pull(self, request: AcquireRequest) -> bool:
        """Whether the acquire's image (one of the pool's task images) is absent and must be pulled first."""
        pool = self.registry.pools.get(pool_key(current_tenant(), request.pool))
        if pool is None or self.images is None or not request.image:
            return False
        try:
            image = pool.config.image_for(request.image)
        except SandboxdError:
            return False  # refused by the acquire itself, with its own answer
        return image != pool.config.image and not self.images.present(image)

    def prepare_exec(self, req: ExecRequest) -> tuple[SandboxRecord, ExecSpec]:
        """``Operations.prepare_exec``; stamps the sandbox's first command
        (a client's or a verifier's, not snapshot helpers'), which a rollout's
        lifecycle reads as the moment its work in the sandbox began."""
        rec, spec = self.operations.prepare_exec(req)
        if not rec.first_command_at:
            rec.first_command_at = self.clock.time()
        return rec, spec

    # -- read-only views kept for tests that look inside ------------------------

    @property
    def _index(self) -> Mapping[str, SandboxRecord]:
        return self.registry.records

    @property
    def _busy(self) -> Mapping[str, int]:
        return self.leasing.busy

    @property
    def _reaper(self) -> asyncio.Task[None] | None:
        return self.leasing.reaper
