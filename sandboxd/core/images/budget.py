"""The image cache's disk budget: room made before a pull (unused images
evicted least recently used first for what its manifest says it brings),
the check after pulls and on a timer, and what keeps an image (in use,
wanted by announced demand, ensured, being pulled)."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from sandboxd.backends.base import EngineImage, ImageStore, RegistryAuth
from sandboxd.clock import Clock
from sandboxd.core.images.eviction import Footprint, cache_bytes, choose_victims
from sandboxd.core.images.ledger import Entry, ImageLedger
from sandboxd.core.images.meters import ImageMeters
from sandboxd.core.images.progress import Flight
from sandboxd.core.images.room import Room
from sandboxd.errors import FailedPrecondition, SandboxdError
from sandboxd.settings import ImageSettings

# The cache's logger: eviction messages keep the name operators filter on.
log = logging.getLogger("sandboxd.core.images.cache")


@dataclass
class Demand:
    """Announced demand: image -> sandboxes coming, by the source that announced it."""

    by_source: dict[str, dict[str, int]] = field(default_factory=dict)

    def images(self) -> set[str]:
        return {image for wanted in self.by_source.values() for image in wanted}


class BudgetKeeping:
    """The budget half of ImageCache (mixed into it): the state it reads is
    the cache's own, set up by ImageCache.__init__."""

    settings: ImageSettings
    meters: ImageMeters
    _store: ImageStore | None
    _clock: Clock
    _ledger: ImageLedger
    _entries: dict[str, Entry]
    _present: set[str]
    _flights: dict[str, Flight]
    _in_use: Counter[str]
    _ensured: dict[str, float]
    _demand: Demand
    _budget: int
    _used: int
    _listed: bool
    _footprints: dict[str, Footprint]
    """Of sandboxd's images at the last listing, less those removed since."""
    _room: Room
    _evicts: bool
    _evicting: asyncio.Lock
    _check_queued: bool

    _spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Future[None]]
    """Runs background work the cache awaits at stop."""

    async def _make_room(self, image: str, auth: RegistryAuth | None) -> None:
        """Reserves what ``image`` will take (its registry manifest's layers
        the engine lacks) and evicts unused images for it before the pull
        begins, so the disk stays within the budget while it lands. When what
        the cache holds is in use or wanted the pull still goes on (the
        budget is the cache's, not the disk's, and refusing it would fail an
        acquire that the disk can hold): a warning and
        ``sandboxd_image_pulls_over_budget_total`` say so."""
        assert self._store is not None
        if not self._evicts or self._budget <= 0:
            return
        try:
            remote = await self._store.registry_image(image, auth)
        except SandboxdError as e:
            # The pull answers with its own error if there is one; its room
            # is then made once it landed.
            log.info("image cache: no size for %s before its pull: %s", image, e)
            return
        self._room.reserve(image, remote, self._room.need(remote, list(self._entries)))
        try:
            if self._listed:
                # From the last listing and what landed since: no disk-usage
                # computation before each pull (the engine runs one at a
                # time for everyone); the checks after pulls list again.
                await self._evict_known()
            else:
                await self.enforce_budget()
        except SandboxdError as e:
            log.warning("image cache: no room made before the pull of %s: %s", image, e)
            return
        short = self._used + self._room.reserved() - self._budget
        if short > 0:
            self.meters.over_budget.add(1)
            log.warning(
                "image cache: pulling %s (%.1f MB expected) goes %.1f MB over the %.1f MB budget: "
                "what the cache holds is in use or wanted",
                image,
                (self._room.reserved() - self._room.reserved(besides=image)) / 1e6,
                short / 1e6,
                self._budget / 1e6,
            )

    def _pinned(self, image: str) -> bool:
        return (
            image in self._in_use
            or image in self._flights
            or image in self._demand.images()
            or self._ensured.get(image, 0.0) > self._clock.monotonic()
        )

    def _check_budget_soon(self) -> None:
        # One check waiting is enough however many pulls end meanwhile: it
        # lists the engine's images after they all landed.
        if self._check_queued:
            return
        self._check_queued = True

        async def check() -> None:
            try:
                async with self._evicting:
                    self._check_queued = False
                await self.enforce_budget()
            finally:
                self._check_queued = False

        self._spawn(check())

    async def _tick(self) -> None:
        while True:
            await self._clock.sleep(self.settings.evict_interval_seconds)
            try:
                await self.enforce_budget()
            except SandboxdError as e:
                log.warning("image cache budget check failed: %s", e)

    async def _images_by_reference(self) -> dict[str, EngineImage]:
        assert self._store is not None
        out: dict[str, EngineImage] = {}
        for found in await self._store.list_images():
            for ref in found.references:
                out[ref] = found
        return out

    async def enforce_budget(self) -> list[Entry]:
        """Removes unused images sandboxd pulled or built, least recently used
        first, until they fit the budget; returns what it removed. An entry
        whose reference now names another image (re-tagged by someone else)
        is forgotten, never removed."""
        if self._store is None:
            return []
        async with self._evicting:
            on_engine = await self._images_by_reference()
            # What an inspect found under a name the listing spells otherwise
            # stays known, unless it is one of sandboxd's own (listed as asked).
            kept = {r for r in self._present if r not in self._entries}
            self._present = set(on_engine) | kept
            for ref, entry in list(self._entries.items()):
                if image_id_of(on_engine.get(ref)) != entry.image_id:
                    del self._entries[ref]
                    self._room.forget(ref)
                    await self._ledger.delete(ref)
            footprints = {
                ref: Footprint(max(0, img.size_bytes - img.shared_bytes), img.shared_bytes)
                for ref, img in on_engine.items()
                if ref in self._entries
            }
            self._used = cache_bytes(footprints)
            self._listed = True
            if self._budget <= 0:
                self._footprints = footprints
                return []
            # Pulls under way land into the room set aside for them.
            removed = await self._evict(footprints, self._budget - self._room.reserved())
            self._footprints = footprints
            self._used = cache_bytes(footprints)
            if self._used > self._budget:
                log.warning(
                    "image cache holds %.1f MB over its %.1f MB budget: the rest is in use or wanted",
                    self._used / 1e6,
                    self._budget / 1e6,
                )
            return removed

    async def _evict_known(self) -> None:
        """Makes room for the pulls under way by what the last listing found."""
        async with self._evicting:
            footprints = dict(self._footprints)
            # Images landed since the listing are in ``_used`` only.
            landed = max(0, self._used - cache_bytes(footprints))
            await self._evict(footprints, self._budget - self._room.reserved() - landed)
            self._footprints = footprints
            self._used = cache_bytes(footprints) + landed

    async def _evict(self, footprints: dict[str, Footprint], room: int) -> list[Entry]:
        """Removes unpinned images, least recently used first, until those in
        ``footprints`` (updated) fit ``room``; the caller holds ``_evicting``."""
        assert self._store is not None
        now = self._clock.monotonic()
        self._ensured = {image: until for image, until in self._ensured.items() if until > now}
        pinned = set(self._in_use) | self._demand.images() | set(self._flights) | set(self._ensured)
        victims = choose_victims(self._entries.values(), footprints, room, pinned)
        removed: list[Entry] = []
        for entry in victims:
            if self._pinned(entry.reference):
                # Ensured, used or wanted while the removals before it ran.
                continue
            try:
                await self._store.remove_image(entry.reference)
            except FailedPrecondition as e:
                # A container sandboxd does not track still runs it.
                log.info("image cache: %s stays: %s", entry.reference, e)
                continue
            del self._entries[entry.reference]
            self._room.forget(entry.reference)
            self._present.discard(entry.reference)
            del footprints[entry.reference]
            await self._ledger.delete(entry.reference)
            self.meters.evictions.add(1, {"reason": "budget"})
            removed.append(entry)
            log.info(
                "image cache: removed %s (%.1f MB, unused, least recently used) to stay within %.1f MB"
                " (%.1f MB of it set aside for pulls under way)",
                entry.reference,
                entry.size / 1e6,
                self._budget / 1e6,
                self._room.reserved() / 1e6,
            )
        return removed


def image_id_of(found: EngineImage | None) -> str:
    return found.image_id if found is not None else ""
