"""How the Prime API maps onto sandboxd: the settings of one Prime server."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["PrimeSettings"]


@dataclass(frozen=True)
class PrimeSettings:
    """How the Prime API maps onto sandboxd."""

    image_pools: Mapping[str, str] = field(default_factory=dict)
    """Image name (as the SDK sends it) -> an existing pool; the pool's own
    limits then apply. Other images get pools created on first use."""
    template_pool: str = ""
    """An existing pool that serves any image (its spec.images ``["*"]``):
    a ``docker_image`` that ``image_pools`` does not map is acquired from it
    by image (pulled when absent) instead of getting a pool of its own, so
    thousands of per-task images share one pool's limits and warm capacity."""
    min_ready: int = 0
    """Warm sandboxes of each pool created on first use."""
    max_ready: int = 0
    """Above min_ready: such pools follow demand up to this many warm."""
    max_size: int = 64
    """Sandboxes of each pool created on first use, at most."""
    api_keys: frozenset[str] = frozenset()
    """Bearer keys accepted (PRIME_API_KEY); empty = any key."""
    lease_ttl: float = 60.0
    """TTL of each sandbox's lease, heartbeated by this server while it runs."""
    acquire_timeout: float = 600.0
    """How long a PENDING sandbox waits for its pool."""
    public_url: str = ""
    """Base URL clients reach this server at (for the gateway URL that
    ``auth`` hands out); empty = the scheme and Host of each request."""
    keep_finished: int = 10_000
    """Finished sandboxes remembered for GET and list."""
