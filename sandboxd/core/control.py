"""The control plane: pools, leases and the operations on leased sandboxes.
The API layer is a thin translation of these methods; everything here speaks
sandboxd types and raises sandboxd errors."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import tempfile
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, fields, replace
from typing import IO

from opentelemetry.metrics import Meter

from sandboxd.backends.base import (
    WORKSPACE,
    Backend,
    ExecEvent,
    ExecResult,
    ExecSpec,
    Limits,
    SandboxUsage,
    TenantQuotas,
)
from sandboxd.clock import Clock
from sandboxd.core import validation as v
from sandboxd.core.files import FileData, build_tar, check_upload, parse_read_tar, relative
from sandboxd.core.leases import Lease, LeaseTable, new_lease_id
from sandboxd.core.lifecycle import SandboxRecord, State
from sandboxd.core.pools import PoolConfig, WarmPool, check_scaling
from sandboxd.core.quotas import Quotas, Usage
from sandboxd.core.reconciler import Reconciler
from sandboxd.core.store import Store
from sandboxd.core.tenancy import current_tenant, owns, pool_key, split_pool_key
from sandboxd.errors import (
    AlreadyExists,
    BackendError,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
)
from sandboxd.settings import Settings

log = logging.getLogger(__name__)

# An Acquire answers this long before the caller's deadline so the answer
# (success or DEADLINE_EXCEEDED with nothing leased) arrives in time.
_DEADLINE_MARGIN = 0.05
_GONE_TOMBSTONES = 100_000


@dataclass(frozen=True)
class ExecRequest:
    """An exec as the API received it, before validation."""

    sandbox_id: str
    argv: list[str] | None = None
    shell: str | None = None
    cwd: str = ""
    env: dict[str, str] | None = None
    timeout: float = 0.0
    stdin: bytes = b""
    output_limit: int = 0
    session: str = ""


class ControlPlane:
    def __init__(
        self,
        settings: Settings,
        backend: Backend,
        store: Store,
        clock: Clock,
        *,
        meter: Meter | None = None,
    ) -> None:
        self.settings = settings
        self.backend = backend
        self.store = store
        self.clock = clock
        self.pools: dict[str, WarmPool] = {}
        self.leases = LeaseTable()
        self._index: dict[str, SandboxRecord] = {}
        self._gone: OrderedDict[str, tuple[str, str]] = OrderedDict()
        self._busy: dict[str, int] = {}
        self._orphan_suspects: set[str] = set()
        self.quotas = Quotas(settings.tenants, clock)
        # Leased sandboxes per tenant with their memory limit, kept current by
        # _track so quota checks cost O(1).
        self._leased_by_tenant: dict[str, dict[str, int]] = {}
        self._reaper: asyncio.Task[None] | None = None
        # Scales every pool from its demand, within the global budget.
        self.reconciler = Reconciler.from_settings(settings.pools, backend, clock, meter)

    # -- start and stop -----------------------------------------------------

    async def start(self) -> None:
        await self.store.open()
        await self.backend.ping()
        for config in await self.store.load_pools():
            self._add_pool(config)
        for preset in self.settings.presets:
            if preset.name not in self.pools:
                await self.create_pool(
                    PoolConfig(preset.name, preset.image, preset.min_ready, preset.max_size, Limits())
                )
        await self._adopt()
        await self.sync_tenant_quotas()
        for pool in self.pools.values():
            pool.start()
        self.reconciler.start()
        self._reaper = asyncio.create_task(self._reap_loop(), name="lease-reaper")

    async def _adopt(self) -> None:
        """Takes back leased sandboxes a previous run left; destroys the rest
        (a warm sandbox's cleanliness cannot be proven after a crash)."""
        now_wall = self.clock.time()
        now = self.clock.monotonic()
        persisted = await self.store.load_leases()
        lease_of: dict[str, Lease] = {}
        for lease_id, pool_name, sandbox_ids, ttl, expires_wall, labels in persisted:
            if expires_wall <= now_wall or pool_name not in self.pools:
                continue
            restored = Lease(
                lease_id, pool_name, [], ttl, now + (expires_wall - now_wall), expires_wall, labels
            )
            for sid in sandbox_ids:
                lease_of[sid] = restored
        doomed: list[str] = []
        for found in await self.backend.list():
            lease = lease_of.get(found.sandbox_id)
            pool = self.pools.get(found.pool)
            if lease is None or pool is None or not found.running:
                doomed.append(found.handle)
                continue
            rec = SandboxRecord(
                sandbox_id=found.sandbox_id,
                pool=found.pool,
                image=pool.config.image,
                limits=pool.config.limits,
                state=State.LEASED,
                handle=found.handle,
                lease_id=lease.lease_id,
                labels={**pool.config.labels, **lease.labels},
            )
            rec.entered[State.LEASED] = now_wall
            pool.adopt(rec)
            self._index[rec.sandbox_id] = rec
            lease.sandbox_ids.append(rec.sandbox_id)
        adopted = {lease.lease_id: lease for lease in lease_of.values() if lease.sandbox_ids}
        for lease in adopted.values():
            self.leases.add(lease)
        for lease_id, *_ in persisted:
            if lease_id not in adopted:
                await self.store.delete_lease(lease_id)
            else:
                await self.store.save_lease(adopted[lease_id], self._handles(adopted[lease_id]))
        results = await asyncio.gather(*(self.backend.destroy(h) for h in doomed), return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        log.info(
            "adoption: %d sandboxes kept under %d leases, %d destroyed (%d failed)",
            sum(len(lease.sandbox_ids) for lease in adopted.values()),
            len(adopted),
            len(doomed),
            len(failures),
        )

    async def stop(self) -> None:
        """Stops without touching what clients hold: leased sandboxes stay and
        are adopted by the next start; warm and half-created ones are removed."""
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        await self.reconciler.stop()
        await asyncio.gather(*(p.close(destroy_leased=False) for p in self.pools.values()))
        await self.store.close()

    # -- pools --------------------------------------------------------------

    def usage(self, tenant: str) -> Usage:
        leased = self._leased_by_tenant.get(tenant, {})
        return Usage(sandboxes=len(leased), memory_bytes=sum(leased.values()))

    def _resolve_limits(self, limits: Limits) -> Limits:
        """Fills unset limits from the server defaults (capped at the tenant's
        ceiling) and checks every value against the server's bounds and the
        ceiling."""
        d = self.settings.limits
        ceiling = self.quotas.of(current_tenant()).ceiling

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
            "output_bytes": (1, self.settings.exec.max_output_bytes),
            "lifetime_seconds": (0, 30 * 24 * 3600),
        }
        for name, (low, high) in bounds.items():
            value = getattr(resolved, name)
            if not low <= value <= high:
                raise InvalidArgument(f"spec.limits.{name}", f"must be between {low} and {high}, got {value}")
        self.quotas.check_ceiling(current_tenant(), resolved, "spec.limits")
        return resolved

    def _check_sizes(self, min_ready: int, max_size: int) -> None:
        if min_ready < 0:
            raise InvalidArgument("spec.min_ready", f"must be >= 0, got {min_ready}")
        if max_size < 1:
            raise InvalidArgument("spec.max_size", f"must be >= 1, got {max_size}")
        if max_size > self.settings.pools.max_pool_size:
            raise InvalidArgument("spec.max_size", f"must be <= {self.settings.pools.max_pool_size}")
        if min_ready > max_size:
            raise InvalidArgument("spec.min_ready", f"({min_ready}) must not exceed max_size ({max_size})")

    def _add_pool(self, config: PoolConfig) -> WarmPool:
        pool = WarmPool(
            config,
            self.backend,
            self.clock,
            max_starting=self.settings.pools.max_starting,
            create_timeout=self.settings.pools.create_timeout_seconds,
            on_change=self._track,
            host=self.reconciler,
            tuning=self.reconciler.tuning,
            meters=self.reconciler.meters,
        )
        self.pools[config.name] = pool
        return pool

    async def sync_tenant_quotas(self) -> None:
        """Mirrors each tenant's quota onto a backend that enforces quotas
        too (TenantQuotas), as a backstop: sandboxd counts leased sandboxes,
        the backend counts every sandbox, so the tenant's pools' warm
        ceilings (max of min_ready and max_ready) are added. A failure is
        logged, not raised: sandboxd's own admission still holds."""
        if not isinstance(self.backend, TenantQuotas):
            return
        for tenant, quota in self.settings.tenants.items():
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
                await self.backend.set_tenant_quota(tenant, pods, memory)
            except BackendError as e:
                log.warning("tenant %s: backend quota not updated: %s", tenant, e)

    def _track(self, rec: SandboxRecord) -> None:
        tenant = split_pool_key(rec.pool)[0]
        if rec.state is State.LEASED:
            self._leased_by_tenant.setdefault(tenant, {})[rec.sandbox_id] = rec.limits.memory_bytes
        else:
            self._leased_by_tenant.get(tenant, {}).pop(rec.sandbox_id, None)
        if rec.state is State.GONE:
            if self._index.pop(rec.sandbox_id, None) is not None:
                self._gone[rec.sandbox_id] = (tenant, rec.failure_reason or "released")
                while len(self._gone) > _GONE_TOMBSTONES:
                    self._gone.popitem(last=False)
        else:
            self._index[rec.sandbox_id] = rec

    async def create_pool(self, config: PoolConfig) -> WarmPool:
        """Creates a pool of the current tenant; ``config.name`` is the name the
        tenant chose, stored under the tenant's internal key."""
        name = v.pool_name("spec.name", config.name)
        v.image_ref("spec.image", config.image)
        self._check_sizes(config.min_ready, config.max_size)
        check_scaling(config)
        v.labels("spec.labels", config.labels)
        v.env("spec.env", config.env)
        config = replace(
            config,
            name=pool_key(current_tenant(), name),
            limits=self._resolve_limits(config.limits),
            created_at=self.clock.time(),
        )
        if config.name in self.pools:
            raise AlreadyExists(f"pool {name!r} already exists")
        if not await self.backend.image_exists(config.image):
            raise FailedPrecondition(
                f"image {config.image!r} is not present on the backend (sandboxd never pulls; "
                "build or load it first, e.g. `sandboxd image build` for the default image)"
            )
        if config.name in self.pools:
            raise AlreadyExists(f"pool {name!r} already exists")
        await self.store.save_pool(config)
        pool = self._add_pool(config)
        if self._reaper is not None:
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

    async def update_pool(
        self, name: str, min_ready: int | None, max_size: int | None, max_ready: int | None = None
    ) -> WarmPool:
        pool = self.get_pool(name)
        new_min = pool.config.min_ready if min_ready is None else min_ready
        new_max = pool.config.max_size if max_size is None else max_size
        self._check_sizes(new_min, new_max)
        updated = replace(pool.config, min_ready=new_min, max_size=new_max)
        if max_ready is not None:
            updated = replace(updated, max_ready=max_ready)
        check_scaling(updated)
        pool.config = updated
        await self.store.save_pool(pool.config)
        await self.sync_tenant_quotas()
        surplus = pool.ready - new_min
        if surplus > 0:
            # Shrinking: warm sandboxes above the new floor are destroyed.
            for rec in [r for r in pool.records.values() if r.state is State.READY][:surplus]:
                pool.release(rec, "pool shrank")
        pool.poke()
        return pool

    async def delete_pool(self, name: str, force: bool) -> None:
        pool = self.get_pool(name)
        leased = pool.count(State.LEASED)
        if leased and not force:
            raise FailedPrecondition(
                f"pool {name!r} has {leased} leased sandboxes; release them or delete with force"
            )
        key = pool.config.name
        del self.pools[key]
        for lease in [lease for lease in self.leases.all() if lease.pool == key]:
            self.leases.remove(lease.lease_id)
            await self.store.delete_lease(lease.lease_id)
        await self.store.delete_pool(key)
        await pool.close(destroy_leased=True)
        await self.sync_tenant_quotas()

    # -- leases -------------------------------------------------------------

    async def acquire(
        self,
        pool_name: str,
        n: int,
        min_n: int,
        labels: dict[str, str],
        ttl: float,
        timeout: float,
        call_remaining: float | None,
        limits: Limits | None = None,
    ) -> tuple[Lease, list[SandboxRecord]]:
        """Leases n sandboxes of the current tenant's pool. ``limits`` lowers
        memory, CPU, pids, output or lifetime for these sandboxes only, within
        the pool's own limits."""
        pool = self.get_pool(pool_name, "pool")
        n = n or 1
        if n < 1:
            raise InvalidArgument("n", f"must be >= 1, got {n}")
        if min_n < 0 or min_n > n:
            raise InvalidArgument("min_n", f"must be between 0 and n ({n}), got {min_n}")
        labels = v.labels("labels", labels)
        ttl = v.non_negative("lease_ttl_seconds", ttl, self.settings.leases.max_ttl_seconds)
        ttl = ttl or self.settings.leases.default_ttl_seconds
        timeout = v.non_negative("timeout_seconds", timeout)
        need = min_n or n
        if need > pool.config.max_size:
            raise FailedPrecondition(
                f"pool {pool_name!r} holds at most {pool.config.max_size} sandboxes; "
                f"{need} can never be leased"
            )
        effective = self._acquire_limits(pool.config.limits, limits)
        wait = timeout or self.settings.pools.max_acquire_wait_seconds
        if call_remaining is not None:
            wait = min(wait, max(0.0, call_remaining - _DEADLINE_MARGIN))
        tenant = current_tenant()
        self.quotas.admit(
            tenant, need, effective.memory_bytes, self.usage(tenant), lambda: self._retry_hint(tenant)
        )
        try:
            records = await pool.acquire(min(n, pool.config.max_size), min_n, wait)
        except BaseException:
            self.quotas.refund(tenant, need)
            raise
        if effective != pool.config.limits:
            records = await self._apply_limits(pool, records, effective)
        now, wall = self.clock.monotonic(), self.clock.time()
        lifetime = effective.lifetime_seconds
        lease = Lease(
            lease_id=new_lease_id(),
            pool=pool.config.name,
            sandbox_ids=[r.sandbox_id for r in records],
            ttl=ttl,
            expires_at=now + ttl,
            expires_wall=wall + ttl,
            labels=labels,
            hard_deadline=now + lifetime if lifetime else 0.0,
        )
        self.leases.extend(lease, ttl, now, wall)
        pool.mark_leased(records, lease.lease_id)
        for rec in records:
            rec.labels.update(labels)
        self.leases.add(lease)
        try:
            await self.store.save_lease(lease, self._handles(lease))
        except BaseException:
            # The client will never learn of this lease: give the sandboxes up.
            await self._release_lease(lease, "acquire abandoned")
            raise
        return lease, records

    def _acquire_limits(self, ceiling: Limits, asked: Limits | None) -> Limits:
        if asked is None or asked == Limits():
            return ceiling
        for name in ("disk_bytes", "max_files"):
            value = getattr(asked, name)
            if value and value != getattr(ceiling, name):
                raise InvalidArgument(
                    f"limits.{name}", "the workspace size is fixed by the pool; create a pool for other sizes"
                )
        out = {}
        for name in ("memory_bytes", "cpu_millis", "pids", "output_bytes", "lifetime_seconds"):
            value, top = getattr(asked, name), getattr(ceiling, name)
            if value < 0:
                raise InvalidArgument(f"limits.{name}", f"must be >= 0, got {value}")
            if value and top and value > top:
                raise InvalidArgument(f"limits.{name}", f"{value} is above the pool's limit of {top}")
            out[name] = value or top
        if out["memory_bytes"] < 16 << 20:
            raise InvalidArgument("limits.memory_bytes", "must be at least 16 MiB")
        if out["pids"] < 8:
            raise InvalidArgument("limits.pids", "must be at least 8")
        return replace(ceiling, **out)

    async def _apply_limits(
        self, pool: WarmPool, records: list[SandboxRecord], limits: Limits
    ) -> list[SandboxRecord]:
        results = await asyncio.gather(
            *(self.backend.update_limits(r.handle, limits) for r in records), return_exceptions=True
        )
        failed = [r for r, res in zip(records, results, strict=True) if isinstance(res, BaseException)]
        if failed:
            for rec in records:
                pool.fail(rec, "could not apply per-acquire limits")
            raise FailedPrecondition(
                f"could not apply the requested limits: {results[records.index(failed[0])]}"
            )
        for rec in records:
            rec.limits = limits
        return records

    def _retry_hint(self, tenant: str) -> float:
        """Seconds until one of the tenant's leases expires (at least 0.5, at most 30)."""
        now = self.clock.monotonic()
        soonest = min(
            (
                lease.expires_at - now
                for lease in self.leases.all()
                if split_pool_key(lease.pool)[0] == tenant
            ),
            default=1.0,
        )
        return round(min(30.0, max(0.5, soonest)), 3)

    def get_lease(self, lease_id: str) -> Lease:
        v.object_id("lease_id", lease_id, "lease")
        lease = self.leases.get(lease_id)
        if not owns(lease.pool):
            raise NotFound(f"lease {lease_id!r} not found (expired, released or never issued)")
        return lease

    async def heartbeat(self, lease_id: str, ttl: float) -> Lease:
        lease = self.get_lease(lease_id)
        ttl = v.non_negative("ttl_seconds", ttl, self.settings.leases.max_ttl_seconds) or lease.ttl
        self.leases.extend(lease, ttl, self.clock.monotonic(), self.clock.time())
        await self.store.save_lease(lease, self._handles(lease))
        return lease

    async def release(self, lease_id: str, sandbox_ids: list[str]) -> list[str]:
        v.object_id("lease_id", lease_id, "lease")
        lease = self.leases.find(lease_id)
        if lease is not None and not owns(lease.pool):
            lease = None
        if lease is None:
            if self.leases.was_released(lease_id):
                return []
            raise NotFound(f"lease {lease_id!r} not found (expired, released or never issued)")
        if not sandbox_ids:
            return await self._release_lease(lease, "released")
        for i, sid in enumerate(sandbox_ids):
            if sid not in lease.sandbox_ids and sid not in self._gone:
                raise NotFound(f"sandbox_ids[{i}]: {sid!r} is not held by lease {lease_id}")
        released = []
        for sid in sandbox_ids:
            if sid in lease.sandbox_ids:
                self._release_one(sid, "released")
                self.leases.drop_sandbox(lease, sid)
                released.append(sid)
        if self.leases.find(lease_id) is None:
            await self.store.delete_lease(lease_id)
        else:
            await self.store.save_lease(lease, self._handles(lease))
        return released

    def _handles(self, lease: Lease) -> list[str]:
        return [rec.handle for sid in lease.sandbox_ids if (rec := self._index.get(sid)) is not None]

    async def _release_lease(self, lease: Lease, reason: str) -> list[str]:
        released = list(lease.sandbox_ids)
        for sid in released:
            self._release_one(sid, reason)
        self.leases.remove(lease.lease_id)
        await self.store.delete_lease(lease.lease_id)
        return released

    def list_pools(self) -> list[WarmPool]:
        return sorted((p for p in self.pools.values() if owns(p.config.name)), key=lambda p: p.config.name)

    def _release_one(self, sandbox_id: str, reason: str) -> None:
        rec = self._index.get(sandbox_id)
        if rec is None:
            return
        pool = self.pools.get(rec.pool)
        if pool is not None:
            pool.release(rec, reason)

    async def _reap_loop(self) -> None:
        next_sweep = self.clock.monotonic() + self.settings.leases.orphan_sweep_seconds
        while True:
            await asyncio.sleep(self.settings.leases.reap_interval_seconds)
            try:
                await self.reap_expired()
                if self.settings.leases.orphan_sweep_seconds and self.clock.monotonic() >= next_sweep:
                    next_sweep = self.clock.monotonic() + self.settings.leases.orphan_sweep_seconds
                    await self.sweep_orphans()
            except Exception:  # keep reaping whatever one round hit
                log.exception("lease reaper round failed")

    async def sweep_orphans(self) -> int:
        """Destroys what the backend holds under this instance's labels but no
        pool knows: remains of a create or destroy that failed while the
        engine was unreachable. A sandbox must be unknown on two sweeps in a
        row, so a create still in flight is never taken for an orphan."""
        try:
            found = await self.backend.list()
        except BackendError as e:
            log.warning("orphan sweep skipped: %s", e)
            return 0
        known = {sid for pool in self.pools.values() for sid in pool.records}
        unknown = {f.handle for f in found if f.sandbox_id not in known}
        doomed = unknown & self._orphan_suspects
        self._orphan_suspects = unknown - doomed
        if doomed:
            log.warning("removing %d orphaned sandboxes", len(doomed))
            await asyncio.gather(*(self.backend.destroy(h) for h in doomed), return_exceptions=True)
        return len(doomed)

    async def reap_expired(self) -> int:
        """Releases leases past their expiry; leases with commands still
        running are kept until those finish."""
        count = 0
        for lease in self.leases.expired(self.clock.monotonic()):
            if any(self._busy.get(sid) for sid in lease.sandbox_ids) and not (
                lease.hard_deadline and lease.hard_deadline <= self.clock.monotonic()
            ):
                continue
            log.info("lease %s expired; reclaiming %d sandboxes", lease.lease_id, len(lease.sandbox_ids))
            await self._release_lease(lease, "lease expired")
            count += 1
        return count

    # -- sandboxes ----------------------------------------------------------

    def get_sandbox(self, sandbox_id: str) -> SandboxRecord:
        v.object_id("sandbox_id", sandbox_id, "sandbox")
        rec = self._index.get(sandbox_id)
        if rec is not None and not owns(rec.pool):
            rec = None
        if rec is None:
            tenant, why = self._gone.get(sandbox_id, ("", ""))
            suffix = f" ({why})" if why and tenant == current_tenant() else ""
            raise NotFound(f"sandbox {sandbox_id!r} not found{suffix}")
        return rec

    def list_sandboxes(self, pool: str, state: State | None, labels: dict[str, str]) -> list[SandboxRecord]:
        key = self.get_pool(pool, "pool").config.name if pool else ""
        out = []
        for rec in self._index.values():
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

    def _leased(self, sandbox_id: str) -> SandboxRecord:
        rec = self.get_sandbox(sandbox_id)
        if rec.state in (State.RELEASING, State.FAILED):
            raise NotFound(f"sandbox {sandbox_id} was {rec.failure_reason or 'released'}")
        if rec.state is not State.LEASED:
            raise FailedPrecondition(
                f"sandbox {sandbox_id} is {rec.state.name}, not LEASED; acquire it first"
            )
        return rec

    @contextlib.contextmanager
    def _using(self, rec: SandboxRecord) -> Iterator[None]:
        self._busy[rec.sandbox_id] = self._busy.get(rec.sandbox_id, 0) + 1
        try:
            yield
        finally:
            left = self._busy[rec.sandbox_id] - 1
            if left:
                self._busy[rec.sandbox_id] = left
            else:
                del self._busy[rec.sandbox_id]

    def prepare_exec(self, req: ExecRequest) -> tuple[SandboxRecord, ExecSpec]:
        rec = self._leased(req.sandbox_id)
        s = self.settings.exec
        if req.argv is not None:
            argv, shell = v.argv("argv", req.argv), ""
        elif req.shell is not None:
            argv, shell = (), v.shell("shell", req.shell)
        else:
            raise InvalidArgument("command", "set argv or shell")
        timeout = (
            v.non_negative("timeout_seconds", req.timeout, s.max_timeout_seconds) or s.default_timeout_seconds
        )
        output_limit = int(v.non_negative("output_limit_bytes", req.output_limit, s.max_output_bytes))
        if len(req.stdin) > s.max_stdin_bytes:
            raise InvalidArgument("stdin", f"at most {s.max_stdin_bytes} bytes, got {len(req.stdin)}")
        session = v.session_name("session", req.session)
        cwd = v.exec_cwd("cwd", req.cwd)
        spec = ExecSpec(
            argv=argv,
            shell=shell,
            cwd=cwd if (cwd or session) else WORKSPACE,
            env=v.env("env", req.env or {}),
            timeout=timeout,
            stdin=req.stdin,
            output_limit=output_limit or rec.limits.output_bytes,
            session=session,
        )
        return rec, spec

    async def exec(self, rec: SandboxRecord, spec: ExecSpec) -> AsyncIterator[ExecEvent]:
        with self._using(rec):
            async for event in self.backend.exec(rec.handle, spec):
                if isinstance(event, ExecResult) and event.sandbox_gone:
                    self._lost(rec, event.detail)
                yield event

    def _lost(self, rec: SandboxRecord, reason: str) -> None:
        pool = self.pools.get(rec.pool)
        lease = self.leases.find(rec.lease_id)
        if lease is not None:
            self.leases.drop_sandbox(lease, rec.sandbox_id)
        if pool is not None:
            pool.fail(rec, f"sandbox lost: {reason}")

    async def usage_of(self, sandbox_id: str) -> SandboxUsage:
        rec = self._leased(sandbox_id)
        return await self.backend.usage(rec.handle)

    # -- files --------------------------------------------------------------

    async def write_files(self, sandbox_id: str, files: list[FileData]) -> int:
        rec = self._leased(sandbox_id)
        if not files:
            raise InvalidArgument("files", "must not be empty")
        checked: list[FileData] = []
        seen: set[str] = set()
        for i, f in enumerate(files):
            path = v.workspace_path(f"files[{i}].path", f.path)
            if path == WORKSPACE:
                raise InvalidArgument(f"files[{i}].path", "is the workspace directory itself")
            if path in seen:
                raise InvalidArgument(f"files[{i}].path", f"{path} appears twice")
            seen.add(path)
            mode = f.mode or 0o644
            if mode > 0o777:
                raise InvalidArgument(f"files[{i}].mode", f"{oct(mode)}: only permission bits (<= 0o777)")
            checked.append(FileData(path, f.content, mode))
        total = sum(len(f.content) for f in checked)
        data = await asyncio.to_thread(build_tar, checked) if total > 1 << 20 else build_tar(checked)

        async def one() -> AsyncIterator[bytes]:
            yield data

        with self._using(rec):
            await self.backend.put_tar(rec.handle, WORKSPACE, one())
        return total

    async def read_files(self, sandbox_id: str, paths: list[str], max_bytes: int) -> list[FileData]:
        rec = self._leased(sandbox_id)
        if not paths:
            raise InvalidArgument("paths", "must not be empty")
        limit = self.settings.exec.max_read_bytes
        max_bytes = int(v.non_negative("max_bytes", max_bytes, limit)) or min(16 << 20, limit)
        full = []
        for i, p in enumerate(paths):
            path = v.workspace_path(f"paths[{i}]", p)
            if path == WORKSPACE:
                raise InvalidArgument(f"paths[{i}]", "is the workspace directory itself")
            if path not in full:
                full.append(path)
        # Tar adds headers and padding; allow for them before cutting off.
        cap = max_bytes + 2048 * len(full) + 10240
        buf = bytearray()
        with self._using(rec):
            stream = self.backend.get_tar(rec.handle, WORKSPACE, tuple(relative(p) for p in full))
            try:
                async for chunk in stream:
                    buf += chunk
                    if len(buf) > cap:
                        raise ResourceExhausted(
                            f"files exceed max_bytes ({max_bytes}); read fewer or raise it"
                        )
            finally:
                await stream.aclose()  # type: ignore[attr-defined]
        result = parse_read_tar(bytes(buf), full)
        if sum(len(f.content) for f in result) > max_bytes:
            raise ResourceExhausted(f"files exceed max_bytes ({max_bytes}); read fewer or raise it")
        return [
            FileData(p, f.content, f.mode) for p, f in zip(paths_in_order(paths, full), result, strict=True)
        ]

    async def upload_directory(self, sandbox_id: str, path: str, chunks: AsyncIterator[bytes]) -> int:
        rec = self._leased(sandbox_id)
        dest = v.workspace_path("header.path", path)
        limit = self.settings.exec.max_upload_bytes
        spool: IO[bytes] = tempfile.SpooledTemporaryFile(max_size=16 << 20)  # noqa: SIM115
        try:
            size = 0
            async for chunk in chunks:
                size += len(chunk)
                if size > limit:
                    raise InvalidArgument("data", f"upload exceeds {limit} bytes")
                spool.write(chunk)
            if size == 0:
                raise InvalidArgument("data", "empty upload: send a tar stream after the header")
            spool.seek(0)
            await asyncio.to_thread(check_upload, spool)

            async def replay() -> AsyncIterator[bytes]:
                spool.seek(0)
                while block := spool.read(1 << 20):
                    yield block

            with self._using(rec):
                await self.backend.put_tar(rec.handle, dest, replay())
            return size
        finally:
            spool.close()

    def download_directory(self, sandbox_id: str, path: str) -> AsyncIterator[bytes]:
        rec = self._leased(sandbox_id)
        base = v.workspace_path("path", path)
        return self._download(rec, base)

    async def _download(self, rec: SandboxRecord, base: str) -> AsyncIterator[bytes]:
        with self._using(rec):
            async for chunk in self.backend.get_tar(rec.handle, base, (".",)):
                yield chunk

    # -- for sandboxd.core.snapshots ------------------------------------------

    def leased(self, sandbox_id: str) -> SandboxRecord:
        """The current tenant's leased sandbox (NOT_FOUND / FAILED_PRECONDITION otherwise)."""
        return self._leased(sandbox_id)

    def using(self, rec: SandboxRecord) -> contextlib.AbstractContextManager[None]:
        """Marks the sandbox busy (its lease is not reaped) for the block."""
        return self._using(rec)

    def is_live(self, sandbox_id: str) -> bool:
        return sandbox_id in self._index


def paths_in_order(requested: list[str], full: list[str]) -> list[str]:
    """Original spelling of each unique path, in the order read."""
    out: dict[str, str] = {}
    for p in requested:
        out.setdefault(v.workspace_path("paths", p), p)
    return [out[f] for f in full]
