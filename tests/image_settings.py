"""The image cache's settings as tests use them: no eviction loop, no
registry credentials file of this machine's, and room for every image,
unless a test says otherwise."""

from __future__ import annotations

from sandboxd.settings import ImageSettings

__all__ = ["image_settings"]


def image_settings(**kw: object) -> ImageSettings:
    base: dict[str, object] = {
        "evict_interval_seconds": 0.0,
        "docker_config": "/nonexistent",
        "cache_bytes": 1 << 40,
    }
    base.update(kw)
    return ImageSettings(**base)  # type: ignore[arg-type]
