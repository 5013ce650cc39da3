"""Images for sandboxes: pulls from registries, builds, and a cache of them
on the engine kept within a disk budget.

``ImageCache`` (sandboxd.core.images.cache) is the face the pools use:
``ensure`` an image before creating a sandbox of it, ``use``/``unuse`` around
each sandbox's life, ``want`` for announced demand (prefetched, never
evicted), ``progress`` for watchers. The engine side is the backend's
optional ``ImageStore`` port (sandboxd.backends.base)."""

from sandboxd.core.images.cache import ImageCache
from sandboxd.core.images.progress import DONE, FAILED, PULLING, QUEUED, PullProgress

__all__ = ["DONE", "FAILED", "PULLING", "QUEUED", "ImageCache", "PullProgress"]
