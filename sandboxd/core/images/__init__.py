"""Images for sandboxes: pulls from registries, builds, and a cache of them
on the engine kept within a disk budget.

``ImageCache`` (sandboxd.core.images.cache) is the face the pools use:
``ensure`` an image before creating a sandbox of it, ``use``/``unuse`` around
each sandbox's life, ``want`` for announced demand (prefetched, never
evicted), ``progress`` for watchers. The engine side is the backend's
optional ``ImageStore`` port (sandboxd.backends.base).

May import: the backends' port (``ImageStore``, ``ImagePrefetch`` and the
image types of ``sandboxd.backends.base``), ``sandboxd.settings``,
``sandboxd.clock``, ``sandboxd.errors`` and the rest of ``sandboxd.core``
below the control plane; never ``sandboxd.api`` or a backend's own package.
"""

from sandboxd.core.images.cache import ImageCache
from sandboxd.core.images.progress import DONE, FAILED, PULLING, QUEUED, PullProgress

__all__ = ["DONE", "FAILED", "PULLING", "QUEUED", "ImageCache", "PullProgress"]
