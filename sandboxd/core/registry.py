"""The registry: this instance's pools and the records of their sandboxes.

It creates, changes and deletes pools (validating specs and resolving their
limits against the server's defaults and the tenant's ceiling), persists pool
specs, mirrors tenant quotas onto a backend that enforces them too, adopts at
start-up the sandboxes a previous run left, and answers lookups of sandboxes
per tenant (NOT_FOUND for another tenant's, with why a recent one is gone).

Leases are not its business: sandboxd.core.leasing hands sandboxes over and
takes them back through the face below.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from dataclasses import fields, replace

from sandboxd.backends.base import Backend, Limits, TenantQuotas
from sandboxd.clock import Clock
from sandboxd.core import validation as v
from sandboxd.core.bookkeeping import BusyCounts, Tombstones
from sandboxd.core.leases import Lease
from sandboxd.core.lifecycle import SandboxRecord, State
from sandboxd.core.live_setting import live_setting
from sandboxd.core.pools import PoolConfig, WarmPool, check_scaling
from sandboxd.core.pools.config import (
    check_images,
    check_model_endpoint,
    check_network,
    check_pull_secrets,
    network_refusal,
)
from sandboxd.core.pools.images import ImageSource
from sandboxd.core.pools.recycle import check_recycle, check_recycle_live
from sandboxd.core.quotas import Quotas
from sandboxd.core.reconciler import Reconciler
from sandboxd.core.root_setting import check_root, root_setting
from sandboxd.core.runtimes import check_runtime, fit_limits, runtime_name
from sandboxd.core.state import StateStore
from sandboxd.core.tenancy import current_tenant, owns, pool_key, split_pool_key
from sandboxd.errors import AlreadyExists, BackendError, FailedPrecondition, InvalidArgument, NotFound
from sandboxd.settings import Settings

log = logging.getLogger(__name__)

_GONE_TOMBSTONES = 100_000


class SandboxRegistry:
    """Pools by internal key and every visible sandbox record by id."""

    def __init__(
        self,
        settings: Settings,
        backend: Backend,
        store: StateStore,
        clock: Clock,
        quotas: Quotas,
        reconciler: Reconciler,
    ) -> None:
        self._settings = settings
        self._backend = backend
        self._store = store
        self._clock = clock
        self._quotas = quotas
        self._reconciler = reconciler
        self.pools: dict[str, WarmPool] = {}
        self.images: ImageSource | None = None
        """The image cache the pools pull through and pin images in (None = none:
        a pool's other images must already be on the backend)."""
        # Records from READY until GONE (a CREATING one is not visible yet).
        self._records: dict[str, SandboxRecord] = {}
        # Per sandbox gone recently: (its tenant, why it went).
        self._gone: Tombstones[tuple[str, str]] = Tombstones(_GONE_TOMBSTONES)
        self._started = False
        self.busy = BusyCounts()
        """Operations in flight per sandbox id, counted by leasing: a busy
        sandbox is never recycled."""

    @property
    def records(self) -> Mapping[str, SandboxRecord]:
        """Every visible sandbox record by id, of all tenants."""
        return self._records

    # -- start and stop -----------------------------------------------------

    async def load(self) -> None:
        """Re-creates the pools the store holds, then the configured presets."""
        for config in await self._store.load_pools():
            self._add_pool(config)
        for preset in self._settings.presets:
            if preset.name not in self.pools:
                await self.create_pool(
                    PoolConfig(
                        preset.name,
                        preset.image,
                        preset.min_ready,
                        preset.max_size,
                        Limits(),
                        runtime=preset.runtime,
                    )
                )

    def start(self) -> None:
        """Starts every pool; pools created from now on start at once."""
        for pool in self.pools.values():
            pool.start()
        self._started = True

    async def stop(self) -> None:
        """Closes every pool; leased sandboxes stay for the next start to adopt."""
        await asyncio.gather(*(p.close(destroy_leased=False) for p in self.pools.values()))

    async def adopt(self, lease_of: Mapping[str, Lease]) -> list[str]:
        """Takes back the running sandboxes the backend holds that ``lease_of``
        (sandbox id -> restored lease) names, appending them to their lease;
        returns the handles of the rest, which the caller destroys (a warm
        sandbox's cleanliness cannot be proven after a crash)."""
        now_wall = self._clock.time()
        doomed: list[str] = []
        for found in await self._backend.list():
            lease = lease_of.get(found.sandbox_id)
            pool = self.pools.get(found.pool)
            if lease is None or pool is None or not found.running:
                doomed.append(found.handle)
                continue
            rec = SandboxRecord(
                sandbox_id=found.sandbox_id,
                pool=found.pool,
                # A template pool's sandbox has its own image (older ones
                # recorded none: the pool's was theirs).
                image=found.image or pool.config.image,
                limits=pool.config.limits,
                state=State.LEASED,
                handle=found.handle,
                lease_id=lease.lease_id,
                labels={**pool.config.labels, **lease.labels},
            )
            rec.entered[State.LEASED] = now_wall
            pool.adopt(rec)
            self._records[rec.sandbox_id] = rec
            lease.sandbox_ids.append(rec.sandbox_id)
        return doomed

    # -- pools --------------------------------------------------------------

    def resolve_limits(self, limits: Limits) -> Limits:
        """Fills unset limits from the server defaults (capped at the current
        tenant's ceiling) and checks every value against the server's bounds
        and the ceiling (INVALID_ARGUMENT naming ``spec.limits.*``)."""
        d = self._settings.limits
        ceiling = self._quotas.of(current_tenant()).ceiling

        def pick(name: str) -> int:
            value = int(getattr(limits, name))
            if value:
                return value
            default, top = int(getattr(d, name)), int(getattr(ceiling, name))
            return min(default, top) if top and default else default or top

        resolved = Limits(**{f.name: pick(f.name) for f in fields(Limits)})
        bounds = {
            "memory_bytes": (16 << 20, 1 << 40),
            "cpu_millis": (10, 256_000),
            "pids": (8, 1 << 22),
            "disk_bytes": (1 << 20, 1 << 40),
            "max_files": (16, 1 << 30),
            "output_bytes": (1, self._settings.exec.max_output_bytes),
            "lifetime_seconds": (0, 30 * 24 * 3600),
        }
        for name, (low, high) in bounds.items():
            value = getattr(resolved, name)
            if not low <= value <= high:
                raise InvalidArgument(f"spec.limits.{name}", f"must be between {low} and {high}, got {value}")
        self._quotas.check_ceiling(current_tenant(), resolved, "spec.limits")
        return resolved

    def _check_sizes(self, min_ready: int, max_size: int) -> None:
        if min_ready < 0:
            raise InvalidArgument("spec.min_ready", f"must be >= 0, got {min_ready}")
        if max_size < 1:
            raise InvalidArgument("spec.max_size", f"must be >= 1, got {max_size}")
        if max_size > self._settings.pools.max_pool_size:
            raise InvalidArgument("spec.max_size", f"must be <= {self._settings.pools.max_pool_size}")
        if min_ready > max_size:
            raise InvalidArgument("spec.min_ready", f"({min_ready}) must not exceed max_size ({max_size})")

    def _add_pool(self, config: PoolConfig) -> WarmPool:
        pool = WarmPool(
            config,
            self._backend,
            self._clock,
            host=self._reconciler,
            max_starting=self._settings.pools.max_starting,
            create_timeout=self._settings.pools.create_timeout_seconds,
            on_change=self._track,
            tuning=self._reconciler.tuning,
            meters=self._reconciler.meters,
            images=self.images,
            busy=self.busy.busy,
        )
        self.pools[config.name] = pool
        return pool

    def _track(self, rec: SandboxRecord) -> None:
        if rec.state is State.GONE:
            if self._records.pop(rec.sandbox_id, None) is not None:
                self._gone.add(
                    rec.sandbox_id, (split_pool_key(rec.pool)[0], rec.failure_reason or "released")
                )
        else:
            self._records[rec.sandbox_id] = rec

    async def sync_tenant_quotas(self) -> None:
        """Mirrors each tenant's quota onto a backend that enforces quotas
        too (TenantQuotas), as a backstop: sandboxd counts leased sandboxes,
        the backend counts every sandbox, so the tenant's pools' warm
        ceilings (max of min_ready and max_ready) are added. A failure is
        logged, not raised: sandboxd's own admission still holds."""
        if not isinstance(self._backend, TenantQuotas):
            return
        for tenant, quota in self._settings.tenants.items():
            if not (quota.max_sandboxes or quota.max_memory_bytes):
                continue
            warm = [
                (max(p.config.min_ready, p.config.max_ready), p.config.limits.memory_bytes)
                for key, p in self.pools.items()
                if split_pool_key(key)[0] == tenant
            ]
            pods = quota.max_sandboxes + sum(n for n, _ in warm) if quota.max_sandboxes else 0
            memory = quota.max_memory_bytes + sum(n * m for n, m in warm) if quota.max_memory_bytes else 0
            try:
                await self._backend.set_tenant_quota(tenant, pods, memory)
            except BackendError as e:
                log.warning("tenant %s: backend quota not updated: %s", tenant, e)

    async def create_pool(self, config: PoolConfig) -> WarmPool:
        """Creates a pool of the current tenant; ``config.name`` is the name the
        tenant chose, stored under the tenant's internal key."""
        name = v.pool_name("spec.name", config.name)
        v.image_ref("spec.image", config.image)
        self._check_sizes(config.min_ready, config.max_size)
        check_scaling(config)
        check_images(config)
        check_network(config)
        check_model_endpoint(config)
        check_pull_secrets(config, self._backend)
        check_recycle(config, self._backend)
        check_root(config)
        v.labels("spec.labels", config.labels)
        v.env("spec.env", config.env)
        runtime = runtime_name(config.runtime)
        explicit = config.limits
        config = replace(
            config,
            name=pool_key(current_tenant(), name),
            limits=fit_limits(runtime, self.resolve_limits(config.limits)),
            created_at=self._clock.time(),
            runtime=runtime,
        )
        if config.name in self.pools:
            raise AlreadyExists(f"pool {name!r} already exists")
        if not await self._backend.image_exists(config.image):
            raise FailedPrecondition(
                f"image {config.image!r} is not present on the backend (sandboxd never pulls; "
                "build or load it first, e.g. `sandboxd image build` for the default image)"
            )
        await check_runtime(self._backend, runtime, explicit)
        refusal = network_refusal(self._backend, runtime, config.network, bool(config.model_endpoint))
        if refusal is not None:
            raise FailedPrecondition(f"pool {name!r}: {refusal}")
        config = replace(config, root=await root_setting(config, self._backend))
        config = replace(config, live_snapshots=live_setting(config, self._backend))
        check_recycle_live(config)
        # Checked again: another create of the same name may have finished meanwhile.
        if config.name in self.pools:
            raise AlreadyExists(f"pool {name!r} already exists")
        await self._store.save_pool(config)
        pool = self._add_pool(config)
        if self._started:
            await self.sync_tenant_quotas()
            pool.start()
        return pool

    def get_pool(self, name: str, field: str = "name") -> WarmPool:
        """The current tenant's pool called ``name``."""
        v.pool_name(field, name)
        pool = self.pools.get(pool_key(current_tenant(), name))
        if pool is None:
            raise NotFound(f"pool {name!r} not found")
        return pool

    def list_pools(self) -> list[WarmPool]:
        """The current tenant's pools, by name."""
        return sorted((p for p in self.pools.values() if owns(p.config.name)), key=lambda p: p.config.name)

    async def update_pool(
        self, name: str, min_ready: int | None, max_size: int | None, max_ready: int | None = None
    ) -> WarmPool:
        """Changes a pool's sizes (None = keep); shrinking destroys warm sandboxes above the new floor."""
        pool = self.get_pool(name)
        new_min = pool.config.min_ready if min_ready is None else min_ready
        new_max = pool.config.max_size if max_size is None else max_size
        self._check_sizes(new_min, new_max)
        updated = replace(pool.config, min_ready=new_min, max_size=new_max)
        if max_ready is not None:
            updated = replace(updated, max_ready=max_ready)
        check_scaling(updated)
        pool.config = updated
        await self._store.save_pool(pool.config)
        await self.sync_tenant_quotas()
        surplus = pool.ready - new_min
        if surplus > 0:
            for rec in [r for r in pool.records.values() if r.state is State.READY][:surplus]:
                pool.release(rec, "pool shrank")
        pool.poke()
        return pool

    def unregister_pool(self, name: str, force: bool) -> WarmPool:
        """First step of deleting the current tenant's pool: refuses one with
        leased sandboxes unless ``force``, and takes it out of the registry."""
        pool = self.get_pool(name)
        leased = pool.count(State.LEASED)
        if leased and not force:
            raise FailedPrecondition(
                f"pool {name!r} has {leased} leased sandboxes; release them or delete with force"
            )
        del self.pools[pool.config.name]
        return pool

    async def dispose_pool(self, pool: WarmPool) -> None:
        """Last step of deleting a pool: its spec, its sandboxes (leased ones
        too) and its share of the tenant's backend quota go."""
        await self._store.delete_pool(pool.config.name)
        await pool.close(destroy_leased=True)
        await self.sync_tenant_quotas()

    # -- sandboxes ----------------------------------------------------------

    def get_sandbox(self, sandbox_id: str) -> SandboxRecord:
        """The current tenant's sandbox (NOT_FOUND, with why if it went recently)."""
        v.object_id("sandbox_id", sandbox_id, "sandbox")
        rec = self._records.get(sandbox_id)
        if rec is not None and not owns(rec.pool):
            rec = None
        if rec is None:
            tenant, why = self._gone.get(sandbox_id) or ("", "")
            suffix = f" ({why})" if why and tenant == current_tenant() else ""
            raise NotFound(f"sandbox {sandbox_id!r} not found{suffix}")
        return rec

    def list_sandboxes(self, pool: str, state: State | None, labels: dict[str, str]) -> list[SandboxRecord]:
        """The current tenant's sandboxes, filtered by pool, state and labels (each optional)."""
        key = self.get_pool(pool, "pool").config.name if pool else ""
        labels = v.labels("labels", labels)  # a filter no label could match is a mistake: say so
        out = []
        for rec in self._records.values():
            if key and rec.pool != key:
                continue
            if not owns(rec.pool):
                continue
            if state is not None and rec.state is not state:
                continue
            if any(rec.labels.get(k) != val for k, val in labels.items()):
                continue
            out.append(rec)
        return out

    def leased(self, sandbox_id: str) -> SandboxRecord:
        """The current tenant's leased sandbox (NOT_FOUND / FAILED_PRECONDITION otherwise)."""
        rec = self.get_sandbox(sandbox_id)
        if rec.state in (State.RELEASING, State.FAILED):
            raise NotFound(f"sandbox {sandbox_id} was {rec.failure_reason or 'released'}")
        if rec.state is not State.LEASED:
            raise FailedPrecondition(
                f"sandbox {sandbox_id} is {rec.state.name}, not LEASED; acquire it first"
            )
        if rec.paused:
            raise FailedPrecondition(f"sandbox {sandbox_id} is paused; resume it first")
        return rec

    def is_live(self, sandbox_id: str) -> bool:
        """Whether the sandbox exists and has not gone (any tenant)."""
        return sandbox_id in self._records

    def is_gone(self, sandbox_id: str) -> bool:
        """Whether the sandbox went recently (it is remembered as gone)."""
        return sandbox_id in self._gone

    def known_ids(self) -> set[str]:
        """Ids of every sandbox a pool holds, those still being created included."""
        return {sid for pool in self.pools.values() for sid in pool.records}

    def handles(self, sandbox_ids: Iterable[str]) -> list[str]:
        """Backend handles of those of the sandboxes that are visible."""
        return [rec.handle for sid in sandbox_ids if (rec := self._records.get(sid)) is not None]

    def release(self, sandbox_id: str, reason: str) -> None:
        """Destroys the sandbox in the background (its pool refills)."""
        rec = self._records.get(sandbox_id)
        if rec is None:
            return
        pool = self.pools.get(rec.pool)
        if pool is not None:
            pool.release(rec, reason)

    def fail(self, rec: SandboxRecord, reason: str) -> None:
        """Marks the sandbox lost; its pool cleans it up and replaces it."""
        pool = self.pools.get(rec.pool)
        if pool is not None:
            pool.fail(rec, reason)
