"""The scaling policy: pure functions from a pool's demand signals to its warm
target. No I/O, no clock reads, no asyncio: state in, plan out. The
reconciler (sandboxd.core.reconciler) gathers the signals and carries the
plan out.

Signals (``Signals``) and where they come from:

- ``waiting``: sandboxes owed to acquirers waiting right now. They are always
  created on top of the target (the pool adds them), so the policy only uses
  them to decide what to keep.
- ``leased``: sandboxes in use; the warm target never asks for more than
  ``max_size - leased - waiting`` (there would be no room).
- ``acquire_rate``: smoothed rate of acquires nobody announced (sandboxes per
  second, ``DecayingRate``). By Little's law, ``rate x start-up latency``
  acquires arrive while one sandbox starts, so that many are kept warm (times
  a headroom factor) for an acquirer never to wait on a cold start.
- ``startup_seconds``: smoothed start-up latency (``Ewma``).
- ``announcements``: "in ~T seconds I will run N rollouts on this pool" from
  the RL loop (SetDemand/Prewarm). An announcement starts warming early
  enough for N sandboxes to be READY by its due time (its lead: one start-up,
  plus N divided by the start pipeline's throughput, plus a margin); acquires
  consume it, so a step's burst is not refilled afterwards; it stops counting
  at its expiry.

The plan has two numbers, which form a hysteresis band so the pool does not
flap: ``target`` is what to create up to (follows demand at once, up and
down: nothing is ever created for demand that has passed), and ``keep`` is
what to keep (the highest level asked for during the last
``scale_down_delay`` seconds): READY sandboxes are destroyed only above
``keep``. A sandbox therefore lives at least ``scale_down_delay`` seconds
after the demand that made it, and is never destroyed then re-created within
that window. With nothing announced or used, both fall to ``min_ready``
(zero, unless the pool has a floor): scale-to-zero between training steps.

A pool whose ``max_ready`` is not above ``min_ready`` is static: its target
is ``min_ready``, as before demand following existed.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

__all__ = [
    "Announcement",
    "Bounds",
    "DecayingRate",
    "Ewma",
    "Plan",
    "PolicyConfig",
    "ScalerState",
    "Signals",
    "active_announcements",
    "announced_images",
    "consume",
    "decide",
    "image_targets",
    "share",
]


@dataclass(frozen=True)
class PolicyConfig:
    """The policy's knobs: one value for every pool of a server, from its pool settings."""

    scale_down_delay: float = 30.0
    """Seconds demand must stay lower before warm sandboxes are destroyed."""
    rate_headroom: float = 1.5
    """Warm sandboxes kept for unannounced traffic: rate x start-up x this."""
    min_rate_term: float = 0.25
    """Expected arrivals per start-up below which traffic keeps none warm."""
    lead_factor: float = 1.5
    """Safety factor on the time an announcement needs to warm (start-up
    plus count / throughput); the engine can be slower than it was."""
    lead_margin: float = 2.0
    """Seconds added to an announcement's lead time."""
    create_throughput: float = 0.0
    """Sandboxes per second the start pipeline sustains; 0 = derive it from
    ``max_starting`` and the start-up latency."""
    max_starting: int = 8
    """Sandboxes one pool starts at once (for the derived throughput)."""
    min_startup_seconds: float = 0.1
    """Floor of the start-up latency the policy assumes (a backend that
    answers at once still takes some time to use)."""


@dataclass(frozen=True)
class Bounds:
    """What a plan never goes past: the pool's floor, its warm ceiling and its total size."""

    min_ready: int
    """Floor: READY sandboxes kept whatever the demand."""
    max_ready: int
    """Ceiling of the warm target; not above ``min_ready`` = a static pool."""
    max_size: int
    """Sandboxes of the pool in any state."""

    @property
    def follows_demand(self) -> bool:
        """Whether the target follows demand; if not, the pool is static at ``min_ready``."""
        return self.max_ready > self.min_ready


@dataclass(frozen=True)
class Announcement:
    """Announced demand: ``remaining`` acquires expected from ``due`` on."""

    source: str
    remaining: int
    due: float
    """Monotonic seconds when the acquires are expected."""
    expires: float
    """Monotonic seconds after which what is left stops counting."""
    images: tuple[tuple[str, int], ...] = ()
    """How many of ``remaining`` are of which image, by name; what the
    counts leave out is of the pool's own image."""

    def of_image(self, image: str) -> int:
        """Announced acquires of ``image`` still expected (never above ``remaining``)."""
        return min(self.remaining, sum(n for name, n in self.images if name == image))


@dataclass(frozen=True)
class Signals:
    """A pool's demand at one instant, gathered by the pool; the module docstring says what each means."""

    now: float
    """Monotonic seconds."""
    ready: int = 0
    creating: int = 0
    leased: int = 0
    waiting: int = 0
    """Sandboxes owed to waiting acquirers."""
    acquire_rate: float = 0.0
    """Unannounced acquires per second, smoothed."""
    startup_seconds: float = 1.0
    """Start-up latency, smoothed."""
    announcements: tuple[Announcement, ...] = ()


@dataclass(frozen=True)
class ScalerState:
    """What the policy remembers: the levels asked for recently, as a
    staircase of (time, level) with strictly decreasing levels, so its head
    is the highest level within the window."""

    history: tuple[tuple[float, int], ...] = ()
    warming: frozenset[tuple[str, float]] = frozenset()
    """Announcements (source, due) that have started warming: they stay
    active until consumed or expired, even if a faster start-up estimate
    shortens their lead again (that would destroy and re-create)."""


@dataclass(frozen=True)
class Plan:
    """The policy's answer: create up to ``target``, destroy only READY ones above ``keep``;
    ``state`` goes into the next decision."""

    target: int
    """READY sandboxes to create up to (waiters' needs come on top)."""
    keep: int
    """READY sandboxes to keep; only those above are destroyed."""
    reason: str
    state: ScalerState = field(default_factory=ScalerState)
    rate_term: int = 0
    announced_term: int = 0


def lead_seconds(announcement: Announcement, signals: Signals, config: PolicyConfig) -> float:
    """How long before its due time an announcement starts warming."""
    startup = max(signals.startup_seconds, config.min_startup_seconds, 1e-3)
    throughput = config.create_throughput or max(config.max_starting, 1) / startup
    return config.lead_factor * (startup + announcement.remaining / throughput) + config.lead_margin


def active_announcements(
    signals: Signals, config: PolicyConfig, warming: frozenset[tuple[str, float]] = frozenset()
) -> list[Announcement]:
    """Announcements the pool warms for now: within their lead (or already
    warming), not expired, not consumed."""
    return [
        a
        for a in signals.announcements
        if a.remaining > 0
        and signals.now < a.expires
        and ((a.source, a.due) in warming or signals.now >= a.due - lead_seconds(a, signals, config))
    ]


def decide(signals: Signals, bounds: Bounds, config: PolicyConfig, state: ScalerState) -> Plan:
    """The warm target and what to keep, from the signals."""
    rate_term = announced_term = 0
    warming: frozenset[tuple[str, float]] = frozenset()
    if not bounds.follows_demand:
        desired, reason = bounds.min_ready, f"static pool: min_ready {bounds.min_ready}"
    else:
        startup = max(signals.startup_seconds, config.min_startup_seconds)
        expected = signals.acquire_rate * startup * config.rate_headroom
        rate_term = math.ceil(expected) if expected >= config.min_rate_term else 0
        active = active_announcements(signals, config, state.warming)
        warming = frozenset((a.source, a.due) for a in active)
        announced_term = sum(a.remaining for a in active)
        want = rate_term + announced_term
        room = max(0, bounds.max_size - signals.leased - signals.waiting)
        parts = []
        if announced_term:
            parts.append(f"announced {announced_term}")
        if rate_term:
            parts.append(f"rate {signals.acquire_rate:.2f}/s x start-up {signals.startup_seconds:.2f}s")
        reason = " + ".join(parts) or "idle"
        pending = [
            a
            for a in signals.announcements
            if a not in active and a.remaining > 0 and signals.now < a.expires
        ]
        if pending:
            starts = min(a.due - lead_seconds(a, signals, config) for a in pending) - signals.now
            reason += f" ({sum(a.remaining for a in pending)} announced, warming in {max(starts, 0):.0f}s)"
        desired = min(want, bounds.max_ready, room)
        if desired < want:
            reason += f", capped at {desired}"
        if desired < bounds.min_ready:
            desired = bounds.min_ready
            reason += f", floor min_ready {bounds.min_ready}"
    level = desired + signals.waiting
    horizon = signals.now - config.scale_down_delay
    history = [(t, v) for t, v in state.history if t > horizon]
    while history and history[-1][1] <= level:
        history.pop()
    history.append((signals.now, level))
    keep = max(history[0][1], desired)
    return Plan(
        target=desired,
        keep=keep,
        reason=reason,
        state=ScalerState(tuple(history), warming),
        rate_term=rate_term,
        announced_term=announced_term,
    )


def consume(
    announcements: tuple[Announcement, ...], n: int, now: float, image: str = ""
) -> tuple[tuple[Announcement, ...], int]:
    """Charges ``n`` acquires (of ``image``, "" = the pool's own) to unexpired
    announcements, earliest due first; those that name ``image`` are charged
    before those that do not, and their count of it goes down with their
    total. Returns the announcements left (spent and expired ones dropped)
    and how many of the ``n`` they covered; the rest is unannounced traffic."""
    live = sorted(
        (a for a in announcements if a.remaining > 0 and now < a.expires),
        key=lambda a: (not (image and a.of_image(image)), a.due),
    )
    covered = 0
    out = []
    for a in live:
        take = min(a.remaining, n - covered)
        covered += take
        if a.remaining - take > 0:
            out.append(replace(a, remaining=a.remaining - take, images=_charge(a.images, image, take)))
    return tuple(out), covered


def _charge(images: tuple[tuple[str, int], ...], image: str, n: int) -> tuple[tuple[str, int], ...]:
    """``images`` with ``n`` taken off ``image``'s count (entries that reach 0 dropped)."""
    out = []
    for name, count in images:
        if name == image and n > 0:
            take = min(count, n)
            count, n = count - take, n - take
        if count > 0:
            out.append((name, count))
    return tuple(out)


def announced_images(announcements: list[Announcement]) -> dict[str, int]:
    """Acquires still expected per named image across ``announcements``."""
    wants: dict[str, int] = {}
    for a in announcements:
        left = a.remaining
        for name in dict.fromkeys(name for name, _ in a.images):
            take = min(left, a.of_image(name))
            if take > 0:
                wants[name] = wants.get(name, 0) + take
            left -= take
    return wants


def image_targets(target: int, wants: Mapping[str, int], own: str, floor: int = 0) -> dict[str, int]:
    """Splits a pool's warm ``target`` over images: the announced ``wants``
    (image -> acquires expected) share it max-min fair (``share``), and what
    they leave goes to the pool's ``own`` image, which always keeps at least
    ``floor`` (the pool's min_ready) when the target allows. Pure."""
    floor = min(floor, target)
    others = {name: n for name, n in wants.items() if name != own}
    grants = share({}, others, target - max(floor, min(wants.get(own, 0), target)))
    rest = target - sum(grants.values())
    out = {name: n for name, n in grants.items() if n > 0}
    if rest > 0:
        out[own] = rest
    return out


def share(levels: Mapping[str, int], wants: Mapping[str, int], room: int) -> dict[str, int]:
    """Max-min fair split of ``room`` new creates among pools: each unit goes
    to the pool with the lowest level (what it already has in flight plus
    what it got so far) that still wants one; ties by name."""
    grants = {name: 0 for name in wants}
    if room <= 0:
        return grants
    if sum(max(w, 0) for w in wants.values()) <= room:
        return {name: max(w, 0) for name, w in wants.items()}
    heap = [(levels.get(name, 0), name) for name, w in wants.items() if w > 0]
    heapq.heapify(heap)
    while room > 0 and heap:
        level, name = heapq.heappop(heap)
        grants[name] += 1
        room -= 1
        if grants[name] < wants[name]:
            heapq.heappush(heap, (level + 1, name))
    return grants


class DecayingRate:
    """An event rate smoothed over ``tau`` seconds: every event adds
    ``1/tau`` and the sum decays as exp(-t/tau), so a steady rate r reads r.
    Time is passed in; nothing is read from a clock."""

    def __init__(self, tau: float) -> None:
        self.tau = tau
        self._value = 0.0
        self._at = 0.0

    def add(self, n: float, now: float) -> None:
        """Counts ``n`` events that happened at ``now``."""
        self._value = self.rate(now) + n / self.tau
        self._at = now

    def rate(self, now: float) -> float:
        """Events per second at ``now``, decayed since the last event; 0 before any."""
        if not self._value:
            return 0.0
        return self._value * math.exp(-max(0.0, now - self._at) / self.tau)


class Ewma:
    """Exponentially weighted mean; the first sample sets it. With
    ``alpha_down`` it rises faster than it falls (a cautious latency estimate:
    one slow start-up counts more than one fast one)."""

    def __init__(self, alpha: float, initial: float, alpha_down: float | None = None) -> None:
        self.alpha = alpha
        self.alpha_down = alpha if alpha_down is None else alpha_down
        self.value = initial
        self.samples = 0

    def add(self, x: float) -> None:
        """Folds in a sample (``alpha`` up, ``alpha_down`` down); the first one replaces ``initial``."""
        if self.samples == 0:
            self.value = x
        else:
            a = self.alpha if x >= self.value else self.alpha_down
            self.value = a * x + (1 - a) * self.value
        self.samples += 1
