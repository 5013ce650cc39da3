"""The pure scaling policy (sandboxd.core.scaling): signals in, plan out, on
a fake timeline, including replays of RL training steps (64 groups x 8
rollouts, long-tailed rollout lengths) through a small simulated pool."""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandboxd.core.scaling import (
    Announcement,
    Bounds,
    DecayingRate,
    Ewma,
    Plan,
    PolicyConfig,
    ScalerState,
    Signals,
    active_announcements,
    consume,
    decide,
    share,
)

pytestmark = pytest.mark.timeout(60)

DEMAND = Bounds(min_ready=0, max_ready=64, max_size=128)
CONFIG = PolicyConfig(
    scale_down_delay=30.0, rate_headroom=1.5, lead_factor=1.0, lead_margin=2.0, max_starting=8
)


def plan_at(now: float, state: ScalerState | None = None, bounds: Bounds = DEMAND, **signals: Any) -> Plan:
    return decide(Signals(now=now, **signals), bounds, CONFIG, state or ScalerState())


# -- the target -------------------------------------------------------------------


def test_a_static_pool_keeps_exactly_min_ready_whatever_the_demand() -> None:
    static = Bounds(min_ready=3, max_ready=0, max_size=8)
    plan = plan_at(0.0, bounds=static, acquire_rate=50.0, announcements=(Announcement("a", 100, 0.0, 60.0),))
    assert plan.target == plan.keep == 3
    assert "static" in plan.reason


def test_idle_pool_targets_its_floor() -> None:
    assert plan_at(0.0).target == 0
    floored = Bounds(min_ready=2, max_ready=10, max_size=16)
    plan = plan_at(0.0, bounds=floored)
    assert plan.target == plan.keep == 2
    assert "min_ready" in plan.reason


def test_rate_times_startup_latency_is_kept_warm() -> None:
    # 4 acquires/s, 2 s to start one: 8 arrive during a start-up; x1.5 headroom.
    plan = plan_at(0.0, acquire_rate=4.0, startup_seconds=2.0)
    assert plan.target == 12
    assert plan.rate_term == 12
    assert "rate" in plan.reason
    # A trickle keeps nothing warm.
    assert plan_at(0.0, acquire_rate=0.05, startup_seconds=1.0).target == 0


def test_target_is_capped_by_max_ready_and_by_room_left() -> None:
    plan = plan_at(0.0, acquire_rate=100.0, startup_seconds=2.0)
    assert plan.target == 64 and "capped" in plan.reason
    # 120 of 128 leased: only 8 more fit.
    assert plan_at(0.0, acquire_rate=100.0, startup_seconds=2.0, leased=120).target == 8
    # Waiters are created on top of the target, so they use up room too.
    assert plan_at(0.0, acquire_rate=100.0, startup_seconds=2.0, leased=120, waiting=5).target == 3


# -- announcements -----------------------------------------------------------------


def test_announcement_warms_within_its_lead_and_stops_at_expiry() -> None:
    a = Announcement("gen", 64, due=100.0, expires=160.0)
    sig = {"startup_seconds": 1.0, "announcements": (a,)}
    # Lead: one start-up (1 s) + 64 / (8 per second) + 2 s margin = 11 s.
    early = plan_at(88.0, **sig)
    assert early.target == 0
    assert "64 announced, warming in 1s" in early.reason
    assert plan_at(89.5, **sig).target == 64
    assert plan_at(120.0, **sig).announced_term == 64
    assert plan_at(160.0, **sig).target == 0


def test_lead_grows_with_the_count_and_a_slow_start_pipeline() -> None:
    slow = PolicyConfig(max_starting=2, lead_factor=1.0, lead_margin=0.0)
    a = Announcement("gen", 40, due=100.0, expires=200.0)
    # 2 at a time, 2 s each: 1 per second, so 40 need 40 s plus one start-up.
    sig = Signals(now=57.0, startup_seconds=2.0, announcements=(a,))
    assert active_announcements(sig, slow) == []
    sig = Signals(now=58.5, startup_seconds=2.0, announcements=(a,))
    assert active_announcements(sig, slow) == [a]
    # A configured pipeline throughput wins over the derived one.
    fast = PolicyConfig(create_throughput=40.0, lead_factor=1.0, lead_margin=0.0)
    sig = Signals(now=96.5, startup_seconds=2.0, announcements=(a,))
    assert active_announcements(sig, fast) == []  # lead: 2 s + 40 / 40 per second
    sig = Signals(now=97.5, startup_seconds=2.0, announcements=(a,))
    assert active_announcements(sig, fast) == [a]


def test_the_lead_has_a_safety_factor() -> None:
    a = Announcement("gen", 16, due=100.0, expires=200.0)
    cautious = PolicyConfig(max_starting=8, lead_factor=2.0, lead_margin=1.0)
    # 2 x (1 s start-up + 16 / 8 per second) + 1 s = 7 s.
    assert active_announcements(Signals(now=92.9, announcements=(a,)), cautious) == []
    assert active_announcements(Signals(now=93.1, announcements=(a,)), cautious) == [a]


def test_an_announcement_that_started_warming_stays_active() -> None:
    a = Announcement("gen", 64, due=100.0, expires=160.0)
    plan = plan_at(90.0, startup_seconds=1.0, announcements=(a,))  # lead 11 s: warming
    assert plan.target == 64
    # Start-ups got faster (lead 2.2 s): the announcement is no longer within
    # its lead, but what is warming for it is not dropped (and re-created later).
    plan = plan_at(91.0, plan.state, startup_seconds=0.1, announcements=(a,))
    assert plan.target == 64
    fresh = plan_at(91.0, startup_seconds=0.1, announcements=(a,))
    assert fresh.target == 0


def test_acquires_consume_announcements_earliest_first() -> None:
    first = Announcement("a", 5, due=10.0, expires=100.0)
    second = Announcement("b", 5, due=20.0, expires=100.0)
    left, covered = consume((second, first), 7, now=12.0)
    assert covered == 7
    assert left == (Announcement("b", 3, due=20.0, expires=100.0),)
    left, covered = consume(left, 10, now=12.0)
    assert covered == 3 and left == ()
    # Expired ones cover nothing and are dropped.
    left, covered = consume((first,), 3, now=100.0)
    assert covered == 0 and left == ()


# -- hysteresis ------------------------------------------------------------------


def test_keep_holds_for_the_scale_down_delay_then_falls() -> None:
    state = ScalerState()
    plan = plan_at(0.0, state, acquire_rate=4.0, startup_seconds=2.0)
    assert plan.target == plan.keep == 12
    state = plan.state
    plan = plan_at(1.0, state)  # demand gone: create nothing more ...
    assert plan.target == 0
    assert plan.keep == 12  # ... but destroy nothing yet
    plan = plan_at(29.0, plan.state)
    assert plan.keep == 12
    plan = plan_at(30.5, plan.state)
    assert plan.keep == 0


def test_keep_is_the_highest_level_within_the_window() -> None:
    plan = plan_at(0.0, acquire_rate=4.0, startup_seconds=2.0)  # 12
    plan = plan_at(10.0, plan.state, acquire_rate=2.0, startup_seconds=2.0)  # 6
    plan = plan_at(20.0, plan.state, acquire_rate=1.0, startup_seconds=2.0)  # 3
    assert plan.keep == 12
    assert plan_at(31.0, plan.state).keep == 6
    assert plan_at(41.0, plan.state).keep == 3
    assert plan_at(51.0, plan.state).keep == 0


def test_waiters_count_towards_what_is_kept() -> None:
    plan = plan_at(0.0, waiting=5)
    assert plan.target == 0 and plan.keep == 5


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.floats(0.0, 20.0),
            st.floats(0.0, 30.0),
            st.integers(0, 20),
            st.integers(0, 100),
        ),
        min_size=1,
        max_size=30,
    ),
    min_ready=st.integers(0, 4),
    max_ready=st.integers(0, 40),
)
def test_plan_invariants(steps: list[tuple[float, float, int, int]], min_ready: int, max_ready: int) -> None:
    bounds = Bounds(min_ready=min_ready, max_ready=max_ready, max_size=64)
    state = ScalerState()
    now = 0.0
    for gap, rate, waiting, leased in steps:
        now += gap
        plan = decide(
            Signals(now=now, acquire_rate=rate, waiting=waiting, leased=min(leased, 64)),
            bounds,
            CONFIG,
            state,
        )
        assert plan.target >= min_ready
        assert plan.target <= max(min_ready, max_ready)
        assert plan.keep >= plan.target + waiting
        levels = [v for _, v in plan.state.history]
        assert levels == sorted(levels, reverse=True) and len(set(levels)) == len(levels)
        state = plan.state


# -- helpers ---------------------------------------------------------------------


def test_decaying_rate_reads_a_steady_rate_and_decays() -> None:
    rate = DecayingRate(tau=10.0)
    t = 0.0
    for _ in range(2000):
        t += 0.1
        rate.add(1, t)  # 10 per second
    assert rate.rate(t) == pytest.approx(10.0, rel=0.06)
    assert rate.rate(t + 10.0) == pytest.approx(rate.rate(t) / math.e)
    assert DecayingRate(5.0).rate(100.0) == 0.0


def test_ewma_starts_at_the_first_sample() -> None:
    e = Ewma(alpha=0.5, initial=1.0)
    assert e.value == 1.0
    e.add(4.0)
    assert e.value == 4.0
    e.add(2.0)
    assert e.value == 3.0


def test_share_is_max_min_fair() -> None:
    assert share({}, {"a": 3, "b": 2}, 10) == {"a": 3, "b": 2}
    assert share({}, {"a": 10, "b": 10}, 6) == {"a": 3, "b": 3}
    # What a pool already has in flight counts: b catches up first.
    assert share({"a": 4, "b": 0}, {"a": 10, "b": 10}, 6) == {"a": 1, "b": 5}
    # A pool that wants little leaves the rest to the others.
    assert share({}, {"a": 1, "b": 10, "c": 10}, 7) == {"a": 1, "b": 3, "c": 3}
    assert share({}, {"a": 5}, 0) == {"a": 0}


# -- replays of RL training steps --------------------------------------------------


@dataclass
class Replay:
    """A simulated pool driven by the policy at ``dt`` resolution: creates
    take ``startup`` seconds, at most ``max_starting`` at once; acquires of
    whole groups queue FIFO; releases happen when a rollout ends."""

    bounds: Bounds
    config: PolicyConfig
    startup: float = 1.0
    max_starting: int = 64
    dt: float = 0.05
    now: float = 0.0
    ready: int = 0
    creating: list[float] = field(default_factory=list)
    leases: list[float] = field(default_factory=list)
    queue: list[tuple[float, int, list[float]]] = field(default_factory=list)
    announcements: tuple[Announcement, ...] = ()
    rate: DecayingRate = field(default_factory=lambda: DecayingRate(30.0))
    state: ScalerState = field(default_factory=ScalerState)
    created: int = 0
    destroyed: int = 0
    acquired: int = 0
    waits: list[float] = field(default_factory=list)
    idle_sandbox_seconds: float = 0.0
    ready_series: list[tuple[float, int]] = field(default_factory=list)
    last_trim: float = -math.inf
    recreated_soon_after_trim: int = 0

    def announce(self, count: int, in_seconds: float, ttl: float = 60.0) -> None:
        due = self.now + in_seconds
        self.announcements = (Announcement("gen", count, due, due + ttl),)

    def acquire(self, n: int, durations: list[float]) -> None:
        self.announcements, covered = consume(self.announcements, n, self.now)
        if n > covered:
            self.rate.add(n - covered, self.now)
        self.queue.append((self.now, n, durations))

    def tick(self) -> None:
        self.now += self.dt
        done = [t for t in self.creating if t <= self.now]
        self.creating = [t for t in self.creating if t > self.now]
        self.ready += len(done)
        while self.leases and self.leases[0] <= self.now:
            heapq.heappop(self.leases)
        while self.queue and self.ready >= self.queue[0][1]:
            arrived, n, durations = self.queue.pop(0)
            self.ready -= n
            self.acquired += n
            self.waits.extend([self.now - arrived] * n)
            for d in durations:
                heapq.heappush(self.leases, self.now + d)
        waiting = sum(n for _, n, _ in self.queue)
        plan = decide(
            Signals(
                now=self.now,
                ready=self.ready,
                creating=len(self.creating),
                leased=len(self.leases),
                waiting=waiting,
                acquire_rate=self.rate.rate(self.now),
                startup_seconds=self.startup,
                announcements=self.announcements,
            ),
            self.bounds,
            self.config,
            self.state,
        )
        self.state = plan.state
        missing = plan.target + waiting - self.ready - len(self.creating)
        room = self.bounds.max_size - self.ready - len(self.creating) - len(self.leases)
        n = max(0, min(missing, room, self.max_starting - len(self.creating)))
        if n and self.now - self.last_trim < 1.0:
            self.recreated_soon_after_trim += 1
        self.creating += [self.now + self.startup] * n
        self.created += n
        if not self.queue and self.ready > plan.keep:
            self.destroyed += self.ready - plan.keep
            self.ready = plan.keep
            self.last_trim = self.now
        self.idle_sandbox_seconds += self.ready * self.dt
        self.ready_series.append((self.now, self.ready))

    def run_until(self, t: float) -> None:
        while self.now < t - 1e-9:
            self.tick()

    def drain_leases(self) -> None:
        while self.leases or self.queue:
            self.tick()


def rollout_lengths(rng: random.Random, n: int) -> list[float]:
    """Long-tailed: lognormal around 20 s with a heavy right tail, capped at 10 min."""
    return [min(600.0, rng.lognormvariate(math.log(20.0), 1.0)) for _ in range(n)]


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]


def run_steps(sim: Replay, rng: random.Random, *, steps: int, announce: bool, train: float = 40.0) -> None:
    """Synchronous RL: each step acquires 64 groups of 8 over ~2 s, waits for
    the slowest rollout, then trains for ``train`` seconds."""
    for _ in range(steps):
        if announce:
            sim.announce(64 * 8, in_seconds=train)
        sim.run_until(sim.now + train)
        for g in range(64):
            sim.acquire(8, rollout_lengths(rng, 8))
            if g % 8 == 7:
                sim.run_until(sim.now + 0.25)
        sim.drain_leases()


def test_replay_with_announced_demand_serves_steps_warm_and_scales_to_zero_between() -> None:
    rng = random.Random(7)
    sim = Replay(Bounds(min_ready=0, max_ready=512, max_size=1024), PolicyConfig(max_starting=64))
    run_steps(sim, rng, steps=4, announce=True)
    total = 4 * 64 * 8
    assert sim.acquired == total
    # Announced early enough, every group finds its sandboxes READY.
    assert p99(sim.waits) <= sim.dt + 1e-9
    # Nothing is created beyond what the steps used: no over-creation ...
    assert sim.created == total
    assert sim.destroyed == 0
    # ... and between steps nothing stays warm (scale to zero during the tail).
    assert min(r for t, r in sim.ready_series if t > 50.0) == 0
    fixed_idle = 512 * sim.now - sum(sim.waits)  # a pool of 512 kept full all the time, roughly
    assert sim.idle_sandbox_seconds < 0.25 * fixed_idle


def test_replay_without_announcements_follows_the_rate_without_flapping() -> None:
    rng = random.Random(11)
    config = PolicyConfig(max_starting=64, scale_down_delay=30.0)
    sim = Replay(Bounds(min_ready=0, max_ready=512, max_size=1024), config)
    run_steps(sim, rng, steps=4, announce=False)
    assert sim.acquired == 4 * 64 * 8
    # The first burst finds the pool cold; later ones find a pool the rate warmed.
    first = sim.waits[:512]
    later = sim.waits[512:]
    assert sum(later) / len(later) < sum(first) / len(first)
    # Hysteresis: never destroyed and re-created within a second.
    assert sim.recreated_soon_after_trim == 0
    # Idle at the end: the rate decays and the pool goes back to zero.
    sim.run_until(sim.now + 200.0)
    assert sim.ready == 0
    assert sim.created - sim.destroyed == sim.acquired


def test_replay_with_a_floor_never_goes_below_it() -> None:
    rng = random.Random(3)
    sim = Replay(Bounds(min_ready=16, max_ready=512, max_size=1024), PolicyConfig(max_starting=64))
    sim.run_until(2.0)
    run_steps(sim, rng, steps=2, announce=True)
    assert min(r for t, r in sim.ready_series if t > 2.0 and not sim.queue) >= 0
    sim.run_until(sim.now + 100.0)
    assert sim.ready == 16
