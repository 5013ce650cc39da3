"""Leasing: hands sandboxes over under leases and takes them back.

A lease is born in one place, ``Leasing.acquire``: after admission (tenant
quota, pool capacity) and the pool's hand-over, the sandboxes are marked
LEASED and the lease is recorded in the ``LeaseTable`` (which also counts
what each tenant holds) before it is persisted. Everything that ends a lease
or takes a sandbox out of one goes through here too: release, expiry (the
reaper, which spares leases with commands running), a sandbox lost while
leased, deletion of the pool. Leases a previous run left are restored at
start-up, and the backend is swept for sandboxes no pool knows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import replace

from sandboxd.backends.base import GVISOR, RUNC, Backend, Limits
from sandboxd.clock import Clock
from sandboxd.core import validation as v
from sandboxd.core.acquire_request import AcquireRequest
from sandboxd.core.deadlines import ACQUIRE_MARGIN_SECONDS, within_deadline
from sandboxd.core.leases import Lease, LeaseTable, new_lease_id
from sandboxd.core.lifecycle import SandboxRecord
from sandboxd.core.narrowing import adopt_narrowed, apply_narrowed, change_narrowed, checked_narrowing
from sandboxd.core.pools import WarmPool
from sandboxd.core.quotas import Quotas, Usage
from sandboxd.core.registry import SandboxRegistry
from sandboxd.core.state import StateStore
from sandboxd.core.tenancy import current_tenant, owns, split_pool_key
from sandboxd.errors import BackendError, FailedPrecondition, InvalidArgument, NotFound
from sandboxd.settings import Settings

log = logging.getLogger(__name__)


class Leasing:
    """Acquire, heartbeat, release and expiry of leases, with the reaper that
    enforces expiry and the sweep that removes orphans."""

    def __init__(
        self,
        settings: Settings,
        backend: Backend,
        store: StateStore,
        clock: Clock,
        quotas: Quotas,
        registry: SandboxRegistry,
        table: LeaseTable,
    ) -> None:
        self._settings = settings
        self._backend = backend
        self._store = store
        self._clock = clock
        self._quotas = quotas
        self._registry = registry
        self.table = table
        # Commands and transfers running per sandbox: their lease is not
        # reaped, and a recycling pool does not reset the sandbox.
        self._busy = registry.busy
        self._orphan_suspects: set[str] = set()
        # Sandboxes each tenant's in-flight acquires were granted, not yet leased.
        self._reserved: dict[str, Usage] = {}
        self._reaper: asyncio.Task[None] | None = None
        # Acquires with a request id being served, per (tenant, request id):
        # done when that acquire has answered.
        self._acquiring: dict[tuple[str, str], asyncio.Future[None]] = {}
        # Changes of a lease's network rules, one at a time per lease: lease
        # id -> (the lock, how many calls hold or wait for it).
        self._changing: dict[str, tuple[asyncio.Lock, list[int]]] = {}

    @property
    def busy(self) -> Mapping[str, int]:
        """Operations running per sandbox id."""
        return self._busy

    @property
    def reaper(self) -> asyncio.Task[None] | None:
        """The background reaper, once started."""
        return self._reaper

    def usage(self, tenant: str) -> Usage:
        """What ``tenant`` holds under its leases."""
        return self.table.held(tenant)

    def _usage_with_reserved(self, tenant: str) -> Usage:
        held, reserved = self.table.held(tenant), self._reserved.get(tenant, Usage(0, 0))
        return Usage(held.sandboxes + reserved.sandboxes, held.memory_bytes + reserved.memory_bytes)

    def _reserve(self, tenant: str, n: int, memory_each: int) -> None:
        """Counts ``n`` sandboxes granted to an acquire still in flight (negative: done)."""
        r = self._reserved.get(tenant, Usage(0, 0))
        r = Usage(r.sandboxes + n, r.memory_bytes + n * memory_each)
        if r.sandboxes > 0:
            self._reserved[tenant] = r
        else:
            self._reserved.pop(tenant, None)

    # -- start and stop -----------------------------------------------------

    def start(self) -> None:
        """Starts the reaper (expiry, and the orphan sweep)."""
        self._reaper = asyncio.create_task(self._reap_loop(), name="lease-reaper")

    async def stop(self) -> None:
        """Stops the reaper; leases stay as they are (persisted)."""
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper

    async def adopt(self) -> None:
        """Restores the unexpired leases a previous run persisted, with the
        sandboxes the backend still runs for them; destroys everything else
        the backend holds for this instance."""
        now_wall = self._clock.time()
        now = self._clock.monotonic()
        persisted = await self._store.load_leases()
        lease_of: dict[str, Lease] = {}
        for lease_id, pool_name, sandbox_ids, ttl, expires_wall, labels, network in persisted:
            if expires_wall <= now_wall or pool_name not in self._registry.pools:
                continue
            restored = Lease(
                lease_id, pool_name, [], ttl, now + (expires_wall - now_wall), expires_wall, labels
            )
            restored.network = tuple(network)
            for sid in sandbox_ids:
                lease_of[sid] = restored
        doomed = await adopt_narrowed(self._backend, self._registry, lease_of)
        adopted = {lease.lease_id: lease for lease in lease_of.values() if lease.sandbox_ids}
        for lease in adopted.values():
            self.table.add(lease, self._memory_of(lease.sandbox_ids))
        for lease_id, *_ in persisted:
            if lease_id not in adopted:
                await self._store.delete_lease(lease_id)
            else:
                await self._save(adopted[lease_id])
        results = await asyncio.gather(*(self._backend.destroy(h) for h in doomed), return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        log.info(
            "adoption: %d sandboxes kept under %d leases, %d destroyed (%d failed)",
            sum(len(lease.sandbox_ids) for lease in adopted.values()),
            len(adopted),
            len(doomed),
            len(failures),
        )

    # -- acquire ------------------------------------------------------------

    async def acquire(self, req: AcquireRequest) -> tuple[Lease, list[SandboxRecord]]:
        """Leases ``req.n`` sandboxes of the current tenant's pool ``req.pool``
        (or at least ``req.min_n`` at the deadline), never more than the
        tenant's quotas leave. With a request id, an acquire already granted
        answers its lease again, and one still being served is waited for."""
        if not req.request_id:
            return await self._acquire(req)
        key = current_tenant(), v.request_id("request_id", req.request_id)
        while (pending := self._acquiring.get(key)) is not None:
            await asyncio.shield(pending)
        granted = self.table.find_request(*key)
        if granted is not None:
            return self._granted_before(granted, req.pool)
        done = asyncio.get_running_loop().create_future()
        self._acquiring[key] = done
        try:
            return await self._acquire(req)
        finally:
            del self._acquiring[key]
            done.set_result(None)

    def _granted_before(self, lease: Lease, pool_name: str) -> tuple[Lease, list[SandboxRecord]]:
        pool = self._registry.get_pool(pool_name, "pool")
        if pool.config.name != lease.pool:
            raise InvalidArgument(
                "request_id", f"was the id of an acquire of another pool ({split_pool_key(lease.pool)[1]!r})"
            )
        records = self._registry.records
        return lease, [records[sid] for sid in lease.sandbox_ids if sid in records]

    async def _acquire(self, req: AcquireRequest) -> tuple[Lease, list[SandboxRecord]]:
        pool = self._registry.get_pool(req.pool, "pool")
        n = req.n or 1
        if n < 1:
            raise InvalidArgument("n", f"must be >= 1, got {n}")
        min_n = req.min_n
        if min_n < 0 or min_n > n:
            raise InvalidArgument("min_n", f"must be between 0 and n ({n}), got {min_n}")
        leases = self._settings.leases
        labels = v.labels("labels", req.labels or {})
        ttl = (
            v.non_negative("lease_ttl_seconds", req.ttl, leases.max_ttl_seconds) or leases.default_ttl_seconds
        )
        timeout = v.non_negative("timeout_seconds", req.timeout)
        image = pool.config.image_for(req.image)
        network = await checked_narrowing(self._backend, pool.config, req.network)
        need = min_n or n
        if need > pool.config.max_size:
            raise FailedPrecondition(
                f"pool {req.pool!r} holds at most {pool.config.max_size} sandboxes; "
                f"{need} can never be leased"
            )
        effective = self._acquire_limits(pool.config.limits, req.limits, pool.config.runtime)
        wait = within_deadline(
            timeout or self._settings.pools.max_acquire_wait_seconds,
            req.call_remaining,
            ACQUIRE_MARGIN_SECONDS,
        )
        tenant = current_tenant()
        memory_each = effective.memory_bytes
        # The pool hands out at most what the quotas grant, so a group acquire
        # (min_n < n) cannot take more than the tenant has room for.
        grant = self._quotas.admit(
            tenant,
            min(n, pool.config.max_size),
            min_n,
            memory_each,
            self._usage_with_reserved(tenant),
            lambda: self._retry_hint(tenant),
        )
        # Granted but not yet leased, they count against the quotas still: an
        # acquire admitted while this one waits must not get the same room.
        self._reserve(tenant, grant, memory_each)
        try:
            try:
                records = await pool.acquire(grant, min_n, wait, image, labels)
            except BaseException:
                self._quotas.refund(tenant, grant)
                raise
            self._quotas.refund(tenant, grant - len(records))
            if effective != pool.config.limits:
                records = await self._apply_limits(pool, records, effective)
            if network:  # before the lease exists: its holder never has the pool's wider rules
                await apply_narrowed(self._backend, pool, records, network)
            lease = self._hand_over(pool, records, labels, ttl, effective.lifetime_seconds, req.request_id)
            lease.network = network
        finally:
            self._reserve(tenant, -grant, memory_each)
        try:
            await self._save(lease)
        except BaseException:
            # The client will never learn of this lease: give the sandboxes up.
            await self._release_lease(lease, "acquire abandoned")
            raise
        return lease, records

    def _hand_over(
        self,
        pool: WarmPool,
        records: list[SandboxRecord],
        labels: dict[str, str],
        ttl: float,
        lifetime: float,
        request_id: str,
    ) -> Lease:
        now, wall = self._clock.monotonic(), self._clock.time()
        lease = Lease(
            lease_id=new_lease_id(),
            pool=pool.config.name,
            sandbox_ids=[r.sandbox_id for r in records],
            ttl=ttl,
            expires_at=now + ttl,
            expires_wall=wall + ttl,
            labels=labels,
            hard_deadline=now + lifetime if lifetime else 0.0,
            request_id=request_id,
        )
        self.table.extend(lease, ttl, now, wall)
        pool.mark_leased(records, lease.lease_id)
        for rec in records:
            rec.labels.update(labels)
        self.table.add(lease, {r.sandbox_id: r.limits.memory_bytes for r in records})
        return lease

    def _acquire_limits(self, ceiling: Limits, asked: Limits | None, runtime: str = RUNC) -> Limits:
        if asked is None or asked == Limits():
            return ceiling
        if runtime == GVISOR and asked.pids and asked.pids != ceiling.pids:
            # Enforced inside gVisor by a limit set when the sandbox starts,
            # which a running sandbox cannot lower.
            raise FailedPrecondition(
                f"runtime {runtime!r} fixes the pids limit when the sandbox starts; create a pool with "
                f"pids {asked.pids} instead of asking for it per acquire"
            )
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
            *(self._backend.update_limits(r.handle, limits) for r in records), return_exceptions=True
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
        now = self._clock.monotonic()
        soonest = min(
            (lease.expires_at - now for lease in self.table.all() if split_pool_key(lease.pool)[0] == tenant),
            default=1.0,
        )
        return round(min(30.0, max(0.5, soonest)), 3)

    # -- heartbeat and release -------------------------------------------------

    def get_lease(self, lease_id: str) -> Lease:
        """The current tenant's lease (NOT_FOUND otherwise)."""
        v.object_id("lease_id", lease_id, "lease")
        lease = self.table.get(lease_id)
        if not owns(lease.pool):
            raise NotFound(f"lease {lease_id!r} not found (expired, released or never issued)")
        return lease

    async def heartbeat(self, lease_id: str, ttl: float) -> Lease:
        """Extends the lease by ``ttl`` seconds (0 = its own TTL), within its lifetime."""
        lease = self.get_lease(lease_id)
        ttl = v.non_negative("ttl_seconds", ttl, self._settings.leases.max_ttl_seconds) or lease.ttl
        self.table.extend(lease, ttl, self._clock.monotonic(), self._clock.time())
        await self._save(lease)
        return lease

    async def set_network(self, lease_id: str, asked: tuple[str, ...]) -> Lease:
        """Puts the running lease's sandboxes under ``asked`` (rules within its
        pool's, NO_NETWORK, or () = the pool's own) and persists them with the
        lease; returns once they are in force on every sandbox, connections
        they no longer allow cut. Validated as an acquire's narrowing
        (INVALID_ARGUMENT, FAILED_PRECONDITION) before anything changes.

        All or nothing: should a sandbox's change fail, what it runs under
        cannot be known (on Kubernetes a proxy may have taken the new rules or
        not), and running on under the old rules could break what the change
        was for (a grading phase with network cut), so the lease ends and its
        sandboxes are given up, answered FAILED_PRECONDITION naming why."""
        lease = self.get_lease(lease_id)
        pool = self._registry.pools.get(lease.pool)
        if pool is None:
            raise NotFound(f"lease {lease_id!r} not found (its pool is gone)")
        rules = await checked_narrowing(self._backend, pool.config, asked, change=True)
        lock, users = self._changing.setdefault(lease_id, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            async with lock:
                return await self._set_network(lease, rules)
        finally:
            users[0] -= 1
            if not users[0]:
                del self._changing[lease_id]

    async def _set_network(self, lease: Lease, rules: tuple[str, ...]) -> Lease:
        if self.table.find(lease.lease_id) is not lease:
            raise NotFound(f"lease {lease.lease_id!r} not found (released or expired meanwhile)")
        records = self._registry.records
        held = [rec for sid in lease.sandbox_ids if (rec := records.get(sid)) is not None]
        if rules == lease.network and all(rec.network == rules for rec in held):
            return lease
        with contextlib.ExitStack() as stack:
            # Busy meanwhile: not reaped, and a release meanwhile destroys
            # them rather than recycling them under rules being changed.
            for rec in held:
                stack.enter_context(self._busy.using(rec.sandbox_id))
            try:
                await change_narrowed(self._backend, held, rules)
            except Exception as e:
                if self.table.find(lease.lease_id) is lease:
                    log.warning("lease %s ended: its network rules not changed: %s", lease.lease_id, e)
                    for rec in held:
                        self.table.drop_sandbox(lease, rec.sandbox_id)
                        self._registry.fail(rec, f"could not change its network rules: {e}")
                    self.table.remove(lease.lease_id)
                    await self._store.delete_lease(lease.lease_id)
                raise FailedPrecondition(
                    f"could not change the network rules of lease {lease.lease_id}'s sandboxes ({e}); what "
                    "they ran under was no longer known, so the lease ended and its sandboxes were given up"
                ) from e
        if self.table.find(lease.lease_id) is not lease:
            raise NotFound(f"lease {lease.lease_id!r} not found (released or expired meanwhile)")
        lease.network = rules
        await self._save(lease)
        return lease

    async def release(self, lease_id: str, sandbox_ids: list[str]) -> list[str]:
        """Releases (destroys) the lease's sandboxes, or only those named;
        returns the ids released. Releasing a lease again is a no-op."""
        v.object_id("lease_id", lease_id, "lease")
        for i, sid in enumerate(sandbox_ids):
            v.object_id(f"sandbox_ids[{i}]", sid, "sandbox")
        lease = self.table.find(lease_id)
        if lease is not None and not owns(lease.pool):
            lease = None
        if lease is None:
            if self.table.was_released(lease_id):
                return []
            raise NotFound(f"lease {lease_id!r} not found (expired, released or never issued)")
        if not sandbox_ids:
            return await self._release_lease(lease, "released")
        for i, sid in enumerate(sandbox_ids):
            if sid not in lease.sandbox_ids and not self._registry.is_gone(sid):
                raise NotFound(f"sandbox_ids[{i}]: {sid!r} is not held by lease {lease_id}")
        released = []
        for sid in sandbox_ids:
            if sid in lease.sandbox_ids:
                self._registry.release(sid, "released")
                self.table.drop_sandbox(lease, sid)
                released.append(sid)
        if self.table.find(lease_id) is None:
            await self._store.delete_lease(lease_id)
        else:
            await self._save(lease)
        return released

    async def release_request(self, request_id: str) -> list[str]:
        """Releases the lease the current tenant's Acquire with ``request_id``
        was granted; [] when none is in force (it may never have been granted)."""
        lease = self.table.find_request(current_tenant(), v.request_id("request_id", request_id))
        if lease is None:
            return []
        return await self._release_lease(lease, "released")

    async def abandon(self, lease_id: str) -> None:
        """Releases a lease whose Acquire answer never reached its client (the
        call ended cancelled): nobody would ever heartbeat or release it. A
        no-op once the lease is gone."""
        lease = self.table.find(lease_id)
        if lease is not None:
            await self._release_lease(lease, "acquire abandoned")

    async def _release_lease(self, lease: Lease, reason: str) -> list[str]:
        released = list(lease.sandbox_ids)
        for sid in released:
            self._registry.release(sid, reason)
        self.table.remove(lease.lease_id)
        await self._store.delete_lease(lease.lease_id)
        return released

    def lose(self, rec: SandboxRecord, reason: str) -> None:
        """A leased sandbox died: it leaves its lease and its pool replaces it."""
        lease = self.table.find(rec.lease_id)
        if lease is not None:
            self.table.drop_sandbox(lease, rec.sandbox_id)
        self._registry.fail(rec, f"sandbox lost: {reason}")

    async def delete_pool(self, name: str, force: bool) -> None:
        """Deletes the current tenant's pool; the leases on it end with it."""
        pool = self._registry.unregister_pool(name, force)
        for lease in [lease for lease in self.table.all() if lease.pool == pool.config.name]:
            self.table.remove(lease.lease_id)
            await self._store.delete_lease(lease.lease_id)
        await self._registry.dispose_pool(pool)

    @contextlib.contextmanager
    def using(self, rec: SandboxRecord) -> Iterator[None]:
        """Marks the sandbox busy for the block: its lease is not reaped meanwhile."""
        with self._busy.using(rec.sandbox_id):
            yield

    async def _save(self, lease: Lease) -> None:
        await self._store.save_lease(lease, self._registry.handles(lease.sandbox_ids))

    def _memory_of(self, sandbox_ids: Iterable[str]) -> dict[str, int]:
        records = self._registry.records
        return {sid: rec.limits.memory_bytes for sid in sandbox_ids if (rec := records.get(sid)) is not None}

    # -- reclamation ----------------------------------------------------------

    async def _reap_loop(self) -> None:
        settings = self._settings.leases
        next_sweep = self._clock.monotonic() + settings.orphan_sweep_seconds
        while True:
            await self._clock.sleep(settings.reap_interval_seconds)
            try:
                await self.reap_expired()
                if settings.orphan_sweep_seconds and self._clock.monotonic() >= next_sweep:
                    next_sweep = self._clock.monotonic() + settings.orphan_sweep_seconds
                    await self.sweep_orphans()
            except Exception:  # keep reaping whatever one round hit
                log.exception("lease reaper round failed")

    async def reap_expired(self) -> int:
        """Releases leases past their expiry; leases with commands still
        running are kept until those finish (or their lifetime ends)."""
        count = 0
        for lease in self.table.expired(self._clock.monotonic()):
            if any(self._busy.get(sid) for sid in lease.sandbox_ids) and not (
                lease.hard_deadline and lease.hard_deadline <= self._clock.monotonic()
            ):
                continue
            log.info("lease %s expired; reclaiming %d sandboxes", lease.lease_id, len(lease.sandbox_ids))
            await self._release_lease(lease, "lease expired")
            count += 1
        return count

    async def sweep_orphans(self) -> int:
        """Destroys what the backend holds under this instance's labels but no
        pool knows: remains of a create or destroy that failed while the
        engine was unreachable. A sandbox must be unknown on two sweeps in a
        row, so a create still in flight is never taken for an orphan."""
        try:
            found = await self._backend.list()
        except BackendError as e:
            log.warning("orphan sweep skipped: %s", e)
            return 0
        known = self._registry.known_ids()
        unknown = {f.handle for f in found if f.sandbox_id not in known}
        doomed = unknown & self._orphan_suspects
        self._orphan_suspects = unknown - doomed
        if doomed:
            log.warning("removing %d orphaned sandboxes", len(doomed))
            await asyncio.gather(*(self._backend.destroy(h) for h in doomed), return_exceptions=True)
        return len(doomed)
