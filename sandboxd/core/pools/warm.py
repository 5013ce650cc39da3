"""The warm pool: one pool's sandboxes, each record moved by the lifecycle
table. The pool counts its records and carries out create and destroy
decisions; what it hands out, how it starts a sandbox and what it knows of
demand are its parts (``handout``, ``starting``, ``demand``). Its host
(``host.PoolHost``) decides when, across all pools.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from sandboxd.backends.base import Backend, SandboxSpec
from sandboxd.clock import Clock
from sandboxd.core.lifecycle import SandboxRecord, State
from sandboxd.core.live_setting import keeps_sessions
from sandboxd.core.meters import PoolMeters
from sandboxd.core.pools.config import PoolConfig, check_announcement
from sandboxd.core.pools.congestion import Call
from sandboxd.core.pools.demand import Demand
from sandboxd.core.pools.handout import Shortfall
from sandboxd.core.pools.host import PoolHost
from sandboxd.core.pools.images import ImageSource
from sandboxd.core.pools.indoubt import destroy_or_book
from sandboxd.core.pools.lines import ImageLines
from sandboxd.core.pools.prefetch import PoolImages
from sandboxd.core.pools.starting import Starter, new_sandbox_id
from sandboxd.core.scaling import Announcement, Plan, Signals
from sandboxd.core.tuning import PoolTuning
from sandboxd.errors import DeadlineExceeded, FailedPrecondition, PermanentBackendError, ResourceExhausted

log = logging.getLogger(__name__)


class WarmPool:
    """One pool's sandboxes: READY ones handed out in FIFO order, creates
    counted while in flight, each record moved by the lifecycle table.
    ``on_change`` hears of every record whose state changed."""

    def __init__(
        self,
        config: PoolConfig,
        backend: Backend,
        clock: Clock,
        *,
        host: PoolHost[WarmPool],
        max_starting: int,
        create_timeout: float,
        on_change: Callable[[SandboxRecord], None] = lambda rec: None,
        tuning: PoolTuning | None = None,
        meters: PoolMeters | None = None,
        images: ImageSource | None = None,
    ) -> None:
        self.config = config
        self._backend = backend
        self._clock = clock
        self._max_starting = max_starting
        self._on_change = on_change
        self._host = host
        self._tuning = tuning or PoolTuning()
        self._meters = meters or PoolMeters()
        self.records: dict[str, SandboxRecord] = {}
        self._lines = ImageLines(clock, config.image, self.poke)
        self._demand = Demand(self._tuning, config.min_ready, config.image)
        self._images = PoolImages(
            config.name,
            config.image,
            images,
            backend,
            clock,
            hold_seconds=self._tuning.announcement_ttl_seconds,
            spawn=lambda coro: self._spawn(coro, self._creates),
            poke=self.poke,
            fail_waiters=lambda image, error: self._lines.fail_waiters(error, image=image),
        )
        self._starter = Starter(
            config.name,
            backend,
            clock,
            pace=host.paced,
            started=self._started,
            on_permanent=self._permanent_failure,
            create_timeout=create_timeout,
            tuning=self._tuning,
            meters=self._meters,
            engine_call=host.engine_call,
            in_doubt=lambda sandbox_id: host.book_in_doubt(sandbox_id, config.name, "", Call.CREATE),
        )
        self._call_timeout = create_timeout
        self.creating = 0
        self._lost = 0
        self._creates: set[asyncio.Task[None]] = set()
        self._destroys: set[asyncio.Task[None]] = set()
        self._leaving: set[str] = set()
        # A pool runs on its host's loop and has none of its own; kept for
        # callers that cancel background tasks to simulate a crash.
        self._loop_task: asyncio.Task[None] | None = None
        self._closed = False
        self._changed = asyncio.Event()

    # -- counts -------------------------------------------------------------

    @property
    def name(self) -> str:
        """The pool's internal key."""
        return self.config.name

    def count(self, state: State) -> int:
        """Records in ``state``."""
        return sum(1 for r in self.records.values() if r.state is state)

    @property
    def ready(self) -> int:
        """READY sandboxes waiting to be handed out."""
        return self._lines.ready

    def ready_of(self, image: str) -> int:
        """READY sandboxes of ``image`` ("" = the pool's own)."""
        image = image or self.config.image
        return self._lines.line(image).ready if image in self._lines.images() else 0

    @property
    def max_starting(self) -> int:
        """Creates this pool may have in flight at once (the static bound)."""
        return self._max_starting

    @property
    def oldest_wait(self) -> float:
        """Seconds the longest-waiting acquirer has waited (0 = none waits)."""
        return self._lines.oldest_wait()

    @property
    def waiting(self) -> int:
        """Acquirers waiting for sandboxes."""
        return self._lines.waiting

    @property
    def destroying(self) -> int:
        """Destroys in flight (RELEASING and FAILED sandboxes on their way out)."""
        return len(self._leaving)

    @property
    def failed_total(self) -> int:
        """Failed create attempts and sandboxes lost since the pool started."""
        return self._starter.failed_total + self._lost

    @property
    def created_total(self) -> int:
        """Sandboxes that became READY since the pool started."""
        return self._starter.created_total

    @property
    def last_error(self) -> str:
        """The last create failure, until a create succeeds again."""
        return self._starter.last_error

    @property
    def permanent_error(self) -> str:
        """Why the pool cannot create sandboxes at all; "" while it can."""
        return self._starter.permanent_error

    def _occupied(self) -> int:
        # Everything that counts against max_size: all but what is on its way out (O(1)).
        return len(self.records) - len(self._leaving)

    def _in_use(self) -> int:
        """Leased (or handed over and about to be), in O(1)."""
        return max(0, self._occupied() - self._lines.ready - self.creating)

    def _room(self) -> int:
        starting = max(self._max_starting, self._host.start_window())
        return max(0, min(self.config.max_size - self._occupied(), starting - self.creating))

    def creates_needed(self) -> int:
        """Creates this pool wants now: per image, its warm target plus what
        waiters are owed, less what is READY or already being created of it,
        within max_size and max_starting."""
        if self._closed or self.permanent_error:
            return 0
        missing = sum(self._warm_shortfalls().values())
        return max(0, min(missing, self._room()))

    def _warm_shortfalls(self) -> dict[str, int]:
        return self._lines.shortfalls(warm=True, blocked=self._images.blocked(self._lines.targets))

    def urgent_needed(self) -> int:
        """The part of ``creates_needed`` that waiting acquirers are owed."""
        if self._closed or self.permanent_error:
            return 0
        missing = sum(self._lines.shortfalls(warm=False).values())
        return max(0, min(missing, self._room()))

    def surplus(self) -> int:
        """READY sandboxes above what the policy keeps; while acquirers wait,
        only those of other images that stand in the way of theirs (the pool
        is at max_size)."""
        if self._lines.waiting:
            owed = sum(self._lines.shortfalls(warm=False).values())
            free = self.config.max_size - self._occupied()
            return max(0, min(owed - free - self.destroying, self._lines.spare()))
        return max(0, self._lines.ready - self.warm_keep)

    def backoff_remaining(self, now: float) -> float:
        """Seconds left before this pool may start creates again after failures."""
        return self._starter.backoff_remaining(now)

    def ready_records(self) -> list[SandboxRecord]:
        """The READY records, oldest first."""
        return self._lines.records()

    def warm_targets(self) -> dict[str, int]:
        """The warm target split over images (the pool's own included)."""
        return dict(self._lines.targets)

    def image_counts(self) -> dict[str, tuple[int, int, int]]:
        """(READY, creating, waiting) per image with any of them or a target."""
        out: dict[str, tuple[int, int, int]] = {}
        for image in {*self._lines.images(), *self._lines.targets}:
            line = self._lines.line(image)
            out[image] = (line.ready, self._lines.creating[image], line.outstanding())
        return out

    # -- demand signals and the policy -------------------------------------

    @property
    def warm_target(self) -> int:
        """READY sandboxes the policy last asked for."""
        return self._demand.warm_target

    @property
    def warm_keep(self) -> int:
        """READY sandboxes the policy last said to keep (the rest may go)."""
        return self._demand.warm_keep

    @property
    def plan(self) -> Plan | None:
        """The policy's last plan; None before the first pass."""
        return self._demand.plan

    def signals(self, now: float) -> Signals:
        """The demand signals the policy reads, as of ``now``."""
        return Signals(
            now=now,
            ready=self._lines.ready,
            creating=self.creating,
            leased=self._in_use(),
            waiting=self._lines.outstanding(),
            acquire_rate=self._demand.acquire_rate(now),
            startup_seconds=self.startup_seconds,
            announcements=self._demand.announcements,
        )

    def replan(self, now: float) -> Plan:
        """Runs the policy on the current signals and adopts its plan."""
        self._demand.expire(now)
        policy = self.config.policy(self._tuning.policy, self._max_starting)
        plan = self._demand.replan(self.signals(now), self.config.bounds(), policy)
        self._lines.targets = self._demand.targets
        self._lines.prune()
        self._images.want(self._demand.wanted_images(now))
        return plan

    def announce(
        self,
        source: str,
        count: int,
        in_seconds: float,
        ttl_seconds: float,
        images: tuple[tuple[str, int], ...] = (),
    ) -> Announcement | None:
        """Records "in ~in_seconds, ``source`` will acquire ``count`` sandboxes
        here, ``images`` (image, count) of which image", replacing that
        source's previous announcement; count 0 withdraws it."""
        images = tuple((self.config.image_for(i), n) for i, n in images if n)
        check_announcement(self.config, source, count, in_seconds, ttl_seconds, images)
        now = self._clock.monotonic()
        made = self._demand.announce(source, count, now, in_seconds, ttl_seconds, images)
        self._images.want(self._demand.wanted_images(now))
        self.poke()
        return made

    def announced(self, source: str) -> int:
        """Acquires still expected from ``source``'s announcement."""
        return self._demand.announced(source)

    def gauges(self) -> dict[str, float]:
        """Current figures for the metrics exporter."""
        now = self._clock.monotonic()
        return {
            "sandboxes_ready": self._lines.ready,
            "sandboxes_leased": self.count(State.LEASED),
            "sandboxes_starting": self.creating,
            "sandboxes_releasing": self.count(State.RELEASING) + self.count(State.FAILED),
            "warm_target": self.warm_target,
            "warm_keep": self.warm_keep,
            "waiting_acquirers": self._lines.waiting,
            "acquire_rate_per_second": self._demand.acquire_rate(now),
            "startup_estimate_seconds": self.startup_seconds,
            "announced_sandboxes": self._demand.announced_total(now),
            "failed_total": self.failed_total,
            "oldest_wait_seconds": self._lines.oldest_wait(),
            "in_doubt": self._host.engine_view(self.name)[2],
            "start_window": self._host.engine_view(self.name)[1],
        }

    @property
    def engine_degraded(self) -> str:
        """Why the engine is degraded ("" while it is healthy)."""
        return self._host.engine_view(self.name)[0]

    @property
    def closed(self) -> bool:
        """Whether the pool is shutting down or deleted."""
        return self._closed

    @property
    def acquire_rate(self) -> float:
        """Acquires per second not covered by announcements, smoothed."""
        return self._demand.acquire_rate(self._clock.monotonic())

    @property
    def startup_seconds(self) -> float:
        """Start-up latency estimate (this pool's, else the host's shared one)."""
        return self._demand.startup_seconds(self._host.startup_estimate)

    # -- change notification -------------------------------------------------

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_changed(self, timeout: float) -> bool:
        """Waits until the pool's state changes (or ``timeout`` passes)."""
        changed = self._changed
        try:
            async with self._clock.timeout(timeout):
                await changed.wait()
        except TimeoutError:
            return False
        return True

    # -- lifecycle ----------------------------------------------------------

    def start(self) -> None:
        """Hands the pool to its host, which creates what it needs from now on."""
        self._host.attach(self)
        self.poke()

    def poke(self) -> None:
        """Tells waiters and the host that something changed."""
        self._notify()
        self._host.poke()

    def adopt(self, record: SandboxRecord) -> None:
        """Takes over a sandbox found on the backend after a restart."""
        self.records[record.sandbox_id] = record
        self._images.use(record.image)

    async def close(self, *, destroy_leased: bool) -> None:
        """Stops the pool: cancels creates in flight (their containers are
        removed), destroys READY sandboxes, and leased ones only if asked."""
        self._closed = True
        self._starter.halt()
        self._host.detach(self)
        self._lines.fail_waiters(
            lambda: FailedPrecondition(f"pool {self.config.name} is shutting down"), forget=True
        )
        self._images.withdraw()
        for task in list(self._creates):
            task.cancel()
        await asyncio.gather(*self._creates, return_exceptions=True)
        for rec in [r for r in self.records.values() if r.state is State.CREATING]:
            # Reserved, but its create task was cancelled before it began.
            self.creating -= 1
            rec.move(State.FAILED, self._clock.time(), "cancelled")
            self._forget(rec)
        # Destroys already under way are finished, not abandoned.
        await asyncio.gather(*self._destroys, return_exceptions=True)
        doomed = [r for r in self.records.values() if r.state is State.READY]
        if destroy_leased:
            doomed += [r for r in self.records.values() if r.state is State.LEASED]
        self._lines.clear()
        await asyncio.gather(*(self._destroy(r) for r in doomed), return_exceptions=True)
        self._notify()

    # -- creating -------------------------------------------------------------

    def start_creates(self, n: int) -> int:
        """Starts ``n`` creates (the reconciler's grant); returns how many."""
        n = min(n, self.creates_needed())
        if n <= 0:
            return 0
        urgent = self._lines.shortfalls(warm=False)
        warm = self._warm_shortfalls()
        images = self._lines.order(urgent, warm, n)
        for image in images:
            # Reserved (counted as creating, per image) before the task first
            # runs, so a pass that comes before it starts cannot create it again.
            self._spawn(self._create_one(self._reserve(image)), self._creates)
        return len(images)

    @staticmethod
    def _spawn(coro: Coroutine[Any, Any, None], into: set[asyncio.Task[None]]) -> None:
        task = asyncio.create_task(coro)
        into.add(task)
        task.add_done_callback(into.discard)

    def _reserve(self, image: str) -> SandboxRecord:
        rec = SandboxRecord(
            sandbox_id=new_sandbox_id(),
            pool=self.config.name,
            image=image,
            limits=self.config.limits,
            labels=dict(self.config.labels),
        )
        rec.entered[State.CREATING] = self._clock.time()
        self.records[rec.sandbox_id] = rec
        self.creating += 1
        self._lines.creating[image] += 1
        self._images.use(image)
        return rec

    def _rename(self, rec: SandboxRecord) -> str:
        # The record is not visible to clients before READY, so its id may change.
        self.records.pop(rec.sandbox_id, None)
        rec.sandbox_id = new_sandbox_id()
        self.records[rec.sandbox_id] = rec
        return rec.sandbox_id

    def _started(self, seconds: float) -> None:
        self._demand.started(seconds)
        self._host.observe_startup(seconds)

    def _permanent_failure(self, reason: str) -> None:
        self._lines.fail_waiters(lambda: FailedPrecondition(f"pool {self.config.name}: {reason}"))
        self._notify()

    async def _create_one(self, rec: SandboxRecord) -> None:
        spec = SandboxSpec(
            sandbox_id=rec.sandbox_id,
            pool=self.config.name,
            image=rec.image,
            limits=self.config.limits,
            env=self.config.env,
            labels=self.config.labels,
            runtime=self.config.runtime,
            network=tuple(self.config.network),
            live_snapshots=keeps_sessions(self.config),
        )
        own = rec.image == self.config.image
        began = self._clock.monotonic()
        try:
            rec.handle = await self._starter.create(
                spec,
                rename=lambda: self._rename(rec),
                deferrable=lambda: not self._lines.line(rec.image).waiting,
                pool_wide=own,
            )
        except asyncio.CancelledError:
            self._meters.create_failures.add(1, {"pool": self.name, "reason": "cancelled"})
            rec.move(State.FAILED, self._clock.time(), "cancelled")
            self._forget(rec)
            raise
        except Exception as e:
            rec.move(State.FAILED, self._clock.time(), self._starter.describe(e))
            self._forget(rec)
            if not own and isinstance(e, PermanentBackendError):
                self._images.failed(rec.image, self._starter.describe(e))
            return
        finally:
            self.creating -= 1
            self._lines.creating[rec.image] -= 1
            self.poke()
        self._starter.succeeded()
        self._meters.startup_latency.record(self._clock.monotonic() - began, {"pool": self.name})
        rec.move(State.READY, self._clock.time())
        self._on_change(rec)
        if self._closed:
            await self._destroy(rec)
            return
        self._lines.put(rec)
        self._notify()

    def _forget(self, rec: SandboxRecord) -> None:
        rec.move(State.GONE, self._clock.time())
        if self.records.pop(rec.sandbox_id, None) is not None:
            self._images.unuse(rec.image)
        self._on_change(rec)
        self._notify()

    # -- acquire ------------------------------------------------------------

    async def acquire(self, n: int, min_n: int, timeout: float, image: str = "") -> list[SandboxRecord]:
        """Takes n READY sandboxes of ``image`` ("" = the pool's own; one the
        pool serves, ``PoolConfig.image_for``), or at least min_n at the
        timeout. The image is made present first (pulled if absent, within
        the same timeout), so a missing one fails at once. The caller must
        lease them at once (``mark_leased``)."""
        image = self.config.image_for(image)
        if self.permanent_error:
            raise FailedPrecondition(
                f"pool {self.config.name} cannot create sandboxes: {self.permanent_error}"
            )
        if self._closed:
            raise FailedPrecondition(f"pool {self.config.name} is being deleted")
        ceiling = self._host.ceiling()
        if ceiling and (min_n or n) > ceiling:
            # Can never be served here, however long it waits: say so now.
            raise ResourceExhausted(
                f"pool {self.config.name}: {min_n or n} sandboxes asked, the host holds at most {ceiling}"
            )
        began = self._clock.monotonic()
        line = self._lines.line(image)
        if image != self.config.image and not line.ready and not self._lines.creating[image]:
            # Creates of it in flight hold it (``use``) already: an ensure
            # would only keep it from eviction for the cache's grace period.
            await self._images.ensure(image, began + timeout)
            timeout = max(0.0, began + timeout - self._clock.monotonic())
            line = self._lines.line(image)
        self._demand.acquired(n, began, "" if image == self.config.image else image)
        try:
            records = await line.acquire(n, min_n, timeout)
        except Shortfall as e:
            cause = self._host.refusal_cause() or self.last_error or self._start_rate_cause(n - e.got)
            of = "" if image == self.config.image else f" of {image}"
            raise DeadlineExceeded(
                f"pool {self.name}: got {e.got} of {n} sandboxes{of} before the deadline (ready "
                f"{line.ready}, creating {self._lines.creating[image]}{'; ' + cause if cause else ''})"
            ) from None
        self._meters.acquire_latency.record(max(0.0, self._clock.monotonic() - began), {"pool": self.name})
        return records

    def _start_rate_cause(self, short: int) -> str:
        """Why waiters are not served when nothing failed and nothing is full:
        sandboxes are being started as fast as the engine's window lets them.
        ``short``: what the acquirer that gave up still lacked."""
        owed = self._lines.outstanding() + short
        if not owed:
            return ""
        window = self._host.start_window()
        startup = self._host.startup_estimate()
        rate = f", ~{window / startup:.1f}/s" if startup else ""
        return (
            f"start-up: the engine starts {window} at a time{rate}, and waiters are owed {owed} more; "
            "give the acquire a longer deadline or announce the burst ahead (Prewarm/SetDemand)"
        )

    def mark_leased(self, records: list[SandboxRecord], lease_id: str) -> None:
        """Moves records handed over by ``acquire`` to LEASED under ``lease_id``."""
        now = self._clock.time()
        for rec in records:
            rec.move(State.LEASED, now)
            rec.lease_id = lease_id
            self._on_change(rec)
        self._notify()

    # -- release ------------------------------------------------------------

    def release(self, rec: SandboxRecord, reason: str = "") -> None:
        """Destroys a leased sandbox in the background; the pool refills."""
        if rec.state not in (State.LEASED, State.READY):
            return
        if rec.state is State.READY:
            self._lines.discard(rec)
        rec.move(State.RELEASING, self._clock.time(), reason)
        self._leaving.add(rec.sandbox_id)
        self._on_change(rec)
        self._spawn(self._destroy(rec), self._destroys)
        self.poke()

    def trim(self, n: int) -> int:
        """Destroys up to ``n`` READY sandboxes (the newest first), as the
        policy scales the pool down; returns how many."""
        doomed = self._lines.victims(n) if n > 0 else []
        for rec in doomed:
            self.release(rec, "scaled down")
        return len(doomed)

    def fail(self, rec: SandboxRecord, reason: str) -> None:
        """Marks a sandbox lost; it is cleaned up and the pool replaces it."""
        if rec.state not in (State.LEASED, State.READY):
            return
        kind = "died_warm" if rec.state is State.READY else "lost_leased"
        if rec.state is State.READY:
            self._lines.discard(rec)
        rec.move(State.FAILED, self._clock.time(), reason)
        self._leaving.add(rec.sandbox_id)
        self._lost += 1
        self._meters.sandbox_failures.add(1, {"pool": self.name, "reason": kind})
        self._on_change(rec)
        self._spawn(self._destroy(rec), self._destroys)
        self.poke()

    async def _destroy(self, rec: SandboxRecord) -> None:
        if rec.state in (State.READY, State.LEASED):
            rec.move(State.RELEASING, self._clock.time())
        self._leaving.add(rec.sandbox_id)
        try:
            if rec.handle:
                await destroy_or_book(self._backend, self._clock, self._host, self._call_timeout, rec)
        finally:
            rec.move(State.GONE, self._clock.time())
            if self.records.pop(rec.sandbox_id, None) is not None:
                self._images.unuse(rec.image)
            self._leaving.discard(rec.sandbox_id)
            self._on_change(rec)
            self.poke()

    async def drain(self) -> None:
        """Waits for background creates and destroys (tests, shutdown)."""
        while self._creates or self._destroys:
            await asyncio.gather(*self._creates, *self._destroys, return_exceptions=True)
