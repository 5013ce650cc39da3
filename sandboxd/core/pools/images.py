"""What a pool needs from the image cache (sandboxd.core.images.ImageCache
satisfies it): images made present before sandboxes of them start, pinned
while sandboxes of them exist, and announced demand that is pulled ahead and
never evicted. The pool knows the cache only as this protocol, so a server
without one (tests on the fake backend) runs pools all the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol


class ImageSource(Protocol):
    """The image cache as a pool uses it."""

    async def ensure(self, image: str, deadline: float | None = None) -> None:
        """Returns once ``image`` is on the engine (pulled if absent). Raises
        FailedPrecondition (no such image), Unavailable (registry unreachable)
        or DeadlineExceeded (``deadline``, a monotonic clock time, passed)."""
        ...

    def present(self, image: str) -> bool:
        """Whether ``image`` is known to be on the engine now (no I/O)."""
        ...

    def use(self, image: str) -> None:
        """A sandbox of ``image`` now exists: the image stays."""
        ...

    def unuse(self, image: str) -> None:
        """One sandbox of ``image`` is gone."""
        ...

    def want(self, source: str, images: Mapping[str, int], pull_secrets: tuple[str, ...] = ()) -> None:
        """``source``'s announced demand per image (replaces its previous set;
        empty withdraws it): pulled ahead (onto nodes with ``pull_secrets``,
        where nodes pull), never evicted."""
        ...
