"""Runs sharing one fleet: the allotment's arithmetic (guarantee, borrowing,
reclaim order), the reclaim ledger's bound on a fake clock, and the rollout
manager granting slots by it, parking or cancelling what is given back."""

from __future__ import annotations

import pytest

from sandboxd import errors
from sandboxd.clock import FakeClock
from sandboxd.core.rollouts.fleet import RECLAIMED, Fleet
from sandboxd.core.rollouts.model import GroupState, RunConfig, Segment, Trajectory
from sandboxd.core.rollouts.service import RolloutManager
from sandboxd.core.rollouts.sharing import Claim, FleetLedger, allot, guarantees, water_fill
from sandboxd.core.rollouts.store import RolloutStore
from sandboxd.fleet_settings import FleetSettings
from sandboxd.settings import load_settings

pytestmark = pytest.mark.timeout(30)


def test_guarantees_follow_weights_and_add_up() -> None:
    assert guarantees(12, {"a": 2, "b": 1}) == {"a": 8, "b": 4}
    g = guarantees(10, {"a": 1, "b": 1, "c": 1})
    assert sum(g.values()) == 10 and sorted(g.values()) == [3, 3, 4]
    assert guarantees(0, {"a": 1}) == {"a": 0}


def test_water_fill_respects_weights_and_wants() -> None:
    assert water_fill(9, {"a": 100, "b": 100}, {"a": 2, "b": 1}) == {"a": 6, "b": 3}
    # What one cannot take goes to the other.
    assert water_fill(9, {"a": 2, "b": 100}, {"a": 2, "b": 1}) == {"a": 2, "b": 7}
    assert water_fill(1, {"a": 5, "b": 5}, {"a": 1, "b": 3}) == {"a": 0, "b": 1}
    assert water_fill(5, {"a": 1, "b": 1}, {"a": 1, "b": 1}) == {"a": 1, "b": 1}


def test_idle_share_is_borrowed() -> None:
    s = allot(8, [Claim("a", 1, demand=1, held=1), Claim("b", 1, demand=8, held=4)])
    assert (s["a"].guaranteed, s["b"].guaranteed) == (4, 4)
    assert s["a"].allowed == 1 and s["b"].allowed == 7 and s["b"].borrowed == 3
    assert s["b"].usable == 7 and s["a"].usable == 1
    static = allot(8, [Claim("a", 1, 1, 1), Claim("b", 1, 8, 4)], borrowing=False)
    assert static["b"].allowed == 4 and static["b"].borrowed == 0


def test_owner_gets_its_guarantee_back_from_the_borrower() -> None:
    # b borrowed 3 of a's sandboxes; a now wants its whole share.
    s = allot(8, [Claim("a", 1, demand=4, held=1), Claim("b", 1, demand=8, held=7)])
    assert s["a"].allowed == 4 and s["b"].allowed == 4 and s["b"].over == 3
    # a may start only what is free now; the rest once b has given it back.
    assert s["a"].usable == 1
    s = allot(8, [Claim("a", 1, demand=4, held=1), Claim("b", 1, demand=8, held=5)])
    assert s["a"].usable == 3 and s["b"].over == 1


def test_borrowings_kept_until_needed_and_cut_by_weight() -> None:
    # c holds 2 it borrowed and no longer adds demand beyond them: it keeps them.
    s = allot(9, [Claim("a", 1, 0, 0), Claim("b", 1, 3, 3), Claim("c", 1, 2, 5)])
    assert s["c"].allowed == 5 and not s["c"].over
    # a wants its 3 back: the biggest borrower per weight gives back first.
    s = allot(9, [Claim("a", 1, 3, 0), Claim("b", 1, 5, 5), Claim("c", 1, 1, 4)])
    assert s["a"].allowed == 3
    assert s["b"].allowed + s["c"].allowed == 6 and s["b"].over + s["c"].over == 3
    assert s["b"].allowed >= 3 and s["c"].allowed >= 1


def test_ledger_times_reclaims_and_flags_those_past_the_bound() -> None:
    ledger = FleetLedger(reclaim_seconds=10.0)
    over = allot(8, [Claim("a", 1, 4, 1), Claim("b", 1, 8, 7)])
    ledger.observe(0.0, over)
    assert list(ledger.open) == ["b"] and ledger.overdue(9.9) == []
    assert ledger.overdue(10.0) == ["b"]
    back = allot(8, [Claim("a", 1, 4, 1), Claim("b", 1, 8, 4)])
    ledger.observe(6.0, back)
    assert not ledger.open and ledger.durations == [6.0]
    assert ledger.percentile(0.99) == 6.0


def test_settings_are_checked() -> None:
    assert load_settings(None, {"fleet.sandboxes": 4}).fleet.enabled
    with pytest.raises(errors.InvalidArgument, match="fleet.weights.x"):
        FleetSettings(sandboxes=4, weights={"x": 0})
    with pytest.raises(errors.InvalidArgument, match="fleet.reclaim_seconds"):
        FleetSettings(sandboxes=4, reclaim_seconds=-1)
    with pytest.raises(errors.InvalidArgument, match="fleet.sandboxes"):
        FleetSettings(sandboxes=-2)
    assert FleetSettings(weights={"t/r": 3}).weight("t/r") == 3.0
    assert FleetSettings().weight("other") == 1.0


async def _manager(**fleet: object) -> tuple[RolloutManager, Fleet, FakeClock]:
    clock = FakeClock()
    manager = RolloutManager(None, RolloutStore(None), clock)
    f = Fleet(FleetSettings(**fleet), manager)  # type: ignore[arg-type]
    await manager._store.open()
    return manager, f, clock


async def _finish(manager: RolloutManager, run: str, group_id: str) -> None:
    await manager.submit(run, group_id, "", [Trajectory("t", reward=1.0, segments=[Segment(0, 1)])], [None])


def _config(partial: bool = False) -> RunConfig:
    return RunConfig(
        batch_groups=4, group_size=1, max_staleness=3, max_concurrent=8, partial_rollouts=partial
    )


async def test_manager_grants_by_share_and_cancels_at_the_bound() -> None:
    manager, fleet, clock = await _manager(sandboxes=8, reclaim_seconds=10.0, idle_seconds=60.0)
    await manager.configure("b", _config())
    borrowed, _ = await manager.request_slots("b", 8)
    assert len(borrowed) == 8  # b alone: the whole fleet
    await manager.configure("a", _config())
    # a is owed 4 and none is free: it gets nothing now, b gives back.
    with pytest.raises(errors.ResourceExhausted, match="fleet: may hold 0 groups"):
        await manager.request_slots("a", 4)
    assert fleet.shares["b"].over == 4
    with pytest.raises(errors.ResourceExhausted):
        await manager.request_slots("b", 1)
    # One of b's groups finishes: a may start one.
    await _finish(manager, "b", borrowed[0].group_id)
    slots, _ = await manager.request_slots("a", 4)
    assert len(slots) == 1
    clock.advance(10.0 - fleet.interval - 0.01)
    await fleet.sweep()
    assert all(g.state is GroupState.RUNNING for g in borrowed[1:])  # not before the bound
    clock.advance(0.01)
    await fleet.sweep()
    ended = [g for g in borrowed[1:] if g.state is GroupState.CANCELLED]
    assert len(ended) == 3 and all(g.reason == RECLAIMED for g in ended)
    assert (await manager.figures("b")).filtered[RECLAIMED] == 3
    figures = fleet.figures()
    assert figures.reclaims_forced == 1 and figures.reclaims_open == 0
    assert figures.reclaim_p99_seconds == pytest.approx(10.0 - fleet.interval)
    assert figures.reclaim_p99_seconds <= figures.reclaim_bound_seconds
    slots, _ = await manager.request_slots("a", 4)
    assert len(slots) == 3 and fleet.update()["a"].held == 4


async def test_partial_rollouts_are_parked_at_once_and_resumed() -> None:
    manager, fleet, clock = await _manager(sandboxes=4, reclaim_seconds=30.0)
    await manager.configure("b", _config(partial=True))
    borrowed, _ = await manager.request_slots("b", 4)
    await manager.configure("a", _config())
    with pytest.raises(errors.ResourceExhausted):
        await manager.request_slots("a", 2)
    await fleet.sweep()
    parked = [g for g in borrowed if g.state is GroupState.PARKED]
    assert len(parked) == 2
    assert fleet.figures().reclaims_forced == 0
    slots, _ = await manager.request_slots("a", 2)
    assert len(slots) == 2
    # a goes idle (it keeps what it holds): b's next slot resumes a parked group.
    clock.advance(FleetSettings().idle_seconds)
    await _finish(manager, "b", next(g.group_id for g in borrowed if g.state is GroupState.RUNNING))
    resumed, _ = await manager.request_slots("b", 4)
    assert len(resumed) == 1 and resumed[0].resumed_from in {g.group_id for g in parked}


async def test_idle_run_lends_its_share() -> None:
    manager, fleet, clock = await _manager(sandboxes=8, idle_seconds=5.0)
    await manager.configure("a", _config())
    await manager.configure("b", _config())
    first, _ = await manager.request_slots("b", 8)
    assert len(first) == 4  # a may still ask: its share is kept
    with pytest.raises(errors.ResourceExhausted):
        await manager.request_slots("b", 1)
    clock.advance(5.0)
    more, _ = await manager.request_slots("b", 8)
    assert len(more) == 4 and fleet.shares["b"].borrowed == 4


async def test_fleet_figures_are_gauges_per_run_and_for_the_fleet() -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from sandboxd.core.rollouts.fleet_meters import register_fleet_gauges
    from sandboxd.telemetry import render

    manager, fleet, _clock = await _manager(sandboxes=8, idle_seconds=60.0)
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    register_fleet_gauges(provider.get_meter("t"), fleet)
    await manager.configure("b", _config())
    await manager.request_slots("b", 8)
    await manager.configure("a", _config())
    try:
        text = render(reader.get_metrics_data())
    finally:
        provider.shutdown()
    assert 'sandboxd_fleet_held_sandboxes{run="b"} 8' in text
    assert 'sandboxd_fleet_guaranteed_sandboxes{run="a"} 4' in text
    assert 'sandboxd_fleet_allowed_sandboxes{run="b"} 4' in text
    assert "sandboxd_fleet_reclaims_open 1" in text
