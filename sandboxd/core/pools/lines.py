"""A pool's hand-out lines, one per image: the READY sandboxes of each image
and the acquirers waiting for that image (``handout.Handout`` each), the
creates in flight per image, and the warm target the policy split over
images. A pool that serves only its own image has one line, as before.

What to create is worked out per image (waiters' needs first, then warm
targets), counting what is READY and what is already being created *of that
image*, so a stale view never over-creates one image to make up for another.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping

from sandboxd.clock import Clock
from sandboxd.core.lifecycle import SandboxRecord
from sandboxd.core.pools.handout import Handout


class ImageLines:
    """The per-image lines of one pool; ``own`` is the pool's own image."""

    def __init__(self, clock: Clock, own: str, on_change: Callable[[], None]) -> None:
        self._clock = clock
        self._on_change = on_change
        self.own = own
        self._lines: dict[str, Handout] = {own: Handout(clock, on_change)}
        self.creating: Counter[str] = Counter()
        """Creates in flight per image (reserved until they end)."""
        self.targets: Mapping[str, int] = {}
        """READY sandboxes the policy keeps per image."""

    def line(self, image: str) -> Handout:
        """The line of ``image`` (made on first use)."""
        found = self._lines.get(image)
        if found is None:
            found = self._lines[image] = Handout(self._clock, self._on_change)
        return found

    def images(self) -> list[str]:
        """Images with a line (own first)."""
        return list(self._lines)

    # -- totals ---------------------------------------------------------------

    @property
    def ready(self) -> int:
        """READY sandboxes of every image."""
        return sum(h.ready for h in self._lines.values())

    @property
    def waiting(self) -> int:
        """Acquirers in line, every image."""
        return sum(h.waiting for h in self._lines.values())

    def outstanding(self) -> int:
        """Sandboxes the acquirers in line are still owed, every image."""
        return sum(h.outstanding() for h in self._lines.values())

    def oldest_wait(self) -> float:
        """Seconds the longest-waiting acquirer of any image has waited."""
        return max((h.oldest_wait() for h in self._lines.values()), default=0.0)

    def records(self) -> list[SandboxRecord]:
        """READY records of every image, oldest first within each image."""
        return [rec for h in self._lines.values() for rec in h.records()]

    # -- records ----------------------------------------------------------------

    def put(self, rec: SandboxRecord) -> None:
        """A sandbox of ``rec.image`` became READY; its image's waiters come first."""
        self.line(rec.image).put(rec)

    def discard(self, rec: SandboxRecord) -> None:
        """Takes ``rec`` out of its image's READY line."""
        found = self._lines.get(rec.image)
        if found is not None:
            found.discard(rec)

    def clear(self) -> None:
        """Empties every READY line (the pool is closing)."""
        for h in self._lines.values():
            h.clear()

    def fail_waiters(
        self, error: Callable[[], Exception], *, forget: bool = False, image: str | None = None
    ) -> None:
        """Fails the waiters of ``image`` (None = of every image) with a fresh ``error()``."""
        lines = (
            self._lines.values() if image is None else [self._lines[image]] if image in self._lines else []
        )
        for h in lines:
            h.fail_waiters(error, forget=forget)

    def prune(self) -> None:
        """Drops lines of other images that hold nothing and are not wanted
        (a pool that served 10,000 images keeps no 10,000 empty lines)."""
        for image in [i for i, h in self._lines.items() if i != self.own and not h.ready and not h.waiting]:
            if not self.creating[image] and not self.targets.get(image):
                del self._lines[image]
                self.creating.pop(image, None)

    # -- what to create and what may go ------------------------------------------

    def shortfalls(self, *, warm: bool, blocked: Iterable[str] = ()) -> dict[str, int]:
        """Creates wanted per image: what waiters are owed (and, with
        ``warm``, the image's warm target) less what is READY or being
        created of that image. Images in ``blocked`` get no warm creates
        (not on the engine yet, or failing); waiters' needs always count."""
        skip = set(blocked)
        out: dict[str, int] = {}
        for image in {*self._lines, *self.targets}:
            h = self._lines.get(image)
            owed = h.outstanding() if h else 0
            target = self.targets.get(image, 0) if warm and image not in skip else 0
            missing = target + owed - (h.ready if h else 0) - self.creating[image]
            if missing > 0:
                out[image] = missing
        return out

    def order(self, urgent: Mapping[str, int], warm: Mapping[str, int], n: int) -> list[str]:
        """The images of the next ``n`` creates: waiters' needs first (the
        image waited on longest first), then warm targets, most missing first."""
        picks: list[str] = []
        by_wait = sorted(urgent, key=lambda i: -self._lines[i].oldest_wait() if i in self._lines else 0.0)
        for image in by_wait:
            picks += [image] * urgent[image]
        left = {i: warm.get(i, 0) - urgent.get(i, 0) for i in warm}
        while len(picks) < n and any(v > 0 for v in left.values()):
            image = max(left, key=lambda i: (left[i], i == self.own))
            picks.append(image)
            left[image] -= 1
        return picks[:n]

    def victims(self, n: int) -> list[SandboxRecord]:
        """Up to ``n`` READY sandboxes to destroy: of images nobody waits
        for, the image furthest above its warm target first, newest first."""
        spare = {image: h.records() for image, h in self._lines.items() if not h.waiting and h.ready}
        out: list[SandboxRecord] = []
        while len(out) < n and any(spare.values()):
            image = max(
                (i for i in spare if spare[i]),
                key=lambda i: (len(spare[i]) - self.targets.get(i, 0), i != self.own),
            )
            out.append(spare[image].pop())
        return out

    def spare(self) -> int:
        """READY sandboxes of images nobody waits for."""
        return sum(h.ready for h in self._lines.values() if not h.waiting)
