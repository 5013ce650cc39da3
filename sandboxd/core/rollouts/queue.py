"""One run's rollout queue: pure logic on an injected clock, no I/O.

    generator ──RequestSlots──> gate ──> RUNNING ──SubmitGroup──> score
                                  ^          │  (stragglers)        │ infra failures masked
                 parked first ────┘          ├──> CANCELLED         │ hard staleness bound
                                             └──> PARKED ───────────┤ zero-advantage filter
                                                                    v
    trainer <──PullBatch── batch (oldest first) <── QUEUED <── admitted / masked
            ──AckBatch──> DONE     (unacknowledged: redelivered)

The gate (AReaL/SkyRL): a group may start only while
``accepted + running <= (S + v + 1) * B`` (plus ``ceil(over_sample * B)``
when over-sampling), where ``accepted`` counts every group ever admitted, S
is the staleness budget, v the trainer's policy version and B the groups per
step. Consumed in order, a group started under version u is trained by
version u + S at the latest. How a submitted group is judged is
``scoring``'s; the flow behind the figures is counted by ``throughput``. The
service (sandboxd.core.rollouts.service) carries out what the queue decides:
releasing or snapshotting the sandboxes of cancelled groups, running
verifiers, persisting, announcing demand.
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sandboxd.clock import Clock
from sandboxd.core.rollouts.controller import ControllerInput, plan
from sandboxd.core.rollouts.figures import Figures, StalenessStats
from sandboxd.core.rollouts.model import (
    Batch,
    Group,
    GroupState,
    InfraFailure,
    Outcome,
    RunConfig,
    StalenessMode,
    Trajectory,
    new_id,
)
from sandboxd.core.rollouts.scoring import Verdict, bound_staleness, check_trajectories, score
from sandboxd.core.rollouts.throughput import Throughput
from sandboxd.errors import FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted

_TOMBSTONES = 10_000


@dataclass(frozen=True)
class Cancellation:
    """A running group the queue took away: release its leases, or (park)
    snapshot its sandboxes first and then call ``parked_ready``."""

    group: Group
    park: bool
    reason: str


class RolloutQueue:
    """One run's groups from slot to acknowledged batch, and the figures of its flow."""

    def __init__(self, run: str, config: RunConfig, clock: Clock, *, version: int = 0) -> None:
        self.run = run
        self.config = config.check()
        self.clock = clock
        self.version = version
        self.accepted_total = 0
        self.consumed_groups = 0
        self.running: dict[str, Group] = {}
        self.queued: list[Group] = []
        self.parked: OrderedDict[str, Group] = OrderedDict()
        self.batches: OrderedDict[str, Batch] = OrderedDict()
        self.redeliver: deque[str] = deque()
        self._acked: OrderedDict[str, None] = OrderedDict()
        self._ended: OrderedDict[str, Group] = OrderedDict()
        self.cohort_done: Counter[int] = Counter()
        self.backfilled: Counter[int] = Counter()
        self.filtered: Counter[str] = Counter()
        self.infra_masked = 0
        self.target = config.max_concurrent or (config.batch_groups if config.controller else 0)
        self.controller_reason = ""
        self.pool_cap = 0
        self.fleet_seat: Callable[[RolloutQueue], int] | None = None
        """Groups the shared fleet lets the run hold at once now (sandboxd.core.rollouts.fleet)."""
        self.fleet_note = ""
        self.discarded_snapshots: list[str] = []
        """Snapshots of parked work given up (span cap): the service deletes them."""
        S = config.max_staleness
        self.stale_traj, self.stale_token, self.stale_env = (StalenessStats(S) for _ in range(3))
        now = clock.monotonic()
        self._flow = Throughput(now)
        self._streams: set[int] = set()
        self._next_stream = 0
        self._seq = 0
        self._next_control = now
        self.on_change: Callable[[], None] | None = None
        self.dirty_groups: set[str] = set()
        self.dirty_batches: set[str] = set()

    # -- bookkeeping ---------------------------------------------------------

    @property
    def now(self) -> float:
        """The queue clock's monotonic time."""
        return self.clock.monotonic()

    def _changed(self) -> None:
        in_hand = any(b.stream for b in self.batches.values())
        self._flow.observe(
            self.now, running=len(self.running), batches_out=in_hand, trainer_connected=bool(self._streams)
        )
        if self.on_change is not None:
            self.on_change()

    def _touch(self, g: Group) -> None:
        self.dirty_groups.add(g.group_id)

    def _end(self, g: Group, state: GroupState, outcome: Outcome, reason: str) -> None:
        g.state, g.outcome, g.reason = state, outcome, reason
        self._ended[g.group_id] = g
        while len(self._ended) > _TOMBSTONES:
            self._ended.popitem(last=False)
        self._touch(g)

    def find(self, group_id: str) -> Group:
        """The group, wherever it is (ended ones while remembered); NOT_FOUND otherwise."""
        for table in (self.running, self.parked, self._ended):
            if group_id in table:
                return table[group_id]
        for g in self.queued:
            if g.group_id == group_id:
                return g
        for b in self.batches.values():
            for g in b.groups:
                if g.group_id == group_id:
                    return g
        raise NotFound(f"group {group_id!r} not found in run {self.run!r}")

    def tick(self) -> bool:
        """Expires unacknowledged batches and runs the controller when due;
        True when the controller changed the target."""
        now = self.now
        for b in self.batches.values():
            if b.stream and b.deadline <= now:
                b.stream = 0
                self.redeliver.append(b.batch_id)
                self.dirty_batches.add(b.batch_id)
        changed = False
        if self.config.controller and now >= self._next_control:
            self._next_control = now + max(1.0, self.config.window_seconds / 10)
            f = self.figures()
            decision = plan(
                ControllerInput(
                    target=self.target or self.config.batch_groups,
                    in_flight_mean=f.in_flight_mean,
                    effective_rate=f.effective_rate,
                    consumption_rate=f.consumption_rate,
                    trainer_idle_ratio=f.trainer_idle_ratio,
                    queue_depth=f.queue_depth,
                    batch_groups=self.config.batch_groups,
                    max_staleness=self.config.max_staleness,
                    extra_slots=self.config.extra_slots,
                    pool_cap=self.pool_cap,
                )
            )
            changed = decision.target != self.target
            self.target, self.controller_reason = decision.target, decision.reason
        self._changed()
        return changed

    # -- generator side --------------------------------------------------------

    def capacity(self) -> int:
        """Groups that may start now: the staleness gate, the target and the pool cap."""
        c = self.config
        limits = [(c.max_staleness + self.version + 1) * c.batch_groups + c.extra_slots
                  - (self.accepted_total + len(self.running))]  # fmt: skip
        if self.target:
            limits.append(self.target - len(self.running))
        if self.pool_cap:
            limits.append(self.pool_cap - len(self.running))
        if self.fleet_seat is not None:
            limits.append(self.fleet_seat(self) - len(self.running))
        return max(0, min(limits))

    def retry_after(self) -> float:
        """When asking again is likely to find capacity: half the usual time
        between two acknowledged batches (the trainer frees B slots per step)."""
        return self._flow.retry_after()

    def request_slots(self, count: int, images: Sequence[str] = ()) -> list[Group]:
        """Starts up to ``count`` groups, parked ones first; RESOURCE_EXHAUSTED at
        capacity. ``images``: the images of the new groups' tasks, in order
        (resumed groups keep their own)."""
        if count < 1:
            raise InvalidArgument("count", f"must be >= 1, got {count}")
        if len(images) > count:
            raise InvalidArgument("images", f"{len(images)} images for {count} slots")
        self.tick()
        room = min(count, self.capacity())
        if room == 0:
            raise ResourceExhausted(
                f"run {self.run!r} is at capacity: {self.accepted_total} accepted + {len(self.running)} "
                f"running for policy version {self.version} (budget {self.config.max_staleness}, "
                f"{self.config.batch_groups} groups per step)"
                + (f"; {self.fleet_note}" if self.fleet_note else ""),
                self.retry_after(),
            )
        out: list[Group] = []
        for parked in list(self.parked.values()):
            if len(out) >= room:
                break
            if not parked.snapshots_ready:
                continue
            del self.parked[parked.group_id]
            spanned = self.version - parked.oldest_version() + 1
            if spanned > self.config.spanned_cap:
                self.filtered["span_cap"] += 1
                self.discarded_snapshots += [t.snapshot_id for t in parked.trajectories if t.snapshot_id]
                self._end(parked, GroupState.DROPPED, Outcome.DROPPED, "span_cap")
                continue
            g = Group(
                new_id("grp"),
                self.version,
                self.now,
                prompt_id=parked.prompt_id,
                resumed_from=parked.group_id,
                resume=parked.trajectories,
                image=parked.image,
            )
            self._end(parked, GroupState.DONE, Outcome.PARKED, f"resumed as {g.group_id}")
            out.append(g)
        fresh = iter(images)
        while len(out) < room:
            out.append(Group(new_id("grp"), self.version, self.now, image=next(fresh, "")))
        for g in out:
            self.running[g.group_id] = g
            self._touch(g)
        self._changed()
        return out

    def report_progress(self, group_id: str, lease_ids: list[str], trajectories: list[Trajectory]) -> Group:
        """Records a running group's leases and trajectories so far."""
        g = self.find(group_id)
        if g.state is GroupState.RUNNING:
            if lease_ids:
                g.lease_ids = list(dict.fromkeys([*g.lease_ids, *lease_ids]))
            if trajectories:
                g.trajectories = trajectories
            self._touch(g)
        return g

    def submit(
        self, group_id: str, prompt_id: str, trajectories: list[Trajectory]
    ) -> tuple[Group, list[Cancellation]]:
        """Judges a finished group and queues it if admitted; returns stragglers to cancel."""
        self.tick()
        g = self.running.get(group_id)
        if g is None:
            found = self.find(group_id)
            raise FailedPrecondition(
                f"group {group_id} is {found.state.name.lower()}"
                + (f" ({found.reason})" if found.reason else "")
                + "; it cannot be submitted"
            )
        check_trajectories(trajectories)
        del self.running[group_id]
        g.trajectories = trajectories
        g.prompt_id = prompt_id or g.prompt_id
        now = self.now
        self._flow.submitted(now, len(trajectories))
        cancels: list[Cancellation] = []
        if self._score(g):
            self.accepted_total += 1
            self._seq += 1
            g.accepted_seq = self._seq
            g.state = GroupState.QUEUED
            self.queued.append(g)
            self._flow.admitted(now)
            self._touch(g)
            self.cohort_done[g.start_version] += 1
            if self.config.over_sample > 0 and self.cohort_done[g.start_version] >= self.config.batch_groups:
                for straggler in [r for r in self.running.values() if r.start_version == g.start_version]:
                    cancels.append(self._cancel(straggler, "straggler"))
        self._changed()
        return g, cancels

    def _drop(self, g: Group, reason: str) -> bool:
        self.filtered[reason] += 1
        self._end(g, GroupState.DROPPED, Outcome.DROPPED, reason)
        return False

    def _score(self, g: Group) -> bool:
        """Judges a submitted group (``scoring.score``); True when admitted."""
        may_backfill = self.backfilled[g.start_version] < self.config.backfills
        return self._apply(g, score(g, self.config, self.version, may_backfill=may_backfill))

    def _apply(self, g: Group, verdict: Verdict) -> bool:
        self.filtered.update(verdict.counts)
        self.infra_masked += verdict.infra_masked
        if verdict.backfilled:
            self.backfilled[g.start_version] += 1
        return self._drop(g, verdict.drop) if verdict.drop else True

    def _cancel(self, g: Group, reason: str) -> Cancellation:
        del self.running[g.group_id]
        park = self.config.partial_rollouts
        if park:
            g.state, g.outcome, g.reason = GroupState.PARKED, Outcome.PARKED, reason
            g.snapshots_ready = False
            self.parked[g.group_id] = g
            self.filtered["parked"] += 1
            self._touch(g)
        else:
            self.filtered["cancelled" if reason == "straggler" else reason] += 1
            self._end(g, GroupState.CANCELLED, Outcome.CANCELLED, reason)
        return Cancellation(g, park, reason)

    def parked_ready(self, group_id: str, snapshots: dict[str, str]) -> None:
        """The service took the parked group's snapshots (trajectory id ->
        snapshot id; missing ones resume without environment state)."""
        g = self.parked.get(group_id)
        if g is None:
            return
        for t in g.trajectories:
            t.snapshot_id = snapshots.get(t.trajectory_id, t.snapshot_id)
            if t.env_policy_version is None:
                t.env_policy_version = max((s.policy_version for s in t.segments), default=g.start_version)
        g.snapshots_ready = True
        self._touch(g)
        self._changed()

    # -- trainer side -----------------------------------------------------------

    def publish(self, version: int) -> list[Cancellation]:
        """The trainer moved to ``version``; in DROP mode, returns running groups now too stale."""
        if version < self.version:
            raise FailedPrecondition(f"policy version {version} is below the current {self.version}")
        self.version = version
        cancels = []
        if self.config.staleness_mode is StalenessMode.DROP:
            floor = version - self.config.max_staleness
            for g in [g for g in self.running.values() if g.start_version < floor]:
                cancels.append(self._cancel(g, "stale"))
        self.tick()
        return cancels

    def open_stream(self) -> int:
        """A trainer stream opened; returns its id."""
        self._next_stream += 1
        self._streams.add(self._next_stream)
        self._changed()
        return self._next_stream

    def close_stream(self, stream: int) -> None:
        """The trainer's stream ended: what it held unacknowledged comes back first."""
        self._streams.discard(stream)
        held = [b.batch_id for b in self.batches.values() if b.stream == stream]
        for batch_id in reversed(held):
            self.batches[batch_id].stream = 0
            self.redeliver.appendleft(batch_id)
            self.dirty_batches.add(batch_id)
        self._changed()

    def next_batch(self, stream: int) -> Batch | None:
        """The next batch for ``stream`` (redeliveries first); None until B groups are queued."""
        self.tick()
        now = self.now
        if self.redeliver:
            b = self.batches[self.redeliver.popleft()]
        else:
            b_or_none = self._make_batch()
            if b_or_none is None:
                return None
            b = b_or_none
        b.delivery += 1
        b.stream = stream
        b.delivered_at = now
        b.deadline = now + self.config.ack_timeout_seconds
        self.dirty_batches.add(b.batch_id)
        self._changed()
        return b

    def _make_batch(self) -> Batch | None:
        B = self.config.batch_groups
        while len(self.queued) >= B:
            self.queued.sort(key=lambda g: (g.start_version, g.accepted_seq))
            head, rest = self.queued[:B], self.queued[B:]
            kept = []
            for g in head:
                if self._apply(g, bound_staleness(g, self.config, self.version)):
                    kept.append(g)
                else:
                    self.accepted_total -= 1  # its slot goes back to the gate
            if len(kept) < B:
                self.queued = kept + rest
                continue
            self.queued = rest
            b = Batch(new_id("bat"), kept, self.version)
            for g in kept:
                g.state = GroupState.DELIVERED
                self._record_staleness(g)
                self.dirty_groups.add(g.group_id)
            self.batches[b.batch_id] = b
            return b
        return None

    def _record_staleness(self, g: Group) -> None:
        v = self.version
        for t in g.trajectories:
            if t.failure is not InfraFailure.NONE or t.masked:
                # Not learned from (and not held to the bound, see bound_staleness):
                # not the trainer's staleness.
                continue
            self.stale_traj.add(v - t.oldest_version(g.start_version))
            for s in t.segments:
                if s.tokens:
                    self.stale_token.add(v - s.policy_version, s.tokens)
            self.stale_env.add(v - t.env_version(g.start_version))

    def ack(self, batch_id: str) -> None:
        """The trainer is done with a batch, and its groups with it (a repeat is a no-op)."""
        b = self.batches.pop(batch_id, None)
        if b is None:
            if batch_id in self._acked:
                return
            raise NotFound(f"batch {batch_id!r} not found in run {self.run!r}")
        if batch_id in self.redeliver:
            self.redeliver.remove(batch_id)
        now = self.now
        self._acked[batch_id] = None
        while len(self._acked) > _TOMBSTONES:
            self._acked.popitem(last=False)
        for g in b.groups:
            self._end(g, GroupState.DONE, g.outcome or Outcome.ADMITTED, g.reason)
        self.consumed_groups += len(b.groups)
        self._flow.acked(now, sum(len(g.trajectories) for g in b.groups))
        self.dirty_batches.add(batch_id)
        self._changed()

    # -- figures ----------------------------------------------------------------

    def figures(self) -> Figures:
        """The throughput-matching figures as of now."""
        now = self.now
        window = self.config.window_seconds
        r = self._flow.rates(now, window)
        return Figures(
            production_rate=r.production_rate,
            keep_rate=r.keep_rate,
            effective_rate=r.effective_rate,
            consumption_rate=r.consumption_rate,
            trainer_idle_ratio=r.trainer_idle_ratio,
            generator_idle_ratio=r.generator_idle_ratio,
            queue_depth=len(self.queued),
            in_flight=len(self.running),
            parked=len(self.parked),
            unacked_batches=len(self.batches),
            staleness_trajectory=self.stale_traj,
            staleness_token=self.stale_token,
            staleness_env=self.stale_env,
            filtered=dict(self.filtered),
            policy_version=self.version,
            target_concurrency=self.target or self.gate_size(),
            accepted_total=self.accepted_total,
            consumed_groups=self.consumed_groups,
            infra_failures_masked=self.infra_masked,
            window_seconds=window,
            in_flight_mean=r.in_flight_mean,
            controller_reason="; ".join(r for r in (self.controller_reason, self.fleet_note) if r),
            trainer_idle_seconds=r.trainer_idle_seconds,
            trainer_busy_seconds=r.trainer_busy_seconds,
            steps=r.steps,
        )

    def gate_size(self) -> int:
        """The staleness gate's size: (S + 1) * B plus the over-sampling slots."""
        c = self.config
        return (c.max_staleness + 1) * c.batch_groups + c.extra_slots

    def reconfigure(self, config: RunConfig) -> None:
        """Applies a new run configuration from now on."""
        self.config = config.check()
        for stats in (self.stale_traj, self.stale_token, self.stale_env):
            stats.budget = config.max_staleness
        if config.max_concurrent:
            self.target = config.max_concurrent
        elif not config.controller:
            self.target = 0
        self._next_control = self.now
        self._changed()
