"""A template pool's dealings with the image cache: the images announcements
expect, told to the cache (pulled ahead, never evicted) and pulled so that
warm creates of them can start; which images get no warm creates yet (not
on the engine, or failing); an image made present before its acquirer
waits; sandboxes of an image pinning it while they exist. Without a cache
(``images`` None) only the engine's own images can be served."""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

from sandboxd.backends.base import Backend
from sandboxd.clock import Clock
from sandboxd.core.pools.images import ImageSource
from sandboxd.errors import FailedPrecondition

log = logging.getLogger(__name__)


class PoolImages:
    """The images of one pool beyond its own. ``spawn`` runs a background
    pull in the pool's task set; ``poke`` tells the pool to look again;
    ``fail_waiters(image, error)`` fails the acquirers of one image."""

    def __init__(
        self,
        pool: str,
        own: str,
        images: ImageSource | None,
        backend: Backend,
        clock: Clock,
        *,
        hold_seconds: float,
        spawn: Callable[[Coroutine[Any, Any, None]], None],
        poke: Callable[[], None],
        fail_waiters: Callable[[str, Callable[[], Exception]], None],
        pull_secrets: tuple[str, ...] = (),
    ) -> None:
        self._pool = pool
        self._pull_secrets = pull_secrets
        self._own = own
        self._images = images
        self._backend = backend
        self._clock = clock
        self._hold = hold_seconds
        self._spawn = spawn
        self._poke = poke
        self._fail_waiters = fail_waiters
        # Images whose creates fail permanently, until when their warm
        # creates are held back (their acquirers are failed at once).
        self._failing: dict[str, tuple[float, str]] = {}
        self._fetching: set[str] = set()
        self._wanted: dict[str, int] = {}

    @property
    def _source(self) -> str:
        return f"pool:{self._pool}"

    def blocked(self, targets: Iterable[str]) -> set[str]:
        """Of ``targets``, the images that get no warm creates now: not on the
        engine yet (being pulled ahead), and any failing."""
        now = self._clock.monotonic()
        blocked = {image for image, (until, _) in self._failing.items() if now < until}
        if self._images is not None:
            blocked |= {i for i in targets if i != self._own and not self._images.present(i)}
        return blocked

    def want(self, wanted: dict[str, int]) -> None:
        """Announcements expect ``wanted`` (image -> acquires): tells the cache
        when that changed, and pulls those not on the engine."""
        wanted = {i: n for i, n in wanted.items() if i != self._own}
        if self._images is None or wanted == self._wanted:
            return
        self._wanted = wanted
        self._images.want(self._source, wanted, self._pull_secrets)
        for image in wanted:
            if image not in self._fetching and not self._images.present(image):
                self._fetching.add(image)
                self._spawn(self._fetch(image))

    def withdraw(self) -> None:
        """The pool is closing: it wants nothing any more."""
        if self._images is not None and self._wanted:
            self._images.want(self._source, {})
        self._wanted = {}

    async def _fetch(self, image: str) -> None:
        assert self._images is not None
        try:
            await self._images.ensure(image)
        except Exception as e:  # the cause is kept and shown; acquirers of it get it typed from ensure
            self.failed(image, str(e) or type(e).__name__)
        finally:
            self._fetching.discard(image)
            self._poke()

    def failed(self, image: str, reason: str) -> None:
        """``image`` cannot be started: its acquirers fail now, and its warm
        creates wait a while (the pool's other images go on)."""
        log.warning("pool %s: image %s cannot be started: %s", self._pool, image, reason)
        self._failing[image] = (self._clock.monotonic() + self._hold, reason)
        self._fail_waiters(
            image,
            lambda: FailedPrecondition(f"pool {self._pool}: image {image!r} cannot be started: {reason}"),
        )

    async def ensure(self, image: str, deadline: float) -> None:
        """Makes ``image`` present before its acquirer waits in line: FAILED_PRECONDITION
        (no such image), UNAVAILABLE (registry unreachable), DEADLINE_EXCEEDED (the
        pull outlasted ``deadline``) come from the cache, typed, at once."""
        if self._images is not None:
            await self._images.ensure(image, deadline)
        elif not await self._backend.image_exists(image):
            raise FailedPrecondition(f"pool {self._pool}: image {image!r} is not present on the backend")
        self._failing.pop(image, None)

    def use(self, image: str) -> None:
        """A sandbox of ``image`` now exists (reserved, adopted)."""
        if self._images is not None:
            self._images.use(image)

    def unuse(self, image: str) -> None:
        """One sandbox of ``image`` is gone."""
        if self._images is not None:
            self._images.unuse(image)


__all__ = ["PoolImages"]
