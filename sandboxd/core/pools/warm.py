"""The warm pool: one pool's sandboxes, each record moved by the lifecycle
table. The pool carries out create and destroy decisions and hands its
sandboxes out; what it tells of itself (``figures``), where released
sandboxes go (``releasing``, with ``recycle``), what it hands out, how it
starts a sandbox and what it knows of demand are its parts (``handout``,
``starting``, ``demand``). Its host (``host.PoolHost``) decides when, across
all pools.
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
from sandboxd.core.pools.config import PoolConfig
from sandboxd.core.pools.congestion import Call
from sandboxd.core.pools.demand import Demand
from sandboxd.core.pools.figures import PoolFigures
from sandboxd.core.pools.handout import Handout, Shortfall
from sandboxd.core.pools.host import PoolHost
from sandboxd.core.pools.images import ImageSource
from sandboxd.core.pools.lines import ImageLines
from sandboxd.core.pools.prefetch import PoolImages
from sandboxd.core.pools.recycle import Recycler, RunReserve
from sandboxd.core.pools.releasing import PoolReleasing
from sandboxd.core.pools.starting import Starter, new_sandbox_id
from sandboxd.core.root_setting import writable_root
from sandboxd.core.scaling import Plan
from sandboxd.core.tuning import PoolTuning
from sandboxd.errors import DeadlineExceeded, FailedPrecondition, PermanentBackendError, ResourceExhausted

log = logging.getLogger(__name__)


class WarmPool(PoolFigures, PoolReleasing):
    """One pool's sandboxes: READY ones handed out in FIFO order, creates
    counted while in flight, each record moved by the lifecycle table.
    ``on_change`` hears of every record whose state changed; ``busy`` tells
    whether a command, transfer, snapshot or fork of a sandbox is in flight
    (such a sandbox is never recycled)."""

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
        busy: Callable[[str], bool] = lambda sandbox_id: False,
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
            pull_secrets=tuple(config.image_pull_secrets),
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
        self._recycler = Recycler(config, backend, clock, self._meters, busy)
        self._run_reserve = RunReserve()
        self._reset_gate = asyncio.Semaphore(max(1, max_starting))
        self.creating = 0
        self.resetting = 0
        """Released sandboxes being reset in place (a recycling pool)."""
        self._lost = 0
        self._creates: set[asyncio.Task[None]] = set()
        self._destroys: set[asyncio.Task[None]] = set()
        self._leaving: set[str] = set()
        # A pool runs on its host's loop and has none of its own; kept for
        # callers that cancel background tasks to simulate a crash.
        self._loop_task: asyncio.Task[None] | None = None
        self._closed = False
        self._changed = asyncio.Event()

    # -- the policy -----------------------------------------------------------

    def replan(self, now: float) -> Plan:
        """Runs the policy on the current signals and adopts its plan."""
        self._demand.expire(now)
        policy = self.config.policy(self._tuning.policy, self._max_starting)
        plan = self._demand.replan(self.signals(now), self.config.bounds(), policy)
        self._lines.targets = self._demand.targets
        self._lines.prune()
        self._images.want(self._demand.wanted_images(now))
        self.expire_reserved(now)
        return plan

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
        # Destroys and resets already under way are finished, not abandoned
        # (a reset that ends now destroys its sandbox).
        await asyncio.gather(*self._destroys, return_exceptions=True)
        doomed = [r for r in self.records.values() if r.state is State.READY]
        if destroy_leased:
            doomed += [r for r in self.records.values() if r.state is State.LEASED]
        self._lines.clear()
        self._run_reserve.clear()
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
            model_gateway=bool(self.config.model_endpoint),
            pull_secrets=tuple(self.config.image_pull_secrets),
            live_snapshots=keeps_sessions(self.config),
            writable_root=writable_root(self.config),
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
        await self._recycler.take_baseline(rec)
        self._starter.succeeded()
        seconds = self._clock.monotonic() - began
        self._recycler.note_create(seconds)
        self._meters.startup_latency.record(seconds, {"pool": self.name})
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

    async def acquire(
        self, n: int, min_n: int, timeout: float, image: str = "", labels: dict[str, str] | None = None
    ) -> list[SandboxRecord]:
        """Takes n READY sandboxes of ``image`` ("" = the pool's own; one the
        pool serves, ``PoolConfig.image_for``), or at least min_n at the
        timeout. The image is made present first (pulled if absent, within
        the same timeout), so a missing one fails at once. In a same-run pool
        the sandboxes kept for the run the lease ``labels`` name come first.
        The caller must lease them at once (``mark_leased``)."""
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
        kept = (
            self._run_reserve.take(self._recycler.key_of(labels or {}), image, n)
            if self._recycler.by_run
            else []
        )
        try:
            records = kept + await self._from_line(line, n - len(kept), min_n, len(kept), timeout)
        except Shortfall as e:
            self._run_reserve.give_back(kept, self._clock.monotonic())
            cause = self._host.refusal_cause() or self.last_error or self._start_rate_cause(n - e.got)
            of = "" if image == self.config.image else f" of {image}"
            raise DeadlineExceeded(
                f"pool {self.name}: got {e.got} of {n} sandboxes{of} before the deadline (ready "
                f"{line.ready}, creating {self._lines.creating[image]}{'; ' + cause if cause else ''})"
            ) from None
        except BaseException:
            self._run_reserve.give_back(kept, self._clock.monotonic())
            raise
        self._meters.acquire_latency.record(max(0.0, self._clock.monotonic() - began), {"pool": self.name})
        return records

    @staticmethod
    async def _from_line(
        line: Handout, rest: int, min_n: int, kept: int, timeout: float
    ) -> list[SandboxRecord]:
        """The ``rest`` an acquire still needs after the ``kept`` its run's
        reserve gave; once those alone reach ``min_n``, only what is READY now."""
        if rest <= 0:
            return []
        if min_n and kept >= min_n:
            now = min(rest, line.ready)
            return await line.acquire(now, 0, 0.0) if now else []
        return await line.acquire(rest, max(0, min_n - kept), timeout)

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
        # Resets in place are starts too: they come back READY at their own rate.
        reset = self._recycler.reset_p50_seconds
        resets = (
            f", and {self.resetting} being reset (~{self.resetting / reset:.1f}/s)"
            if self.resetting and reset
            else ""
        )
        return (
            f"start-up: the engine starts {window} at a time{rate}{resets}, and waiters are owed {owed} "
            "more; "
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
