"""How pools scale and start sandboxes: one value shared by the reconciler and
every pool it runs. A leaf module, so pools and the reconciler both depend on
it and neither on the other's construction."""

from __future__ import annotations

from dataclasses import dataclass, field

from sandboxd.core.scaling import PolicyConfig
from sandboxd.settings import PoolSettings

MAX_BACKOFF_SECONDS = 30.0


@dataclass(frozen=True)
class PoolTuning:
    """How pools scale and start sandboxes (from the server's PoolSettings)."""

    policy: PolicyConfig = field(default_factory=PolicyConfig)
    create_attempts: int = 4
    """Backend attempts per sandbox before it counts as failed (transient errors)."""
    retry_initial_seconds: float = 0.25
    retry_max_seconds: float = MAX_BACKOFF_SECONDS
    rate_window_seconds: float = 30.0
    """Smoothing window of the acquire rate."""
    startup_estimate_seconds: float = 2.0
    """Start-up latency assumed until one has been measured (by any pool)."""
    announcement_ttl_seconds: float = 120.0
    """How long after its due time an announcement counts by default."""
    refill_defer_seconds: float = 2.0
    """Longest a create nobody waits for defers to urgent work in flight."""


def tuning_from(settings: PoolSettings) -> PoolTuning:
    """The tuning the server's pool settings ask for."""
    return PoolTuning(
        policy=PolicyConfig(
            scale_down_delay=settings.scale_down_delay_seconds,
            rate_headroom=settings.rate_headroom,
            create_throughput=settings.max_create_rate,
            max_starting=settings.max_starting,
        ),
        create_attempts=settings.create_attempts,
        rate_window_seconds=settings.rate_window_seconds,
        announcement_ttl_seconds=settings.announcement_ttl_seconds,
        refill_defer_seconds=settings.refill_defer_seconds,
    )
