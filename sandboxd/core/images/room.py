"""Room made on the disk before a pull: what an image will take once pulled,
estimated from its registry manifest, held as a reservation while it is
fetched so the budget check counts it before it lands."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from sandboxd.backends.base import RemoteImage


@dataclass(frozen=True)
class Reservation:
    """Bytes set aside for one pull, and whether the budget could hold them."""

    image: str
    bytes: int
    fits: bool = True


class Room:
    """Layers of the images sandboxd pulled (by registry blob digest) and the
    bytes reserved for pulls in flight."""

    def __init__(self, unpack_ratio: float) -> None:
        """``unpack_ratio``: disk bytes per compressed byte of a layer."""
        self._ratio = max(1.0, unpack_ratio)
        self._layers: dict[str, frozenset[str]] = {}
        self._reserved: dict[str, int] = {}

    def need(self, remote: RemoteImage, on_engine: Collection[str]) -> int:
        """Disk the pull of ``remote`` will take: its layers that no image in
        ``on_engine`` (references) nor a pull in flight is known to hold, as
        unpacked. A layer of an image sandboxd did not pull (a base built
        here) is not known, so counted: more than the truth, never less."""
        known: set[str] = set()
        for reference in (*on_engine, *self._reserved):
            known |= self._layers.get(reference, frozenset())
        if not remote.layers:
            return int(remote.compressed_bytes * self._ratio)
        lacking = {digest: size for digest, size in remote.layers if digest not in known}
        return int(sum(lacking.values()) * self._ratio)

    def reserve(self, image: str, remote: RemoteImage, size: int) -> None:
        """Sets ``size`` bytes aside for the pull of ``image`` and records its layers."""
        self._layers[image] = frozenset(digest for digest, _ in remote.layers)
        self._reserved[image] = size

    def release(self, image: str) -> int:
        """The pull of ``image`` ended: landed (the engine's listing counts it
        from now) or failed. Returns the bytes that were set aside."""
        return self._reserved.pop(image, 0)

    def forget(self, image: str) -> None:
        """``image`` left the engine: its layers no longer count as held."""
        self._layers.pop(image, None)

    def reserved(self, besides: str = "") -> int:
        """Bytes reserved for pulls in flight (except ``besides``'s)."""
        return sum(size for image, size in self._reserved.items() if image != besides)
