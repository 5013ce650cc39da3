"""A warm pool: keeps READY sandboxes for its acquirers, hands them out in
FIFO order, and creates more while acquirers wait.

How many it keeps READY is the scaling policy's call (sandboxd.core.scaling):
``min_ready`` is the floor, and a pool whose ``max_ready`` is above it follows
demand between the two (acquire rate, start-up latency, announced demand).
The pool gathers the signals and carries out create and destroy decisions; a
reconciler (sandboxd.core.reconciler) decides when, across all pools, within
a global budget.

Creates in flight are counted (``creating``) so the pool never over-creates
from a stale view, at most ``max_starting`` run at once, each backend attempt
is paced, transient failures are retried in place (tenacity, exponential
backoff with jitter) while the pool holds back new creates, and a permanent
failure (missing image, rejected spec) fails the pool's acquirers at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt

from sandboxd.backends.base import Backend, Limits, SandboxSpec
from sandboxd.clock import Clock
from sandboxd.core.lifecycle import SandboxRecord, State
from sandboxd.core.meters import PoolMeters
from sandboxd.core.scaling import (
    Announcement,
    Bounds,
    DecayingRate,
    Ewma,
    Plan,
    PolicyConfig,
    ScalerState,
    Signals,
    consume,
    decide,
)
from sandboxd.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    PermanentBackendError,
)

if TYPE_CHECKING:
    from sandboxd.core.reconciler import Reconciler

log = logging.getLogger(__name__)

_MAX_BACKOFF = 30.0
_MAX_ANNOUNCE_SECONDS = 24 * 3600.0


@dataclass
class PoolConfig:
    name: str
    image: str
    min_ready: int
    max_size: int
    limits: Limits
    env: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    created_at: float = 0.0
    max_ready: int = 0
    """Ceiling of the warm target; above ``min_ready`` the pool follows demand
    between the two, otherwise it keeps exactly ``min_ready`` READY."""
    idle_seconds: float = 0.0
    """How long warm sandboxes above demand are kept before they are
    destroyed (the scale-down delay); 0 = the server's default."""


def check_scaling(config: PoolConfig) -> None:
    """Validates the demand-following fields of a pool spec."""
    if config.max_ready < 0:
        raise InvalidArgument("spec.max_ready", f"must be >= 0, got {config.max_ready}")
    if config.max_ready > config.max_size:
        raise InvalidArgument(
            "spec.max_ready", f"({config.max_ready}) must not exceed max_size ({config.max_size})"
        )
    if not 0 <= config.idle_seconds <= _MAX_ANNOUNCE_SECONDS:
        raise InvalidArgument(
            "spec.idle_seconds", f"must be between 0 and {_MAX_ANNOUNCE_SECONDS:g}, got {config.idle_seconds}"
        )


@dataclass(frozen=True)
class PoolTuning:
    """How pools scale and start sandboxes (from the server's PoolSettings)."""

    policy: PolicyConfig = field(default_factory=PolicyConfig)
    create_attempts: int = 4
    """Backend attempts per sandbox before it counts as failed (transient errors)."""
    retry_initial_seconds: float = 0.25
    retry_max_seconds: float = _MAX_BACKOFF
    rate_window_seconds: float = 30.0
    """Smoothing window of the acquire rate."""
    startup_estimate_seconds: float = 2.0
    """Start-up latency assumed until one has been measured (by any pool)."""
    announcement_ttl_seconds: float = 120.0
    """How long after its due time an announcement counts by default."""
    refill_defer_seconds: float = 2.0
    """Longest a create nobody waits for defers to urgent work in flight."""


class PoolHost(Protocol):
    """What runs a pool: wakes up on poke, paces backend create attempts."""

    def attach(self, pool: WarmPool) -> None: ...

    def detach(self, pool: WarmPool) -> None: ...

    def poke(self) -> None: ...

    async def paced(self, deferrable: bool = False) -> None:
        """Waits for the pacer's go-ahead for one backend create attempt.
        ``deferrable``: the sandbox only tops up a warm buffer (no acquirer
        waits for it), so it may also wait, boundedly, for urgent work in
        flight (restores) to finish."""
        ...

    def observe_startup(self, seconds: float) -> None:
        """A start-up latency measured by one of the pools."""
        ...

    def startup_estimate(self) -> float | None:
        """Start-up latency measured across pools; None until there is one.
        A pool that has not started anything yet uses it."""
        ...


@dataclass
class _Waiter:
    n: int
    min_n: int
    future: asyncio.Future[list[SandboxRecord]]
    got: list[SandboxRecord] = field(default_factory=list)


def new_sandbox_id() -> str:
    return "sb-" + secrets.token_hex(6)


def _retry_wait(initial: float, ceiling: float) -> Callable[[RetryCallState], float]:
    """Exponential backoff with jitter in [0.5, 1.5) so retries of many
    sandboxes and pools do not line up."""

    def wait(state: RetryCallState) -> float:
        base = min(ceiling, initial * 2 ** (state.attempt_number - 1))
        return float(base * (0.5 + secrets.randbelow(1000) / 1000))

    return wait


class WarmPool:
    def __init__(
        self,
        config: PoolConfig,
        backend: Backend,
        clock: Clock,
        *,
        max_starting: int,
        create_timeout: float,
        on_change: Callable[[SandboxRecord], None] = lambda rec: None,
        host: PoolHost | None = None,
        tuning: PoolTuning | None = None,
        meters: PoolMeters | None = None,
    ) -> None:
        self.config = config
        self._backend = backend
        self._clock = clock
        self._max_starting = max_starting
        self._create_timeout = create_timeout
        self._on_change = on_change
        self._host = host
        self._tuning = tuning or PoolTuning()
        self._meters = meters or PoolMeters()
        self.records: dict[str, SandboxRecord] = {}
        self._ready: deque[SandboxRecord] = deque()
        self._waiters: deque[_Waiter] = deque()
        self.creating = 0
        self.failed_total = 0
        self.created_total = 0
        self.last_error = ""
        self.permanent_error = ""
        self._consecutive_failures = 0
        self._backoff_until = 0.0
        self._creates: set[asyncio.Task[None]] = set()
        self._destroys: set[asyncio.Task[None]] = set()
        self._leaving: set[str] = set()
        self._loop_task: asyncio.Task[None] | None = None
        self._own_host: Reconciler | None = None
        self._closed = False
        self._changed = asyncio.Event()
        # Demand signals and the policy's memory.
        self.warm_target = config.min_ready
        self.warm_keep = config.min_ready
        self.plan: Plan | None = None
        self._scaler_state = ScalerState()
        self._rate = DecayingRate(self._tuning.rate_window_seconds)
        self._startup = Ewma(0.5, self._tuning.startup_estimate_seconds, alpha_down=0.1)
        self.announcements: tuple[Announcement, ...] = ()

    # -- counts -------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.config.name

    def count(self, state: State) -> int:
        return sum(1 for r in self.records.values() if r.state is state)

    @property
    def ready(self) -> int:
        return len(self._ready)

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def _outstanding(self) -> int:
        return sum(w.n - len(w.got) for w in self._waiters)

    @property
    def destroying(self) -> int:
        """Destroys in flight (RELEASING and FAILED sandboxes on their way out)."""
        return len(self._leaving)

    def _occupied(self) -> int:
        # Everything that counts against max_size: all but what is on its way out (O(1)).
        return len(self.records) - len(self._leaving)

    def _in_use(self) -> int:
        """Leased (or handed over and about to be), in O(1)."""
        return max(0, self._occupied() - len(self._ready) - self.creating)

    def _room(self) -> int:
        return max(0, min(self.config.max_size - self._occupied(), self._max_starting - self.creating))

    def creates_needed(self) -> int:
        """Creates this pool wants now: its warm target plus what waiters are
        owed, less what is READY or already being created, within max_size
        and max_starting."""
        if self._closed or self.permanent_error:
            return 0
        missing = self.warm_target + self._outstanding() - len(self._ready) - self.creating
        return max(0, min(missing, self._room()))

    def urgent_needed(self) -> int:
        """The part of ``creates_needed`` that waiting acquirers are owed."""
        if self._closed or self.permanent_error:
            return 0
        missing = self._outstanding() - len(self._ready) - self.creating
        return max(0, min(missing, self._room()))

    def surplus(self) -> int:
        """READY sandboxes above what the policy keeps (none while anyone waits)."""
        if self._waiters:
            return 0
        return max(0, len(self._ready) - self.warm_keep)

    def backoff_remaining(self, now: float) -> float:
        return max(0.0, self._backoff_until - now)

    def ready_records(self) -> list[SandboxRecord]:
        return list(self._ready)

    # -- demand signals and the policy -------------------------------------

    def bounds(self) -> Bounds:
        c = self.config
        return Bounds(min_ready=c.min_ready, max_ready=max(c.max_ready, c.min_ready), max_size=c.max_size)

    def policy(self) -> PolicyConfig:
        p = self._tuning.policy
        return replace(
            p,
            max_starting=self._max_starting,
            scale_down_delay=self.config.idle_seconds or p.scale_down_delay,
        )

    def signals(self, now: float) -> Signals:
        return Signals(
            now=now,
            ready=len(self._ready),
            creating=self.creating,
            leased=self._in_use(),
            waiting=self._outstanding(),
            acquire_rate=self._rate.rate(now),
            startup_seconds=self.startup_seconds,
            announcements=self.announcements,
        )

    def replan(self, now: float) -> Plan:
        """Runs the policy on the current signals and adopts its plan."""
        self.announcements = tuple(a for a in self.announcements if a.remaining > 0 and now < a.expires)
        plan = decide(self.signals(now), self.bounds(), self.policy(), self._scaler_state)
        self._scaler_state = plan.state
        self.plan = plan
        self.warm_target = plan.target
        self.warm_keep = plan.keep
        return plan

    def announce(self, source: str, count: int, in_seconds: float, ttl_seconds: float) -> Announcement | None:
        """Records "in ~in_seconds, ``source`` will acquire ``count`` sandboxes
        here", replacing that source's previous announcement; count 0 withdraws it."""
        if count < 0:
            raise InvalidArgument("count", f"must be >= 0, got {count}")
        if count > self.config.max_size:
            raise InvalidArgument(
                "count", f"({count}) must not exceed the pool's max_size ({self.config.max_size})"
            )
        for name, value in (("in_seconds", in_seconds), ("ttl_seconds", ttl_seconds)):
            if not 0 <= value <= _MAX_ANNOUNCE_SECONDS:
                raise InvalidArgument(name, f"must be between 0 and {_MAX_ANNOUNCE_SECONDS:g}, got {value}")
        if len(source) > 128:
            raise InvalidArgument("source", "at most 128 characters")
        if not self.bounds().follows_demand:
            raise FailedPrecondition(
                f"pool {self.config.name} does not follow demand (max_ready {self.config.max_ready} is not "
                f"above min_ready {self.config.min_ready}); set max_ready to let announcements warm it"
            )
        now = self._clock.monotonic()
        kept = tuple(a for a in self.announcements if a.source != source)
        made = None
        if count:
            due = now + in_seconds
            made = Announcement(
                source, count, due, due + (ttl_seconds or self._tuning.announcement_ttl_seconds)
            )
            kept += (made,)
        self.announcements = kept
        self.poke()
        return made

    def announced(self, source: str) -> int:
        """Acquires still expected from ``source``'s announcement."""
        return sum(a.remaining for a in self.announcements if a.source == source)

    def _note_demand(self, n: int) -> None:
        now = self._clock.monotonic()
        self.announcements, covered = consume(self.announcements, n, now)
        if n > covered:
            self._rate.add(n - covered, now)

    def gauges(self) -> dict[str, float]:
        now = self._clock.monotonic()
        return {
            "sandboxes_ready": len(self._ready),
            "sandboxes_leased": self.count(State.LEASED),
            "sandboxes_starting": self.creating,
            "sandboxes_releasing": self.count(State.RELEASING) + self.count(State.FAILED),
            "warm_target": self.warm_target,
            "warm_keep": self.warm_keep,
            "waiting_acquirers": len(self._waiters),
            "acquire_rate_per_second": self._rate.rate(now),
            "startup_estimate_seconds": self.startup_seconds,
            "announced_sandboxes": sum(a.remaining for a in self.announcements if now < a.expires),
            "failed_total": self.failed_total,
        }

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def acquire_rate(self) -> float:
        return self._rate.rate(self._clock.monotonic())

    @property
    def startup_seconds(self) -> float:
        if not self._startup.samples and self._host is not None:
            shared = self._host.startup_estimate()
            if shared is not None:
                return shared
        return self._startup.value

    # -- change notification -------------------------------------------------

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_changed(self, timeout: float) -> bool:
        """Waits until the pool's state changes (or ``timeout`` passes)."""
        changed = self._changed
        try:
            async with asyncio.timeout(timeout):
                await changed.wait()
        except TimeoutError:
            return False
        return True

    # -- lifecycle ----------------------------------------------------------

    def start(self) -> None:
        if self._host is None:
            # A pool on its own (no control plane): it gets a reconciler of its own.
            from sandboxd.core.reconciler import Reconciler

            own = Reconciler(self._backend, self._clock)
            self._host = own
            self._own_host = own
            own.attach(self)
            self._loop_task = own.start()
        else:
            self._host.attach(self)
        self.poke()

    def poke(self) -> None:
        self._notify()
        if self._host is not None:
            self._host.poke()

    def adopt(self, record: SandboxRecord) -> None:
        """Takes over a sandbox found on the backend after a restart."""
        self.records[record.sandbox_id] = record

    async def close(self, *, destroy_leased: bool) -> None:
        """Stops the pool: cancels creates in flight (their containers are
        removed), destroys READY sandboxes, and leased ones only if asked."""
        self._closed = True
        if self._host is not None:
            self._host.detach(self)
        if self._own_host is not None:
            await self._own_host.stop()
        for waiter in self._waiters:
            if not waiter.future.done():
                waiter.future.set_exception(FailedPrecondition(f"pool {self.config.name} is shutting down"))
        self._waiters.clear()
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
        self._ready.clear()
        await asyncio.gather(*(self._destroy(r) for r in doomed), return_exceptions=True)
        self._notify()

    # -- creating -------------------------------------------------------------

    def start_creates(self, n: int) -> int:
        """Starts ``n`` creates (the reconciler's grant); returns how many."""
        n = min(n, self.creates_needed())
        for _ in range(n):
            # Reserved (counted as creating) before the task first runs, so
            # a pass that comes before it starts cannot create it again.
            self._spawn(self._create_one(self._reserve()), self._creates)
        return max(n, 0)

    @staticmethod
    def _spawn(coro: Coroutine[Any, Any, None], into: set[asyncio.Task[None]]) -> None:
        task = asyncio.create_task(coro)
        into.add(task)
        task.add_done_callback(into.discard)

    def _reserve(self) -> SandboxRecord:
        rec = SandboxRecord(
            sandbox_id=new_sandbox_id(),
            pool=self.config.name,
            image=self.config.image,
            limits=self.config.limits,
            labels=dict(self.config.labels),
        )
        rec.entered[State.CREATING] = self._clock.time()
        self.records[rec.sandbox_id] = rec
        self.creating += 1
        return rec

    def _retryable(self, error: BaseException) -> bool:
        # Cancellation (a BaseException) is never retried: tenacity re-raises it.
        return (
            isinstance(error, Exception)
            and not isinstance(error, PermanentBackendError)
            and not self.permanent_error
            and not self._closed
        )

    def _rename(self, rec: SandboxRecord) -> None:
        """A retry gets a new id (and so a new name on the backend): an
        attempt the engine half-did while it was failing may still hold the
        old name. The record is not visible to clients before READY."""
        self.records.pop(rec.sandbox_id, None)
        rec.sandbox_id = new_sandbox_id()
        self.records[rec.sandbox_id] = rec

    async def _create_with_retries(self, rec: SandboxRecord, spec: SandboxSpec) -> str:
        t = self._tuning
        retrying = AsyncRetrying(
            retry=retry_if_exception(self._retryable),
            stop=stop_after_attempt(max(1, t.create_attempts)),
            wait=_retry_wait(t.retry_initial_seconds, t.retry_max_seconds),
            reraise=True,
        )
        handle = ""
        async for attempt in retrying:
            with attempt:
                if attempt.retry_state.attempt_number > 1:
                    self._rename(rec)
                    spec = replace(spec, sandbox_id=rec.sandbox_id)
                if self._host is not None:
                    await self._host.paced(deferrable=not self._waiters)
                began = self._clock.monotonic()
                try:
                    handle = await asyncio.wait_for(self._backend.create(spec), self._create_timeout)
                except asyncio.CancelledError:
                    raise
                except Exception as e:
                    self._attempt_failed(e)
                    raise
                took = max(0.0, self._clock.monotonic() - began)
                self._startup.add(took)
                if self._host is not None:
                    self._host.observe_startup(took)
        return handle

    async def _create_one(self, rec: SandboxRecord) -> None:
        spec = SandboxSpec(
            sandbox_id=rec.sandbox_id,
            pool=self.config.name,
            image=self.config.image,
            limits=self.config.limits,
            env=self.config.env,
            labels=self.config.labels,
        )
        began = self._clock.monotonic()
        try:
            rec.handle = await self._create_with_retries(rec, spec)
        except asyncio.CancelledError:
            self._meters.create_failures.add(1, {"pool": self.name, "reason": "cancelled"})
            rec.move(State.FAILED, self._clock.time(), "cancelled")
            self._forget(rec)
            raise
        except Exception as e:
            rec.move(State.FAILED, self._clock.time(), self._describe(e))
            self._forget(rec)
            return
        finally:
            self.creating -= 1
            self.poke()
        self._consecutive_failures = 0
        self._backoff_until = 0.0
        self.last_error = ""
        self.created_total += 1
        self._meters.startup_latency.record(self._clock.monotonic() - began, {"pool": self.name})
        rec.move(State.READY, self._clock.time())
        self._on_change(rec)
        if self._closed:
            await self._destroy(rec)
            return
        self._ready.append(rec)
        self._dispatch()
        self._notify()

    def _describe(self, error: Exception) -> str:
        if isinstance(error, TimeoutError):
            return f"create took longer than {self._create_timeout:g}s"
        return str(error) or type(error).__name__

    def _attempt_failed(self, error: Exception) -> None:
        reason = self._describe(error)
        permanent = isinstance(error, PermanentBackendError)
        kind = "permanent" if permanent else "timeout" if isinstance(error, TimeoutError) else "transient"
        self._meters.create_failures.add(1, {"pool": self.name, "reason": kind})
        self.failed_total += 1
        self.last_error = reason
        log.warning("pool %s: create failed (%s): %s", self.config.name, kind, reason)
        if permanent:
            # Retrying cannot help (missing image, rejected spec): fail fast.
            self.permanent_error = reason
            for waiter in self._waiters:
                if not waiter.future.done():
                    waiter.future.set_exception(FailedPrecondition(f"pool {self.config.name}: {reason}"))
            self._notify()
            return
        # Hold back new creates of this pool while the backend struggles; the
        # failed sandbox itself is retried in place with its own backoff.
        self._consecutive_failures += 1
        backoff = min(_MAX_BACKOFF, 0.25 * 2 ** (self._consecutive_failures - 1))
        backoff *= 0.5 + secrets.randbelow(1000) / 1000  # jitter so pools do not retry in lockstep
        self._backoff_until = self._clock.monotonic() + backoff

    def _forget(self, rec: SandboxRecord) -> None:
        rec.move(State.GONE, self._clock.time())
        self.records.pop(rec.sandbox_id, None)
        self._on_change(rec)
        self._notify()

    # -- acquire ------------------------------------------------------------

    def _dispatch(self) -> None:
        while self._waiters and self._ready:
            waiter = self._waiters[0]
            if waiter.future.done():
                self._waiters.popleft()
                continue
            while self._ready and len(waiter.got) < waiter.n:
                waiter.got.append(self._ready.popleft())
            if len(waiter.got) == waiter.n:
                self._waiters.popleft()
                waiter.future.set_result(waiter.got)

    def _served(self, began: float) -> None:
        self._meters.acquire_latency.record(max(0.0, self._clock.monotonic() - began), {"pool": self.name})

    async def acquire(self, n: int, min_n: int, timeout: float) -> list[SandboxRecord]:
        """Takes n READY sandboxes (or at least min_n at the timeout). The
        caller must lease them at once (``mark_leased``)."""
        if self.permanent_error:
            raise FailedPrecondition(
                f"pool {self.config.name} cannot create sandboxes: {self.permanent_error}"
            )
        if self._closed:
            raise FailedPrecondition(f"pool {self.config.name} is being deleted")
        began = self._clock.monotonic()
        self._note_demand(n)
        if not self._waiters and len(self._ready) >= n:
            taken = [self._ready.popleft() for _ in range(n)]
            self._served(began)
            self.poke()
            return taken
        loop = asyncio.get_running_loop()
        waiter = _Waiter(n=n, min_n=min_n, future=loop.create_future())
        self._waiters.append(waiter)
        self._dispatch()
        self.poke()
        try:
            records = await asyncio.wait_for(asyncio.shield(waiter.future), timeout)
            self._served(began)
            return records
        except TimeoutError:
            if waiter.future.done() and not waiter.future.exception():
                self._served(began)
                return waiter.future.result()
            self._withdraw(waiter)
            if min_n and len(waiter.got) >= min_n:
                self._served(began)
                return waiter.got
            got = len(waiter.got)
            self._give_back(waiter.got)
            raise DeadlineExceeded(
                f"pool {self.config.name}: got {got} of {n} sandboxes before the deadline "
                f"(ready {len(self._ready)}, creating {self.creating}"
                + (f", last error: {self.last_error}" if self.last_error else "")
                + ")"
            ) from None
        except BaseException:
            if waiter.future.done() and not waiter.future.cancelled() and not waiter.future.exception():
                self._give_back(waiter.future.result())
            else:
                self._withdraw(waiter)
                self._give_back(waiter.got)
            raise

    def _withdraw(self, waiter: _Waiter) -> None:
        with contextlib.suppress(ValueError):
            self._waiters.remove(waiter)
        if not waiter.future.done():
            waiter.future.cancel()

    def _give_back(self, records: list[SandboxRecord]) -> None:
        # Never handed to a client, so still clean: back to the front of the line.
        for rec in reversed(records):
            if rec.state is State.READY:
                self._ready.appendleft(rec)
        records.clear()
        self._dispatch()
        self.poke()

    def mark_leased(self, records: list[SandboxRecord], lease_id: str) -> None:
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
            with contextlib.suppress(ValueError):
                self._ready.remove(rec)
        rec.move(State.RELEASING, self._clock.time(), reason)
        self._leaving.add(rec.sandbox_id)
        self._on_change(rec)
        self._spawn(self._destroy(rec), self._destroys)
        self.poke()

    def trim(self, n: int) -> int:
        """Destroys up to ``n`` READY sandboxes (the newest first), as the
        policy scales the pool down; returns how many."""
        doomed = list(self._ready)[-n:] if n > 0 else []
        for rec in doomed:
            self.release(rec, "scaled down")
        return len(doomed)

    def fail(self, rec: SandboxRecord, reason: str) -> None:
        """Marks a sandbox lost; it is cleaned up and the pool replaces it."""
        if rec.state not in (State.LEASED, State.READY):
            return
        kind = "died_warm" if rec.state is State.READY else "lost_leased"
        if rec.state is State.READY:
            with contextlib.suppress(ValueError):
                self._ready.remove(rec)
        rec.move(State.FAILED, self._clock.time(), reason)
        self._leaving.add(rec.sandbox_id)
        self.failed_total += 1
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
                await self._backend.destroy(rec.handle)
        except Exception as e:  # the next restart's adoption sweep removes what is left
            log.warning("pool %s: destroy of %s failed: %s", self.config.name, rec.sandbox_id, e)
        finally:
            rec.move(State.GONE, self._clock.time())
            self.records.pop(rec.sandbox_id, None)
            self._leaving.discard(rec.sandbox_id)
            self._on_change(rec)
            self.poke()

    async def drain(self) -> None:
        """Waits for background creates and destroys (tests, shutdown)."""
        while self._creates or self._destroys:
            await asyncio.gather(*self._creates, *self._destroys, return_exceptions=True)
