"""Per-tenant quotas: concurrent sandboxes, total memory, creates per minute,
and ceilings on limits. Over quota answers at once with a retry-after hint,
never by making the caller wait."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields

from sandboxd.backends.base import Limits
from sandboxd.clock import Clock
from sandboxd.errors import InvalidArgument, ResourceExhausted
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
    sandboxes: int
    memory_bytes: int


class Quotas:
    def __init__(self, tenants: dict[str, TenantSettings], clock: Clock) -> None:
        self._tenants = tenants
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}

    def of(self, tenant: str) -> TenantSettings:
        return self._tenants.get(tenant) or TenantSettings()

    def check_ceiling(self, tenant: str, limits: Limits, prefix: str) -> None:
        ceiling = self.of(tenant).ceiling
        for f in fields(Limits):
            top = getattr(ceiling, f.name)
            value = getattr(limits, f.name)
            if top and value > top:
                raise InvalidArgument(
                    f"{prefix}.{f.name}", f"{value} is above tenant {tenant!r}'s ceiling of {top}"
                )

    def admit(
        self, tenant: str, n: int, memory_each: int, usage: Usage, retry_after: Callable[[], float]
    ) -> None:
        """Raises ResourceExhausted if leasing n more sandboxes of memory_each
        bytes would break a quota; otherwise takes n create tokens."""
        q = self.of(tenant)
        if q.max_sandboxes and usage.sandboxes + n > q.max_sandboxes:
            raise ResourceExhausted(
                f"tenant {tenant!r} holds {usage.sandboxes} of {q.max_sandboxes} sandboxes; "
                f"{n} more do not fit (release some first)",
                retry_after(),
            )
        if q.max_memory_bytes and usage.memory_bytes + n * memory_each > q.max_memory_bytes:
            raise ResourceExhausted(
                f"tenant {tenant!r} uses {usage.memory_bytes} of {q.max_memory_bytes} bytes of memory; "
                f"{n} sandboxes of {memory_each} bytes do not fit",
                retry_after(),
            )
        if q.creates_per_minute:
            now = self._clock.monotonic()
            bucket = self._buckets.get(tenant)
            if bucket is None:
                rate = float(q.creates_per_minute)
                bucket = self._buckets[tenant] = _Bucket(rate, rate / 60.0, rate, now)
            bucket.refill(now)
            if n > bucket.capacity:
                raise InvalidArgument(
                    "n", f"{n} is above tenant {tenant!r}'s {q.creates_per_minute} creates/minute"
                )
            if bucket.tokens < n:
                wait = (n - bucket.tokens) / bucket.per_second
                raise ResourceExhausted(
                    f"tenant {tenant!r} is over {q.creates_per_minute} sandbox creates per minute",
                    round(wait, 3),
                )
            bucket.tokens -= n

    def refund(self, tenant: str, n: int) -> None:
        bucket = self._buckets.get(tenant)
        if bucket is not None:
            bucket.tokens = min(bucket.capacity, bucket.tokens + n)
