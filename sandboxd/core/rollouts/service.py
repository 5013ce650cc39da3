"""Carries out what the rollout queues decide: runs verifiers in sandboxes,
releases (ControlPlane.release) or snapshots and parks (SnapshotManager)
the sandboxes of cancelled groups, persists every change, announces the
controller's concurrency to the pool (demand), and wakes waiting streams."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from opentelemetry.trace import Tracer

from sandboxd.clock import Clock
from sandboxd.core import validation as v
from sandboxd.core.control import ControlPlane
from sandboxd.core.rollouts.figures import Figures
from sandboxd.core.rollouts.model import (
    Batch,
    Group,
    GroupState,
    RunConfig,
    Trajectory,
    config_from_json,
    config_to_json,
    group_to_json,
)
from sandboxd.core.rollouts.persisted import batch_to_json, restore, state_of
from sandboxd.core.rollouts.queue import Cancellation, RolloutQueue
from sandboxd.core.rollouts.store import RolloutStore
from sandboxd.core.rollouts.tracker import RunLifecycle
from sandboxd.core.rollouts.verifier import VerifierSpec, run_verifier
from sandboxd.core.snapshots import SnapshotManager
from sandboxd.core.tenancy import acting_as, current_tenant, owns, pool_key, split_pool_key
from sandboxd.cost_settings import CostSettings
from sandboxd.errors import InvalidArgument, NotFound, ResourceExhausted, SandboxdError

if TYPE_CHECKING:
    from sandboxd.core.rollouts.fleet import Fleet

log = logging.getLogger(__name__)

_RUN_NAME_MAX = 128
_ID_MAX = 256
"""Longest trajectory or prompt id."""
_IDLE_RECHECK_SECONDS = 0.5


_GRANT_SOURCES = 64
"""Announcements of granted slots' images kept per run at once (the oldest is replaced)."""


@dataclass
class _Run:
    key: str
    queue: RolloutQueue
    grants: int = 0
    """Grants of slots with images so far (which announcement source the next one takes)."""
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def tenant(self) -> str:
        return split_pool_key(self.key)[0]

    def notify(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()


class RolloutManager:
    """Every tenant's rollout runs: carries out what their queues decide and persists each change."""

    def __init__(
        self,
        control: ControlPlane | None,
        store: RolloutStore,
        clock: Clock,
        *,
        snapshots: SnapshotManager | None = None,
        tracer: Tracer | None = None,
        prices: CostSettings | None = None,
    ) -> None:
        self._control = control
        self._tracer = tracer
        self.prices = prices or CostSettings()
        self._lifecycles: dict[str, RunLifecycle] = {}
        self._snapshots = snapshots
        self._store = store
        self.clock = clock
        self.runs: dict[str, _Run] = {}
        self.fleet: Fleet | None = None
        """The fleet the runs share, when the server has one (sandboxd.core.rollouts.fleet)."""

    # -- start and stop --------------------------------------------------------

    async def start(self) -> None:
        """Opens the store and restores every persisted run; delivered batches wait for redelivery."""
        await self._store.open()
        for key, config, state, groups, batches in await self._store.load():
            run = self._add(key, RolloutQueue(split_pool_key(key)[1], config_from_json(config), self.clock))
            restore(run.queue, state, groups, batches)
            log.info(
                "rollout run %s restored: %d running, %d queued, %d parked, %d batches to redeliver",
                key, len(run.queue.running), len(run.queue.queued), len(run.queue.parked),
                len(run.queue.batches),
            )  # fmt: skip
        if self.fleet is not None:
            self.fleet.start()

    async def stop(self) -> None:
        """Wakes every waiting stream and closes the store."""
        if self.fleet is not None:
            await self.fleet.stop()
        for run in self.runs.values():
            run.notify()
        await self._store.close()

    def lifecycle(self, run: _Run) -> RunLifecycle:
        """The run's rollout lifecycles and dollars (sandboxd.core.rollouts.tracker)."""
        found = self._lifecycles.get(run.key)
        if found is None:
            found = RunLifecycle(run.queue.run, self.clock, self._control, self.prices, self._tracer)
            self._lifecycles[run.key] = found
        return found

    def _add(self, key: str, queue: RolloutQueue) -> _Run:
        run = _Run(key, queue)
        queue.on_change = run.notify
        if self.fleet is not None:
            queue.fleet_seat = self.fleet.seat_for(key)
        self.runs[key] = run
        return run

    # -- runs ------------------------------------------------------------------

    def get(self, name: str) -> _Run:
        """The current tenant's run ``name`` (INVALID_ARGUMENT for a bad name, NOT_FOUND if none)."""
        check_run_name(name)
        run = self.runs.get(pool_key(current_tenant(), name))
        if run is None:
            raise NotFound(f"run {name!r} not found (configure it first)")
        return run

    async def configure(self, name: str, config: RunConfig) -> RolloutQueue:
        """Creates the run, or reconfigures it."""
        check_run_name(name)
        config.check()
        if config.pool and self._control is not None:
            self._control.get_pool(config.pool, "config.pool")
        key = pool_key(current_tenant(), name)
        try:
            run = self.get(name)
            run.queue.reconfigure(config)
        except NotFound:
            run = self._add(key, RolloutQueue(name, config, self.clock))
        async with run.lock:
            self._pool_cap(run)
            await self._flush(run)
        return run.queue

    def _pool_cap(self, run: _Run) -> None:
        q = run.queue
        if not q.config.pool or self._control is None:
            return
        with acting_as(run.tenant), contextlib.suppress(NotFound):
            pool = self._control.get_pool(q.config.pool)
            q.pool_cap = max(1, pool.config.max_size // q.config.per_group)

    async def _after(self, run: _Run, controller_changed: bool, cancels: list[Cancellation]) -> None:
        for c in cancels:
            self.lifecycle(run).ended(c.group, "parked" if c.park else "cancelled", c.reason)
            await self._carry_out(run, c)
        if controller_changed:
            self._announce(run)
        for snapshot_id in run.queue.discarded_snapshots:
            if self._snapshots is not None:
                with acting_as(run.tenant), contextlib.suppress(SandboxdError):
                    await self._snapshots.delete(snapshot_id)
        run.queue.discarded_snapshots.clear()
        await self._flush(run)

    def _announce(self, run: _Run, granted: Sequence[Group] = ()) -> None:
        """Announces to the run's pool the images of the tasks of ``granted``
        slots (one announcement per grant, consumed by the acquires of those
        images: their sandboxes warm, the images pulled ahead, while the
        generator prepares) and the run's concurrency beyond what those cover."""
        q = run.queue
        if not q.config.pool or self._control is None:
            return
        ttl = min(3600.0, 2 * q.config.window_seconds)
        with acting_as(run.tenant):
            try:
                pool = self._control.get_pool(q.config.pool)
                images = _within(_slot_images(granted, q.config.per_group), pool.config.max_size)
                if images:
                    run.grants += 1
                    source = f"rollouts:{q.run}:slots:{run.grants % _GRANT_SOURCES}"
                    pool.announce(source, sum(n for _, n in images), 0.0, ttl, images)
                covered = sum(pool.announced(f"rollouts:{q.run}:slots:{i}") for i in range(_GRANT_SOURCES))
                count = max(0, min(pool.config.max_size, q.target * q.config.per_group) - covered)
                pool.announce(f"rollouts:{q.run}", count, 0.0, ttl)
            except SandboxdError as e:
                log.debug("run %s: demand not announced: %s", q.run, e)

    async def _carry_out(self, run: _Run, c: Cancellation) -> None:
        """Parks (snapshots first) or just releases a cancelled group's sandboxes."""
        g = c.group
        snapshots: dict[str, str] = {}
        with acting_as(run.tenant):
            if c.park and self._snapshots is not None:
                for t in g.trajectories:
                    if not t.sandbox_id:
                        continue
                    try:
                        info = await self._snapshots.snapshot(
                            t.sandbox_id,
                            labels={"sandboxd.run": run.queue.run, "sandboxd.group": g.group_id},
                            policy_version=max(
                                (s.policy_version for s in t.segments), default=g.start_version
                            ),
                            turn=len(t.segments),
                        )
                        snapshots[t.trajectory_id] = info.id
                    except SandboxdError as e:
                        log.warning("parking %s: snapshot of %s failed: %s", g.group_id, t.sandbox_id, e)
            if self._control is not None:
                for lease_id in g.lease_ids:
                    try:
                        await self._control.release(lease_id, [])
                    except SandboxdError as e:
                        log.debug("releasing %s of cancelled group %s: %s", lease_id, g.group_id, e)
        if c.park:
            run.queue.parked_ready(g.group_id, snapshots)

    async def _flush(self, run: _Run) -> None:
        q = run.queue
        live: dict[str, Group] = {g.group_id: g for g in [*q.running.values(), *q.queued, *q.parked.values()]}
        groups = {gid: (group_to_json(live[gid]) if gid in live else None) for gid in q.dirty_groups}
        batches = {
            bid: (batch_to_json(q.batches[bid]) if bid in q.batches else None) for bid in q.dirty_batches
        }
        q.dirty_groups.clear()
        q.dirty_batches.clear()
        await self._store.write(run.key, config_to_json(q.config), state_of(q), groups, batches)

    # -- generator side ----------------------------------------------------------

    async def request_slots(
        self, name: str, count: int, images: Sequence[str] = ()
    ) -> tuple[list[Group], int]:
        """Up to ``count`` (>= 1) slots, and the policy version they start
        under; ``images`` are the new slots' tasks' images, announced to the pool."""
        v.positive_count("count", count)
        run = self.get(name)
        images = self._check_images(run, images)
        async with run.lock:
            self._pool_cap(run)
            changed = run.queue.tick()
            try:
                slots = run.queue.request_slots(count, images)
            except ResourceExhausted:
                self.lifecycle(run).refused()
                raise
            finally:
                await self._after(run, changed, [])
            if any(g.image for g in slots):
                self._announce(run, slots)
            self.lifecycle(run).granted(slots)
        return slots, run.queue.version

    def _check_images(self, run: _Run, images: Sequence[str]) -> list[str]:
        """The images as the run's pool names them: INVALID_ARGUMENT for a malformed one,
        FAILED_PRECONDITION for one the pool does not serve."""
        out = [v.image_ref(f"images[{i}]", image) for i, image in enumerate(images)]
        if out and run.queue.config.pool and self._control is not None:
            with acting_as(run.tenant):
                config = self._control.get_pool(run.queue.config.pool, "config.pool").config
            out = [config.image_for(image, f"images[{i}]") for i, image in enumerate(out)]
        return out

    async def report_progress(
        self, name: str, group_id: str, lease_ids: list[str], trajectories: list[Trajectory]
    ) -> Group:
        """Records a running group's leases and token state; the group says
        whether it was cancelled."""
        run = self.get(name)
        _check_names(trajectories)
        async with run.lock:
            g = run.queue.find(group_id)
            if g.state is GroupState.RUNNING:  # a cancelled group learns so, whatever it reports
                self._check_progress(g, lease_ids, trajectories)
            g = run.queue.report_progress(group_id, lease_ids, trajectories)
            self.lifecycle(run).progress(g)
            await self._flush(run)
        return g

    def _check_progress(self, g: Group, lease_ids: list[str], trajectories: list[Trajectory]) -> None:
        """Leases reported must be the caller's own and in force, and each
        trajectory's sandbox must be under one of the group's leases: the
        queue releases and snapshots what it is told, so it is told only
        what the caller holds."""
        if self._control is None:
            return
        for i, lease_id in enumerate(lease_ids):
            field_name = f"lease_ids[{i}]"
            v.object_id(field_name, lease_id, "lease")
            if lease_id in g.lease_ids:
                continue  # checked when first reported; it may have ended since
            try:
                self._control.get_lease(lease_id)
            except NotFound as e:
                raise NotFound(f"{field_name}: {e.message}") from None
        held: set[str] = set()
        for lease_id in {*g.lease_ids, *lease_ids}:
            lease = self._control.leases.find(lease_id)
            if lease is not None and owns(lease.pool):
                held.update(lease.sandbox_ids)
        # Sandboxes accepted in an earlier report stay acceptable (lost since, or released).
        known = {t.sandbox_id for t in g.trajectories if t.sandbox_id}
        for i, t in enumerate(trajectories):
            if not t.sandbox_id:
                continue
            field_name = f"trajectories[{i}].sandbox_id"
            v.object_id(field_name, t.sandbox_id, "sandbox")
            if t.sandbox_id not in held and t.sandbox_id not in known:
                raise InvalidArgument(
                    field_name,
                    f"{t.sandbox_id!r} is not under any of the group's leases "
                    "(report its lease in lease_ids)",
                )

    async def submit(
        self,
        name: str,
        group_id: str,
        prompt_id: str,
        trajectories: list[Trajectory],
        verifiers: list[VerifierSpec | None],
    ) -> Group:
        """Scores and files a finished group (verifiers run first)."""
        run = self.get(name)
        v.name_text("prompt_id", prompt_id, _ID_MAX)
        _check_names(trajectories)
        g = run.queue.find(group_id)
        life = self.lifecycle(run)
        if g.state is GroupState.RUNNING:
            life.submitting(g)
            await asyncio.gather(
                *(
                    life.verify(group_id, t.trajectory_id, run_verifier(self._control, t, spec))
                    for t, spec in zip(trajectories, verifiers, strict=True)
                    if spec is not None
                )
            )
        self._take_model_calls(run, g, trajectories)
        async with run.lock:
            changed = run.queue.tick()
            g, cancels = run.queue.submit(group_id, prompt_id, trajectories)
            life.submitted(g)
            await self._after(run, changed, cancels)
        return g

    def _take_model_calls(self, run: _Run, g: Group, trajectories: list[Trajectory]) -> None:
        """Puts on each trajectory the model calls made in its sandbox under the
        group's leases (any of the tenant's, when none was reported)."""
        if self._control is None:
            return
        ledger = self._control.model_route.ledger
        leases = list(g.lease_ids) or None
        for t in trajectories:
            if t.sandbox_id:
                t.model_calls = ledger.take(run.tenant, t.sandbox_id, leases)

    # -- trainer side --------------------------------------------------------------

    async def pull(self, name: str, max_batches: int = 0) -> AsyncIterator[Batch]:
        """Batches as they come (at most ``max_batches``, 0 = no end); what stays unacked is redelivered."""
        if max_batches < 0:
            raise InvalidArgument("max_batches", f"must be >= 0, got {max_batches}")
        run = self.get(name)
        stream = run.queue.open_stream()
        sent = 0
        try:
            while not max_batches or sent < max_batches:
                async with run.lock:
                    batch = run.queue.next_batch(stream)
                    await self._flush(run)
                if batch is not None:
                    waiting = [*run.queue.queued, *(g for b in run.queue.batches.values() for g in b.groups)]
                    self.lifecycle(run).delivered(batch, waiting)  # ends the lives of groups dropped as stale
                    sent += 1
                    yield batch
                    continue
                waiter = run.changed
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(waiter.wait(), _IDLE_RECHECK_SECONDS)
        finally:
            run.queue.close_stream(stream)
            with contextlib.suppress(Exception):
                await asyncio.shield(self._flush(run))

    async def ack(self, name: str, batch_id: str) -> None:
        """Retires a trained-on batch for good (a repeat is a no-op); NOT_FOUND for an unknown batch."""
        run = self.get(name)
        async with run.lock:
            batch = run.queue.batches.get(batch_id)
            run.queue.ack(batch_id)
            if batch is not None:
                self.lifecycle(run).consumed(batch)
            changed = run.queue.tick()
            await self._after(run, changed, [])

    async def publish(self, name: str, version: int) -> int:
        """Moves the run to ``version`` (FAILED_PRECONDITION if lower); DROP mode cancels the too stale."""
        run = self.get(name)
        async with run.lock:
            cancels = run.queue.publish(version)
            await self._after(run, False, cancels)
        return run.queue.version

    async def watch_version(self, name: str) -> AsyncIterator[int]:
        """The run's policy version now, then each new one, until the caller stops iterating."""
        run = self.get(name)
        last = None
        while True:
            if run.queue.version != last:
                last = run.queue.version
                yield last
            waiter = run.changed
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(waiter.wait(), _IDLE_RECHECK_SECONDS)

    async def figures(self, name: str) -> Figures:
        """The run's figures, after expiring overdue batches and a due controller step."""
        run = self.get(name)
        async with run.lock:
            changed = run.queue.tick()
            await self._after(run, changed, [])
        return self.lifecycle(run).attach(run.queue.figures())


def check_run_name(name: str) -> str:
    """A run name: 1-128 characters, no '/' (it keys runs per tenant) and no
    control characters."""
    if not name:
        raise InvalidArgument("run", "is required")
    v.name_text("run", name, _RUN_NAME_MAX)
    if "/" in name:
        raise InvalidArgument("run", f"must not contain '/', got {name[:80]!r}")
    return name


def _check_names(trajectories: list[Trajectory]) -> None:
    for i, t in enumerate(trajectories):
        v.name_text(f"trajectories[{i}].trajectory_id", t.trajectory_id, _ID_MAX)


def _slot_images(groups: Iterable[Group], per_group: int) -> dict[str, int]:
    """Sandboxes the slots ``groups`` will lease per named image, ``per_group`` each."""
    wanted: Counter[str] = Counter()
    for g in groups:
        if g.image:
            wanted[g.image] += per_group
    return dict(wanted)


def _within(images: dict[str, int], count: int) -> tuple[tuple[str, int], ...]:
    """``images`` cut down, in order, so that their counts add up to at most ``count``."""
    out: list[tuple[str, int]] = []
    left = count
    for image, n in sorted(images.items()):
        take = min(n, left)
        if take > 0:
            out.append((image, take))
        left -= take
    return tuple(out)
