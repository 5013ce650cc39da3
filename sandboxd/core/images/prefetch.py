"""Announced images pulled onto nodes ahead of their sandboxes, on a backend
whose nodes pull for themselves (ImagePrefetch: Kubernetes), at most every
PREFETCH_AGAIN_SECONDS per image; a failure is retried at the next
announcement."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from sandboxd.backends.base import ImagePrefetch
from sandboxd.clock import Clock
from sandboxd.errors import SandboxdError

log = logging.getLogger(__name__)

PREFETCH_AGAIN_SECONDS = 600.0
"""A wanted image is pulled onto nodes again at most this often (new
nodes, images the kubelets' own collection removed)."""


class NodePrefetch:
    """When each wanted image was last pulled onto nodes."""

    def __init__(
        self,
        backend: ImagePrefetch,
        clock: Clock,
        spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Future[None]],
    ) -> None:
        self._backend = backend
        self._clock = clock
        self._spawn = spawn
        self.last: dict[str, float] = {}

    def want(self, wanted: Mapping[str, int], pull_secrets: tuple[str, ...] = ()) -> None:
        """Starts pre-pulls of the images of ``wanted`` (image -> sandboxes
        coming) not pre-pulled within PREFETCH_AGAIN_SECONDS."""
        now = self._clock.monotonic()
        for image, copies in wanted.items():
            last = self.last.get(image)
            if last is not None and now - last < PREFETCH_AGAIN_SECONDS:
                continue
            self.last[image] = now
            self._spawn(self._prefetch(image, copies, pull_secrets))

    async def _prefetch(self, image: str, copies: int, pull_secrets: tuple[str, ...]) -> None:
        try:
            started = await self._backend.prefetch_image(image, copies, pull_secrets)
        except SandboxdError as e:
            self.last.pop(image, None)
            log.warning("pre-pull of image %s onto nodes failed: %s", image, e)
            return
        if started:
            log.info("pre-pulling image %s onto %d node(s)", image, started)
