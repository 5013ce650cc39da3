"""A pool's spec as the tenant set it, and the checks that guard it."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from sandboxd.backends.base import RUNC, Limits
from sandboxd.core.scaling import Bounds, PolicyConfig
from sandboxd.errors import FailedPrecondition, InvalidArgument

MAX_ANNOUNCE_SECONDS = 24 * 3600.0
"""Longest lead time, lifetime or scale-down delay a request may ask for."""


@dataclass
class PoolConfig:
    """A pool's spec as the tenant set it (``name`` is the internal key once created)."""

    name: str
    image: str
    min_ready: int
    max_size: int
    limits: Limits
    env: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    created_at: float = 0.0
    max_ready: int = 0
    """Ceiling of the warm target; above ``min_ready`` the pool follows demand
    between the two, otherwise it keeps exactly ``min_ready`` READY."""
    idle_seconds: float = 0.0
    """How long warm sandboxes above demand are kept before they are
    destroyed (the scale-down delay); 0 = the server's default."""
    runtime: str = RUNC
    """Isolation runtime of the pool's sandboxes (sandboxd.backends.base.RUNTIMES)."""

    def bounds(self) -> Bounds:
        """The size bounds the scaling policy keeps this pool within."""
        return Bounds(
            min_ready=self.min_ready, max_ready=max(self.max_ready, self.min_ready), max_size=self.max_size
        )

    def policy(self, base: PolicyConfig, max_starting: int) -> PolicyConfig:
        """The server's scaling policy ``base`` with this pool's own settings applied."""
        return replace(
            base, max_starting=max_starting, scale_down_delay=self.idle_seconds or base.scale_down_delay
        )


def check_scaling(config: PoolConfig) -> None:
    """Validates the demand-following fields of a pool spec."""
    if config.max_ready < 0:
        raise InvalidArgument("spec.max_ready", f"must be >= 0, got {config.max_ready}")
    if config.max_ready > config.max_size:
        raise InvalidArgument(
            "spec.max_ready", f"({config.max_ready}) must not exceed max_size ({config.max_size})"
        )
    if not 0 <= config.idle_seconds <= MAX_ANNOUNCE_SECONDS:
        raise InvalidArgument(
            "spec.idle_seconds", f"must be between 0 and {MAX_ANNOUNCE_SECONDS:g}, got {config.idle_seconds}"
        )


def check_announcement(
    config: PoolConfig, source: str, count: int, in_seconds: float, ttl_seconds: float
) -> None:
    """Validates an announcement of demand for the pool ``config`` describes."""
    if count < 0:
        raise InvalidArgument("count", f"must be >= 0, got {count}")
    if count > config.max_size:
        raise InvalidArgument("count", f"({count}) must not exceed the pool's max_size ({config.max_size})")
    for name, value in (("in_seconds", in_seconds), ("ttl_seconds", ttl_seconds)):
        if not 0 <= value <= MAX_ANNOUNCE_SECONDS:
            raise InvalidArgument(name, f"must be between 0 and {MAX_ANNOUNCE_SECONDS:g}, got {value}")
    if len(source) > 128:
        raise InvalidArgument("source", "at most 128 characters")
    if not config.bounds().follows_demand:
        raise FailedPrecondition(
            f"pool {config.name} does not follow demand (max_ready {config.max_ready} is not "
            f"above min_ready {config.min_ready}); set max_ready to let announcements warm it"
        )
