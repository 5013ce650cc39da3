"""One run's rollout lifecycles, kept beside its queue: the moments each
group's trajectories go through (from the queue's calls and the sandboxes'
leases and records), their stage distributions, their traces, and what
their sandboxes cost. The rollout service tells it what happened; it never
decides anything."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Iterable, Sequence
from dataclasses import dataclass, field

from opentelemetry.trace import NoOpTracer, Tracer
from opentelemetry.util.types import AttributeValue

from sandboxd.clock import Clock
from sandboxd.core.control import ControlPlane
from sandboxd.core.lifecycle import State
from sandboxd.core.rollouts.cost import CostFigures, WindowFlow, cost_figures
from sandboxd.core.rollouts.figures import EventRate, Figures
from sandboxd.core.rollouts.model import Batch, Group, Outcome, Trajectory
from sandboxd.core.rollouts.spans import emit_trajectory
from sandboxd.core.rollouts.timeline import Milestones, SandboxFacts, StageSamples
from sandboxd.core.tenancy import owns
from sandboxd.cost_settings import CostSettings

LIVES_KEPT = 20_000
"""Groups followed at once; past it the oldest is forgotten untraced (a
generator that never submits must not grow this without bound)."""


@dataclass
class _Life:
    """One group's moments so far."""

    queued: float
    granted: float
    start_version: int
    sandboxes: dict[str, SandboxFacts] = field(default_factory=dict)
    trajectories: list[Trajectory] = field(default_factory=list)
    submit_called: float = 0.0
    verifiers: dict[str, tuple[float, float]] = field(default_factory=dict)
    submitted: float = 0.0
    delivered: float = 0.0
    cost_usd: float = 0.0
    costed: bool = False


def read_facts(control: ControlPlane | None, lease_ids: Iterable[str], into: dict[str, SandboxFacts]) -> None:
    """Adds (or refreshes) the facts of the sandboxes under ``lease_ids`` that
    the current tenant holds; sandboxes already gone keep what was read before."""
    if control is None:
        return
    records = control.registry.records
    for lease_id in lease_ids:
        lease = control.leases.find(lease_id)
        if lease is None or not owns(lease.pool):
            continue
        for sid in lease.sandbox_ids:
            rec = records.get(sid)
            if rec is None:
                continue
            known = into.get(sid)
            if known is not None:
                known.first_command_at = known.first_command_at or rec.first_command_at
                continue
            into[sid] = SandboxFacts(
                sandbox_id=sid,
                lease_id=lease_id,
                requested_at=lease.requested_at,
                created_at=rec.entered.get(State.CREATING, 0.0),
                ready_at=rec.entered.get(State.READY, 0.0),
                leased_at=rec.entered.get(State.LEASED, 0.0),
                cpu_cores=rec.limits.cpu_millis / 1000.0,
                memory_bytes=rec.limits.memory_bytes,
                image_pulled=lease.image_pulled,
                first_command_at=rec.first_command_at,
            )


class RunLifecycle:
    """The lifecycles and dollars of one run's rollouts."""

    def __init__(
        self,
        run: str,
        clock: Clock,
        control: ControlPlane | None,
        prices: CostSettings,
        tracer: Tracer | None = None,
    ) -> None:
        self.run = run
        self.clock = clock
        self.prices = prices
        self._control = control
        self._tracer = tracer or NoOpTracer()
        self._lives: OrderedDict[str, _Life] = OrderedDict()
        self._waiting_since = 0.0
        self.samples = StageSamples()
        self._sandbox_usd = EventRate()
        self._rollouts = EventRate()
        self._tokens = EventRate()
        self.sandbox_usd_total = 0.0

    @property
    def following(self) -> int:
        """Groups whose lifecycle has not ended yet."""
        return len(self._lives)

    # -- what the service reports ------------------------------------------------

    def refused(self) -> None:
        """A slot request found no capacity: the generator queues from now (if not already)."""
        self._waiting_since = self._waiting_since or self.clock.time()

    def granted(self, groups: Sequence[Group]) -> None:
        """Slots were granted: they queued since the first refusal unanswered until now."""
        now = self.clock.time()
        queued = self._waiting_since or now
        self._waiting_since = 0.0
        for g in groups:
            self._lives[g.group_id] = _Life(queued, now, g.start_version)
        while len(self._lives) > LIVES_KEPT:
            self._lives.popitem(last=False)

    def progress(self, g: Group) -> None:
        """A running group reported its leases: read how their sandboxes came."""
        life = self._lives.get(g.group_id)
        if life is not None:
            read_facts(self._control, g.lease_ids, life.sandboxes)

    def submitting(self, g: Group) -> None:
        """The generator submitted the group (verifiers about to run)."""
        life = self._lives.get(g.group_id)
        if life is not None:
            life.submit_called = self.clock.time()
            read_facts(self._control, g.lease_ids, life.sandboxes)

    async def verify(self, group_id: str, trajectory_id: str, run: Awaitable[None]) -> None:
        """Runs one trajectory's verifier, timing it."""
        start = self.clock.time()
        try:
            await run
        finally:
            life = self._lives.get(group_id)
            if life is not None:
                life.verifiers[trajectory_id] = (start, self.clock.time())

    def submitted(self, g: Group) -> None:
        """The queue judged the group: its sandboxes' time is costed; a dropped group's life ends."""
        life = self._lives.get(g.group_id)
        if life is None:
            return
        life.submitted = self.clock.time()
        life.trajectories = list(g.trajectories)
        read_facts(self._control, g.lease_ids, life.sandboxes)
        self._cost(life, life.submitted)
        if g.outcome is Outcome.DROPPED:
            self._end(g.group_id, life, "dropped", g.reason)

    def ended(self, g: Group, outcome: str, reason: str) -> None:
        """The group was cancelled or parked while running: its life ends here."""
        life = self._lives.get(g.group_id)
        if life is None:
            return
        now = self.clock.time()
        life.trajectories = life.trajectories or list(g.trajectories)
        read_facts(self._control, g.lease_ids, life.sandboxes)
        self._cost(life, now)
        self._end(g.group_id, life, outcome, reason)

    def delivered(self, batch: Batch, waiting: Iterable[Group] | None = None) -> None:
        """A batch went to the trainer (its first delivery counts). Given the
        groups still ``waiting`` (queued or delivered), admitted groups in
        neither were dropped at batching for staleness: their lives end too."""
        now = self.clock.time()
        for g in batch.groups:
            life = self._lives.get(g.group_id)
            if life is not None and not life.delivered:
                life.delivered = now
        if waiting is None:
            return
        kept = {g.group_id for g in waiting}
        for group_id, life in list(self._lives.items()):
            if life.submitted and not life.delivered and group_id not in kept:
                self._end(group_id, life, "dropped", "stale")

    def consumed(self, batch: Batch) -> None:
        """The trainer acknowledged a batch: its groups' lives end, their tokens count."""
        now = self.clock.time()
        tokens = sum(s.tokens for g in batch.groups for t in g.trajectories for s in t.segments)
        if tokens:
            self._tokens.add(now, tokens)
        for g in batch.groups:
            life = self._lives.get(g.group_id)
            if life is not None:
                outcome = "masked" if g.outcome is Outcome.MASKED else "consumed"
                self._end(g.group_id, life, outcome, g.reason, consumed=now)

    # -- ends ------------------------------------------------------------------

    def _cost(self, life: _Life, until: float) -> None:
        """Prices each sandbox's reservation from its hand-over to ``until`` (once per group)."""
        if life.costed:
            return
        life.costed = True
        usd = sum(
            self.prices.sandbox_usd(f.cpu_cores, f.memory_bytes, until - f.leased_at)
            for f in life.sandboxes.values()
            if f.leased_at
        )
        life.cost_usd = usd
        self._sandbox_usd.add(until, usd)
        self._rollouts.add(until, len(life.trajectories))
        self.sandbox_usd_total += usd

    def _sandbox_of(self, life: _Life, t: Trajectory) -> SandboxFacts | None:
        if t.sandbox_id in life.sandboxes:
            return life.sandboxes[t.sandbox_id]
        # No sandbox named: the group's first, which its trajectories share.
        return min(life.sandboxes.values(), key=lambda f: f.leased_at, default=None)

    def _end(self, group_id: str, life: _Life, outcome: str, reason: str, consumed: float = 0.0) -> None:
        self._lives.pop(group_id, None)
        for facts in life.sandboxes.values():
            self.samples.add_sandbox(facts)
        share = life.cost_usd / len(life.trajectories) if life.trajectories else 0.0
        for t in life.trajectories:
            sandbox = self._sandbox_of(life, t)
            m = self._milestones(life, t, sandbox, consumed)
            self.samples.add(m)
            attributes: dict[str, AttributeValue] = {
                "sandboxd.run": self.run,
                "sandboxd.group_id": group_id,
                "sandboxd.trajectory_id": t.trajectory_id,
                "sandboxd.outcome": outcome,
                "sandboxd.policy_version": life.start_version,
                "sandboxd.tokens": sum(s.tokens for s in t.segments),
                "sandboxd.sandbox_usd": share,
            }
            if reason:
                attributes["sandboxd.reason"] = reason
            if t.failure.value:
                attributes["sandboxd.infra_failure"] = t.failure.name.lower()
            emit_trajectory(self._tracer, m, attributes, sandbox)

    def _milestones(
        self, life: _Life, t: Trajectory, sandbox: SandboxFacts | None, consumed: float
    ) -> Milestones:
        m = Milestones(
            queued=life.queued,
            granted=life.granted,
            submit_called=life.submit_called,
            submitted=life.submitted,
            delivered=life.delivered,
            consumed=consumed,
        )
        if sandbox is not None:
            m.acquire_requested = sandbox.requested_at
            m.ready = sandbox.leased_at
            first = sandbox.first_command_at
            # The verifier's own command, or one from before this group, is not the rollout's first.
            before_submit = not life.submit_called or first < life.submit_called
            if first >= max(life.granted, sandbox.leased_at) and before_submit:
                m.first_command = first
        if t.trajectory_id in life.verifiers:
            m.verifier_start, m.verifier_end = life.verifiers[t.trajectory_id]
        return m

    # -- figures ----------------------------------------------------------------

    def cost(self, f: Figures) -> CostFigures:
        """The run's dollars over the figures' window."""
        now, window = self.clock.time(), f.window_seconds
        flow = WindowFlow(
            trainer_idle_seconds=f.trainer_idle_seconds,
            trainer_busy_seconds=f.trainer_busy_seconds,
            steps=f.steps,
            rollouts=int(self._rollouts.total(now, window)),
            sandbox_usd=self._sandbox_usd.total(now, window),
            tokens=int(self._tokens.total(now, window)),
        )
        return cost_figures(self.prices, flow, self.sandbox_usd_total)

    def attach(self, f: Figures) -> Figures:
        """``f`` with its lifecycle and cost figures set."""
        f.lifecycle = self.samples.figures()
        f.cost = self.cost(f)
        return f
