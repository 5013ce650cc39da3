"""A pool's spec as the tenant set it, and the checks that guard it."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from urllib.parse import urlsplit

from sandboxd.backends.base import RUNC, EgressPolicies, Limits, ModelRoutes, PoolPullSecrets
from sandboxd.backends.network.policy import EgressPolicy
from sandboxd.core import validation as v
from sandboxd.core.images.references import normalize
from sandboxd.core.scaling import Bounds, PolicyConfig
from sandboxd.errors import FailedPrecondition, InvalidArgument

MAX_ANNOUNCE_SECONDS = 24 * 3600.0
"""Longest lead time, lifetime or scale-down delay a request may ask for."""
ANY_IMAGE = "*"
"""In a pool's ``images``: acquires may name any image."""
MAX_POOL_IMAGES = 1024
"""Most images a pool's ``images`` may list (beyond that, use ``*``)."""


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
    images: list[str] = field(default_factory=list)
    """Images an acquire or an announcement may name besides ``image``: empty
    = the pool serves its own image only; ``["*"]`` = any image (the pool is
    a template: limits, runtime, network and users, the image chosen per
    acquire)."""
    network: list[str] = field(default_factory=list)
    """Egress allow-list rules (sandboxd.backends.network.policy); empty = no
    network at all, the default."""
    model_endpoint: str = ""
    """The run's OpenAI-compatible inference server (``http://host:port/v1``)
    its sandboxes reach through sandboxd's metered gateway; "" = none."""
    image_pull_secrets: list[str] = field(default_factory=list)
    """Kubernetes: Secrets in the sandbox namespace the pool's Pods (and the
    pre-pulls of its announced images) pull with, besides the server's."""
    recycle: str = "off"
    """Whether a released sandbox is reset in place and used again
    (sandboxd.core.pools.recycle.RECYCLE_MODES): "off" destroys it."""
    recycle_label: str = ""
    """With recycle "same-run": the lease label whose value names the run; a
    recycled sandbox goes only to an acquire with the same value."""
    max_uses: int = 0
    """Leases a recycled sandbox serves before it is destroyed (0 = the server's default)."""
    live_snapshots: str = ""
    """LIVE_ON or LIVE_OFF once created (sandboxd.core.live_setting);
    "" in a spec saved before the setting existed, read as its runtime's
    default."""
    root: str = ""
    """ROOT_READ_ONLY or ROOT_WRITABLE once created (sandboxd.core.root_setting);
    "" in a spec saved before the setting existed, read as read-only."""

    def serves(self, image: str) -> bool:
        """Whether an acquire may ask this pool for ``image``."""
        listed = {normalize(i) for i in self.images if i != ANY_IMAGE}
        return image == self.image or ANY_IMAGE in self.images or normalize(image) in listed

    def image_for(self, image: str, field_name: str = "image") -> str:
        """The image an acquire naming ``image`` gets ("" = the pool's own).
        INVALID_ARGUMENT for a malformed reference, FAILED_PRECONDITION for
        one the pool does not serve."""
        if not image or image == self.image:
            return self.image
        v.image_ref(field_name, image)
        # One line per image however it is spelled ("repo" and "repo:latest").
        image = normalize(image)
        if image == normalize(self.image):
            return self.image
        if not self.serves(image):
            allowed = "only its own image" if not self.images else f"{len(self.images) + 1} images"
            raise FailedPrecondition(
                f"pool {self.name} serves {allowed} ({self.image!r}), not {image!r}; "
                'a pool that serves it lists it in spec.images (or "*" for any image)'
            )
        return image

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


def check_images(config: PoolConfig) -> None:
    """Validates a pool spec's ``images`` (INVALID_ARGUMENT naming ``spec.images``)."""
    if len(config.images) > MAX_POOL_IMAGES:
        raise InvalidArgument("spec.images", f'at most {MAX_POOL_IMAGES} images (or "*" for any)')
    for i, image in enumerate(config.images):
        if image != ANY_IMAGE:
            v.image_ref(f"spec.images[{i}]", image)


MAX_PULL_SECRETS = 16
_SECRET_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def check_pull_secrets(config: PoolConfig, backend: object) -> None:
    """Validates a pool spec's image pull secrets: Secret names (DNS
    subdomains), at most MAX_PULL_SECRETS, none twice (INVALID_ARGUMENT
    naming the entry); a backend that does not pull with them refuses any
    (FAILED_PRECONDITION)."""
    names = config.image_pull_secrets
    if not names:
        return
    if len(names) > MAX_PULL_SECRETS:
        raise InvalidArgument(
            "spec.image_pull_secrets", f"at most {MAX_PULL_SECRETS} Secrets, got {len(names)}"
        )
    for i, name in enumerate(names):
        if len(name) > 253 or not _SECRET_NAME.fullmatch(name):
            raise InvalidArgument(
                f"spec.image_pull_secrets[{i}]",
                f"not a Secret name (lowercase letters, digits, '-' and '.', at most 253): {name[:100]!r}",
            )
        if name in names[:i]:
            raise InvalidArgument(f"spec.image_pull_secrets[{i}]", f"{name!r} is listed twice")
    if not isinstance(backend, PoolPullSecrets):
        raise FailedPrecondition(
            f"the {type(backend).__name__} backend pulls with its own credentials (on Docker the engine's, "
            "images.registries in sandboxd.toml); leave spec.image_pull_secrets empty"
        )


def check_network(config: PoolConfig) -> None:
    """Validates a pool spec's network rules (INVALID_ARGUMENT naming ``spec.network`` and the rule)."""
    try:
        EgressPolicy.parse(config.network)
    except InvalidArgument as e:
        raise InvalidArgument("spec.network", e.message.removeprefix("network: ")) from e


def network_refusal(backend: object, runtime: str, network: list[str], model: bool = False) -> str | None:
    """Why a pool with these network rules (and the model route, with
    ``model``) cannot be had on ``backend``; None when it can (or has
    neither). A policy is never accepted unenforced."""
    if not network and not model:
        return None
    if not isinstance(backend, EgressPolicies):
        return (
            f"the {type(backend).__name__} backend does not enforce network policies; "
            "leave spec.network and spec.model_endpoint empty (no network) or use the Docker backend"
        )
    if network and (refusal := backend.network_refusal(runtime)):
        return refusal
    if not model:
        return None
    if not isinstance(backend, ModelRoutes):
        return f"the {type(backend).__name__} backend does not serve the model gateway (spec.model_endpoint)"
    return backend.model_route_refusal(runtime)


def check_model_endpoint(config: PoolConfig) -> None:
    """Validates a pool spec's model endpoint: an http(s) URL with a host and
    no credentials, query or fragment (INVALID_ARGUMENT naming ``spec.model_endpoint``)."""
    url = config.model_endpoint
    if not url:
        return
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as e:
        raise InvalidArgument("spec.model_endpoint", f"not a URL ({e}): {url[:200]!r}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidArgument(
            "spec.model_endpoint", f"must be an http:// or https:// URL with a host, got {url[:200]!r}"
        )
    if parts.username or parts.password or parts.query or parts.fragment:
        raise InvalidArgument(
            "spec.model_endpoint", "must not carry credentials, a query or a fragment (the base URL only)"
        )
    if len(url) > 2048 or (port is not None and not 1 <= port <= 65535):
        raise InvalidArgument("spec.model_endpoint", "must be at most 2048 characters with a valid port")


def check_announcement(
    config: PoolConfig,
    source: str,
    count: int,
    in_seconds: float,
    ttl_seconds: float,
    images: tuple[tuple[str, int], ...] = (),
) -> None:
    """Validates an announcement of demand for the pool ``config`` describes;
    ``images`` (image, count) say how many of ``count`` are of which image."""
    if count < 0:
        raise InvalidArgument("count", f"must be >= 0, got {count}")
    for image, n in images:
        if n < 0:
            raise InvalidArgument(f"images[{image[:80]!r}]", f"must be >= 0, got {n}")
        config.image_for(image, f"images[{image[:80]!r}]")
    if sum(n for _, n in images) > count:
        raise InvalidArgument(
            "images", f"counts add up to {sum(n for _, n in images)}, above count ({count})"
        )
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
