"""Rollout queue semantics on a fake clock: the admission gate, reward
scoring with masked infrastructure failures, the zero-advantage filter
modes, the staleness modes, over-sampling with straggler cancellation,
parking and resume, redelivery, figures and the controller."""

from __future__ import annotations

import pytest

from sandboxd.clock import FakeClock
from sandboxd.core.rollouts.controller import ControllerInput, plan, staleness_cap
from sandboxd.core.rollouts.model import (
    FilterMode,
    GroupState,
    InfraFailure,
    Outcome,
    RunConfig,
    Segment,
    StalenessMode,
    Trajectory,
)
from sandboxd.core.rollouts.queue import RolloutQueue
from sandboxd.errors import FailedPrecondition, NotFound, ResourceExhausted

pytestmark = pytest.mark.timeout(10)


def q(**kw: object) -> RolloutQueue:
    cfg = RunConfig(**{"batch_groups": 2, "group_size": 4, "max_staleness": 1, **kw})  # type: ignore[arg-type]
    return RolloutQueue("r", cfg, FakeClock())


def trajs(rewards: list[float | None], version: int = 0, tokens: int = 10) -> list[Trajectory]:
    out = []
    for i, r in enumerate(rewards):
        t = Trajectory(f"t{i}", b"x", [Segment(version, tokens)], reward=r)
        if r is None:
            t.failure = InfraFailure.SANDBOX_LOST
        out.append(t)
    return out


def run_group(queue: RolloutQueue, rewards: list[float | None], version: int | None = None) -> Outcome | None:
    (g,) = queue.request_slots(1)
    g2, _ = queue.submit(g.group_id, "p", trajs(rewards, g.start_version if version is None else version))
    return g2.outcome


def test_admission_gate_bounds_accepted_plus_running() -> None:
    queue = q()  # (S + v + 1) * B = 4
    slots = queue.request_slots(10)
    assert len(slots) == 4
    with pytest.raises(ResourceExhausted) as e:
        queue.request_slots(1)
    assert e.value.retry_after is not None and e.value.retry_after > 0
    for g in slots:
        queue.submit(g.group_id, "", trajs([0.0, 1.0, 1.0, 0.0]))
    assert queue.accepted_total == 4
    with pytest.raises(ResourceExhausted):
        queue.request_slots(1)  # accepted 4 + running 0 = 4: full until v advances
    queue.publish(1)
    assert len(queue.request_slots(10)) == 2


def test_gate_respects_pool_cap_and_target() -> None:
    queue = q(max_concurrent=3)
    assert len(queue.request_slots(10)) == 3
    queue2 = q()
    queue2.pool_cap = 1
    assert len(queue2.request_slots(10)) == 1


def test_infra_failures_are_masked_never_zero() -> None:
    queue = q()
    (g,) = queue.request_slots(1)
    group, _ = queue.submit(g.group_id, "", trajs([1.0, None, 0.0, 1.0]))
    lost = group.trajectories[1]
    assert lost.reward is None and lost.masked and lost.mask_reason == "infra_failure:sandbox_lost"
    assert lost.advantage == 0.0
    assert group.reward_mean == pytest.approx(2 / 3)  # the failure is not a zero
    assert queue.infra_masked == 1 and queue.filtered["infra_failure"] == 1
    (g,) = queue.request_slots(1)
    group, _ = queue.submit(g.group_id, "", trajs([None, None]))
    assert group.outcome is Outcome.DROPPED and group.reason == "all_infra_failed"


@pytest.mark.parametrize("mode", list(FilterMode))
def test_zero_advantage_filter_modes(mode: FilterMode) -> None:
    queue = q(filter_mode=mode, backfill_cap=1)
    outcome = run_group(queue, [1.0, 1.0, 1.0, 1.0])
    if mode is FilterMode.OFF:
        assert outcome is Outcome.ADMITTED and not queue.filtered
    elif mode is FilterMode.MASK:
        assert outcome is Outcome.MASKED and queue.filtered["zero_std"] == 1
        assert all(t.masked for t in queue.queued[0].trajectories)
    else:
        assert outcome is Outcome.DROPPED and queue.accepted_total == 0
        # the slot was freed (backfill); past the cap the next one is masked
        assert run_group(queue, [0.0] * 4) is Outcome.MASKED
        assert queue.filtered["zero_std"] == 2


def test_mean_range_filter_and_advantages() -> None:
    queue = q(filter_mean_min=0.1, filter_mean_max=0.9)
    assert run_group(queue, [1.0, 1.0, 1.0, 0.9]) is Outcome.MASKED
    assert queue.filtered["mean_out_of_range"] == 1
    assert run_group(queue, [1.0, 0.0, 1.0, 0.0]) is Outcome.ADMITTED
    advantages = [t.advantage for t in queue.queued[-1].trajectories]
    assert advantages == pytest.approx([1.0, -1.0, 1.0, -1.0], abs=1e-4)


def test_staleness_modes() -> None:
    for mode, outcome in [
        (StalenessMode.DROP, Outcome.DROPPED),
        (StalenessMode.COUNT, Outcome.ADMITTED),
        (StalenessMode.MASK, Outcome.DROPPED),
    ]:
        queue = q(staleness_mode=mode, max_staleness=1)
        queue.publish(5)
        assert run_group(queue, [0.0, 1.0, 1.0, 0.0], version=3) is outcome, mode
    # mask: only the stale trajectory (and its old segment) is masked
    queue = q(staleness_mode=StalenessMode.MASK)
    queue.publish(5)
    (g,) = queue.request_slots(1)
    ts = trajs([0.0, 1.0, 1.0, 0.0], version=5)
    ts[0].segments = [Segment(2, 5), Segment(5, 5)]
    group, _ = queue.submit(g.group_id, "", ts)
    assert group.outcome is Outcome.ADMITTED
    assert group.trajectories[0].masked and group.trajectories[0].segment_masked == [True, False]
    assert not group.trajectories[1].masked
    # Delivered with another group: the masked stale trajectory is not learned
    # from, so it does not count in the consumer's staleness (budget 1 holds).
    (g2,) = queue.request_slots(1)
    queue.submit(g2.group_id, "", trajs([0.0, 1.0, 1.0, 0.0], version=5))
    batch = queue.next_batch(queue.open_stream())
    assert batch is not None and len(batch.groups) == 2
    assert queue.figures().staleness_trajectory.max == 0


def test_groups_masked_by_the_filter_are_not_counted_in_staleness() -> None:
    """A zero-std group (no learning signal, masked) is not held to the bound
    and is not the trainer's staleness either."""
    queue = q(filter_mode=FilterMode.MASK, max_staleness=1)
    (old,) = queue.request_slots(1)
    assert queue.submit(old.group_id, "", trajs([1.0, 1.0, 1.0, 1.0], version=0))[0].outcome is Outcome.MASKED
    queue.publish(1)
    queue.publish(2)  # the masked group, queued at version 0, is now 2 versions old
    (fresh,) = queue.request_slots(1)
    queue.submit(fresh.group_id, "", trajs([0.0, 1.0, 1.0, 0.0], version=2))
    batch = queue.next_batch(queue.open_stream())
    assert batch is not None and {g.group_id for g in batch.groups} == {old.group_id, fresh.group_id}
    assert queue.figures().staleness_trajectory.max == 0


def test_publish_cancels_over_stale_running_groups() -> None:
    queue = q()
    (g,) = queue.request_slots(1)
    queue.report_progress(g.group_id, ["ls-1"], [])
    cancels = queue.publish(2)
    assert [c.group.group_id for c in cancels] == [g.group_id] and not cancels[0].park
    assert cancels[0].group.lease_ids == ["ls-1"]
    with pytest.raises(FailedPrecondition):
        queue.submit(g.group_id, "", trajs([1.0, 0.0]))
    with pytest.raises(FailedPrecondition):
        queue.publish(1)


def test_over_sampling_cancels_stragglers() -> None:
    queue = q(over_sample=0.5)  # B=2 -> one extra slot
    slots = queue.request_slots(10)
    assert len(slots) == 5
    queue.report_progress(slots[4].group_id, ["ls-straggler"], [])
    _, cancels = queue.submit(slots[0].group_id, "", trajs([0.0, 1.0]))
    assert cancels == []
    _, cancels = queue.submit(slots[1].group_id, "", trajs([0.0, 1.0]))
    assert {c.group.group_id for c in cancels} == {s.group_id for s in slots[2:]}
    assert queue.filtered["cancelled"] == 3 and not queue.running
    assert queue.report_progress(slots[4].group_id, [], []).state is GroupState.CANCELLED


def test_parking_and_resume_first_with_span_cap() -> None:
    queue = q(over_sample=0.5, partial_rollouts=True, max_versions_spanned=2)
    slots = queue.request_slots(3)
    partial = [Trajectory("a", b"tokens-so-far", [Segment(0, 7)], sandbox_id="sb-1")]
    queue.report_progress(slots[2].group_id, ["ls-9"], partial)
    queue.submit(slots[0].group_id, "", trajs([0.0, 1.0]))
    _, cancels = queue.submit(slots[1].group_id, "", trajs([0.0, 1.0]))
    assert len(cancels) == 1 and cancels[0].park
    parked_id = cancels[0].group.group_id
    assert queue.parked[parked_id].state is GroupState.PARKED
    # not handed out before its snapshot is taken
    queue.publish(1)
    first = queue.request_slots(1)[0]
    assert not first.resume
    queue.parked_ready(parked_id, {"a": "snap-1"})
    resumed = queue.request_slots(1)[0]
    assert resumed.resumed_from == parked_id and resumed.start_version == 1
    (t,) = resumed.resume
    assert t.payload == b"tokens-so-far" and t.snapshot_id == "snap-1" and t.env_policy_version == 0
    # Submitted with the old segment plus a new one: spans versions 0..1.
    group, _ = queue.submit(resumed.group_id, "", [
        Trajectory("a", b"done", [Segment(0, 7), Segment(1, 3)], reward=1.0, env_policy_version=0),
        Trajectory("b", b"done", [Segment(1, 9)], reward=0.0),
    ])  # fmt: skip
    assert group.outcome is Outcome.ADMITTED
    # A parked group past the span cap is given up, its snapshots listed for deletion.
    queue2 = q(over_sample=0.5, partial_rollouts=True, max_versions_spanned=1, max_staleness=3)
    s = queue2.request_slots(3)
    queue2.report_progress(s[2].group_id, [], [Trajectory("a", b"", [Segment(0, 1)], sandbox_id="sb")])
    queue2.submit(s[0].group_id, "", trajs([0.0, 1.0]))
    _, (c,) = queue2.submit(s[1].group_id, "", trajs([0.0, 1.0]))
    queue2.parked_ready(c.group.group_id, {"a": "snap-x"})
    queue2.publish(1)
    fresh = queue2.request_slots(1)[0]
    assert not fresh.resume and queue2.filtered["span_cap"] == 1
    assert queue2.discarded_snapshots == ["snap-x"]


def test_batches_oldest_first_ack_and_redelivery() -> None:
    queue = q(ack_timeout_seconds=30)
    clock = queue.clock
    assert isinstance(clock, FakeClock)
    slots = queue.request_slots(4)
    for g in reversed(slots):
        queue.submit(g.group_id, "", trajs([0.0, 1.0]))
    stream = queue.open_stream()
    b1 = queue.next_batch(stream)
    assert b1 is not None and b1.delivery == 1 and len(b1.groups) == 2
    # stream dropped before the ack: the batch comes back, first
    queue.close_stream(stream)
    stream = queue.open_stream()
    again = queue.next_batch(stream)
    assert again is not None and again.batch_id == b1.batch_id and again.delivery == 2
    # an ack deadline missed: redelivered too
    clock.advance(31)
    again = queue.next_batch(stream)
    assert again is not None and again.batch_id == b1.batch_id and again.delivery == 3
    queue.ack(b1.batch_id)
    queue.ack(b1.batch_id)  # idempotent
    with pytest.raises(NotFound):
        queue.ack("bat-unknown")
    b2 = queue.next_batch(stream)
    assert b2 is not None and b2.batch_id != b1.batch_id
    assert queue.next_batch(stream) is None
    assert queue.consumed_groups == 2


def test_figures_rates_idle_and_staleness() -> None:
    queue = q(window_seconds=100)
    clock = queue.clock
    assert isinstance(clock, FakeClock)
    stream = queue.open_stream()
    slots = queue.request_slots(2)
    clock.advance(10)  # the trainer waits 10 s
    for g in slots:
        queue.submit(g.group_id, "", trajs([0.0, 1.0, 1.0, 1.0]))
    queue.publish(1)  # trained at v1 what v0 produced: staleness 1
    b = queue.next_batch(stream)
    assert b is not None
    clock.advance(10)  # busy 10 s
    queue.ack(b.batch_id)
    f = queue.figures()
    assert f.production_rate == pytest.approx(8 / 20)
    assert f.consumption_rate == pytest.approx(8 / 10)
    assert f.trainer_idle_ratio == pytest.approx(0.5)
    assert f.keep_rate == 1.0
    assert f.staleness_trajectory.max == 1 and f.staleness_trajectory.share_stale == 1.0
    assert f.staleness_token.count == 80 and f.staleness_env.mean == 1.0


def test_controller_grows_when_trainer_idles_and_respects_budget() -> None:
    x = ControllerInput(
        target=4, in_flight_mean=4, effective_rate=1.0, consumption_rate=3.0,
        trainer_idle_ratio=0.6, queue_depth=0, batch_groups=4, max_staleness=1,
    )  # fmt: skip
    d = plan(x)
    assert 4 < d.target <= staleness_cap(4, 1)
    held = plan(ControllerInput(**{**x.__dict__, "target": 8, "in_flight_mean": 8}))
    assert held.target == 8 and "staleness cap" in held.reason
    shrink = plan(ControllerInput(**{**x.__dict__, "consumption_rate": 0.5, "trainer_idle_ratio": 0.0,
                                     "queue_depth": 8}))  # fmt: skip
    assert shrink.target < 4
