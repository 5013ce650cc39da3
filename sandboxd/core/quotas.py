"""Per-tenant quotas: concurrent sandboxes, total memory, creates per minute,
and ceilings on limits. Over quota answers at once with a retry-after hint,
never by making the caller wait; a request no quota could ever hold is
refused as a failed precondition, without a hint. A group acquire is granted
at most what the quotas leave."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields

from sandboxd.backends.base import Limits
from sandboxd.clock import Clock
from sandboxd.errors import FailedPrecondition, InvalidArgument, ResourceExhausted
from sandboxd.settings import TenantSettings


@dataclass
class _Bucket:
    capacity: float
    per_second: float
    tokens: float
    stamp: float

    def refill(self, now: float) -> None:
        self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.per_second)
        self.stamp = now


@dataclass(frozen=True)
class Usage:
    """Sandboxes and memory a tenant holds (or has on the way to it)."""

    sandboxes: int
    memory_bytes: int


class Quotas:
    """Admission of each tenant's acquires against its quotas."""

    def __init__(self, tenants: dict[str, TenantSettings], clock: Clock) -> None:
        self._tenants = tenants
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}
        self._defaults = TenantSettings()

    def of(self, tenant: str) -> TenantSettings:
        """The tenant's settings (read them, do not change them); an unconfigured tenant gets the defaults."""
        return self._tenants.get(tenant) or self._defaults

    def check_ceiling(self, tenant: str, limits: Limits, prefix: str) -> None:
        """INVALID_ARGUMENT naming ``prefix.field`` for a limit above the tenant's ceiling (0 = none)."""
        ceiling = self.of(tenant).ceiling
        for f in fields(Limits):
            top = getattr(ceiling, f.name)
            value = getattr(limits, f.name)
            if top and value > top:
                raise InvalidArgument(
                    f"{prefix}.{f.name}", f"{value} is above tenant {tenant!r}'s ceiling of {top}"
                )

    def admit(
        self,
        tenant: str,
        n: int,
        min_n: int,
        memory_each: int,
        usage: Usage,
        retry_after: Callable[[], float],
    ) -> int:
        """How many of ``n`` sandboxes of ``memory_each`` bytes the tenant may
        lease now on top of ``usage``: all n when ``min_n`` is 0 (all or
        nothing), else as many as the quotas leave, at least ``min_n``. Takes
        that many create tokens. Raises FailedPrecondition when the request
        can never fit a quota, ResourceExhausted when it does not fit now."""
        need = min_n or n
        q = self.of(tenant)
        grant = n
        if q.max_sandboxes:
            if need > q.max_sandboxes:
                # Waiting would not help: no release ever makes room for it.
                raise FailedPrecondition(
                    f"tenant {tenant!r}'s quota max_sandboxes is {q.max_sandboxes}; "
                    f"{need} sandboxes can never be leased at once"
                )
            free = max(0, q.max_sandboxes - usage.sandboxes)
            if need > free:
                raise ResourceExhausted(
                    f"tenant {tenant!r} holds {usage.sandboxes} of {q.max_sandboxes} sandboxes; "
                    f"{need} more do not fit (release some first)",
                    retry_after(),
                )
            grant = min(grant, free)
        if q.max_memory_bytes and memory_each > 0:
            if need * memory_each > q.max_memory_bytes:
                raise FailedPrecondition(
                    f"tenant {tenant!r}'s quota max_memory_bytes is {q.max_memory_bytes}; "
                    f"{need} sandboxes of {memory_each} bytes can never be leased at once"
                )
            free = max(0, (q.max_memory_bytes - usage.memory_bytes) // memory_each)
            if need > free:
                raise ResourceExhausted(
                    f"tenant {tenant!r} uses {usage.memory_bytes} of {q.max_memory_bytes} bytes of memory; "
                    f"{need} sandboxes of {memory_each} bytes do not fit",
                    retry_after(),
                )
            grant = min(grant, free)
        if q.creates_per_minute:
            now = self._clock.monotonic()
            bucket = self._buckets.get(tenant)
            if bucket is None:
                rate = float(q.creates_per_minute)
                bucket = self._buckets[tenant] = _Bucket(rate, rate / 60.0, rate, now)
            bucket.refill(now)
            if need > bucket.capacity:
                raise InvalidArgument(
                    "min_n" if min_n else "n",
                    f"{need} is above tenant {tenant!r}'s {q.creates_per_minute} creates/minute",
                )
            if bucket.tokens < need:
                wait = (need - bucket.tokens) / bucket.per_second
                raise ResourceExhausted(
                    f"tenant {tenant!r} is over {q.creates_per_minute} sandbox creates per minute",
                    round(wait, 3),
                )
            # Every sandbox granted costs a token, not only the min_n asked for.
            grant = min(grant, int(bucket.tokens))
            bucket.tokens -= grant
        return grant

    def refund(self, tenant: str, n: int) -> None:
        """Gives back ``n`` create tokens taken for sandboxes never leased."""
        bucket = self._buckets.get(tenant)
        if bucket is not None:
            bucket.tokens = min(bucket.capacity, bucket.tokens + n)
