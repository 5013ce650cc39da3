"""Which images the cache removes to get back within its budget: a pure
choice over the ledger, so the rule is tested without an engine."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from sandboxd.core.images.ledger import Entry


@dataclass(frozen=True)
class Footprint:
    """Bytes one cached image takes: its own layers and those it shares with others."""

    unique_bytes: int
    shared_bytes: int


def cache_bytes(footprints: Mapping[str, Footprint]) -> int:
    """Disk the cached images take together: each one's own layers, plus the
    largest shared part once (their common base; exact when the images share
    one base, as a dataset's task images do)."""
    if not footprints:
        return 0
    return sum(f.unique_bytes for f in footprints.values()) + max(f.shared_bytes for f in footprints.values())


def choose_victims(
    entries: Collection[Entry],
    footprints: Mapping[str, Footprint],
    budget: int,
    pinned: Collection[str],
) -> list[Entry]:
    """The entries to remove, least recently used first, until the cached
    images fit ``budget``; never one in ``pinned`` (in use or wanted) and
    never one not on the engine (no footprint). May leave the cache over its
    budget when what is pinned takes more."""
    present = {e.reference: e for e in entries if e.reference in footprints}
    remaining = dict(footprints)
    used = cache_bytes(remaining)
    victims: list[Entry] = []
    for entry in sorted(present.values(), key=lambda e: (e.last_used, e.reference)):
        if used <= budget:
            break
        if entry.reference in pinned:
            continue
        victims.append(entry)
        del remaining[entry.reference]
        used = cache_bytes(remaining)
    return victims
