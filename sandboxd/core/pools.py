"""A warm pool: keeps ``min_ready`` sandboxes READY, hands them to acquirers
in FIFO order, and creates more while acquirers wait.

Creates in flight are counted (``creating``) so the pool never over-creates
from a stale view, and at most ``max_starting`` run at once so a burst of
acquires cannot storm the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from sandboxd.backends.base import Backend, Limits, SandboxSpec
from sandboxd.clock import Clock
from sandboxd.core.lifecycle import SandboxRecord, State
from sandboxd.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    PermanentBackendError,
)

log = logging.getLogger(__name__)

_MAX_BACKOFF = 30.0


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


@dataclass
class _Waiter:
    n: int
    min_n: int
    future: asyncio.Future[list[SandboxRecord]]
    got: list[SandboxRecord] = field(default_factory=list)


def new_sandbox_id() -> str:
    return "sb-" + secrets.token_hex(6)


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
    ) -> None:
        self.config = config
        self._backend = backend
        self._clock = clock
        self._max_starting = max_starting
        self._create_timeout = create_timeout
        self._on_change = on_change
        self.records: dict[str, SandboxRecord] = {}
        self._ready: deque[SandboxRecord] = deque()
        self._waiters: deque[_Waiter] = deque()
        self.creating = 0
        self.failed_total = 0
        self.last_error = ""
        self.permanent_error = ""
        self._consecutive_failures = 0
        self._backoff_until = 0.0
        self._wake = asyncio.Event()
        self._creates: set[asyncio.Task[None]] = set()
        self._destroys: set[asyncio.Task[None]] = set()
        self._loop_task: asyncio.Task[None] | None = None
        self._closed = False

    # -- counts -------------------------------------------------------------

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

    def _occupied(self) -> int:
        # Everything that counts against max_size: all but what is on its way out.
        return sum(1 for r in self.records.values() if r.state in (State.CREATING, State.READY, State.LEASED))

    def creates_needed(self) -> int:
        want = self.config.min_ready + self._outstanding()
        missing = want - len(self._ready) - self.creating
        room = self.config.max_size - self._occupied()
        return max(0, min(missing, room, self._max_starting - self.creating))

    # -- lifecycle ----------------------------------------------------------

    def start(self) -> None:
        self._loop_task = asyncio.create_task(self._reconcile_loop(), name=f"pool-{self.config.name}")
        self.poke()

    def poke(self) -> None:
        self._wake.set()

    def adopt(self, record: SandboxRecord) -> None:
        """Takes over a sandbox found on the backend after a restart."""
        self.records[record.sandbox_id] = record

    async def close(self, *, destroy_leased: bool) -> None:
        """Stops the pool: cancels creates in flight (their containers are
        removed), destroys READY sandboxes, and leased ones only if asked."""
        self._closed = True
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
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

    async def _reconcile_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            delay = self._backoff_until - self._clock.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            if self.permanent_error:
                continue
            for _ in range(self.creates_needed()):
                # Reserved (counted as creating) before the task first runs, so
                # a pass that comes before it starts cannot create it again.
                self._spawn(self._create_one(self._reserve()), self._creates)

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

    async def _create_one(self, rec: SandboxRecord) -> None:
        spec = SandboxSpec(
            sandbox_id=rec.sandbox_id,
            pool=self.config.name,
            image=self.config.image,
            limits=self.config.limits,
            env=self.config.env,
            labels=self.config.labels,
        )
        try:
            rec.handle = await asyncio.wait_for(self._backend.create(spec), self._create_timeout)
        except asyncio.CancelledError:
            rec.move(State.FAILED, self._clock.time(), "cancelled")
            self._forget(rec)
            raise
        except Exception as e:
            reason = (
                str(e)
                if not isinstance(e, TimeoutError)
                else (f"create took longer than {self._create_timeout:g}s")
            )
            rec.move(State.FAILED, self._clock.time(), reason)
            self._forget(rec)
            self._failed(e, reason)
            return
        finally:
            self.creating -= 1
            self.poke()
        self._consecutive_failures = 0
        self.last_error = ""
        rec.move(State.READY, self._clock.time())
        self._on_change(rec)
        if self._closed:
            await self._destroy(rec)
            return
        self._ready.append(rec)
        self._dispatch()

    def _failed(self, error: Exception, reason: str) -> None:
        self.failed_total += 1
        self.last_error = reason
        log.warning("pool %s: create failed: %s", self.config.name, reason)
        if isinstance(error, PermanentBackendError):
            # Retrying cannot help (missing image, rejected spec): fail fast.
            self.permanent_error = reason
            for waiter in self._waiters:
                if not waiter.future.done():
                    waiter.future.set_exception(FailedPrecondition(f"pool {self.config.name}: {reason}"))
            return
        self._consecutive_failures += 1
        backoff = min(_MAX_BACKOFF, 0.25 * 2 ** (self._consecutive_failures - 1))
        backoff *= 0.5 + secrets.randbelow(1000) / 1000  # jitter so pools do not retry in lockstep
        self._backoff_until = self._clock.monotonic() + backoff

    def _forget(self, rec: SandboxRecord) -> None:
        rec.move(State.GONE, self._clock.time())
        self.records.pop(rec.sandbox_id, None)
        self._on_change(rec)

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

    async def acquire(self, n: int, min_n: int, timeout: float) -> list[SandboxRecord]:
        """Takes n READY sandboxes (or at least min_n at the timeout). The
        caller must lease them at once (``mark_leased``)."""
        if self.permanent_error:
            raise FailedPrecondition(
                f"pool {self.config.name} cannot create sandboxes: {self.permanent_error}"
            )
        if self._closed:
            raise FailedPrecondition(f"pool {self.config.name} is being deleted")
        if not self._waiters and len(self._ready) >= n:
            taken = [self._ready.popleft() for _ in range(n)]
            self.poke()
            return taken
        loop = asyncio.get_running_loop()
        waiter = _Waiter(n=n, min_n=min_n, future=loop.create_future())
        self._waiters.append(waiter)
        self._dispatch()
        self.poke()
        try:
            return await asyncio.wait_for(asyncio.shield(waiter.future), timeout)
        except TimeoutError:
            if waiter.future.done() and not waiter.future.exception():
                return waiter.future.result()
            self._withdraw(waiter)
            if min_n and len(waiter.got) >= min_n:
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

    # -- release ------------------------------------------------------------

    def release(self, rec: SandboxRecord, reason: str = "") -> None:
        """Destroys a leased sandbox in the background; the pool refills."""
        if rec.state not in (State.LEASED, State.READY):
            return
        if rec.state is State.READY:
            with contextlib.suppress(ValueError):
                self._ready.remove(rec)
        rec.move(State.RELEASING, self._clock.time(), reason)
        self._on_change(rec)
        self._spawn(self._destroy(rec), self._destroys)
        self.poke()

    def fail(self, rec: SandboxRecord, reason: str) -> None:
        """Marks a sandbox lost; it is cleaned up and the pool replaces it."""
        if rec.state not in (State.LEASED, State.READY):
            return
        if rec.state is State.READY:
            with contextlib.suppress(ValueError):
                self._ready.remove(rec)
        rec.move(State.FAILED, self._clock.time(), reason)
        self.failed_total += 1
        self._on_change(rec)
        self._spawn(self._destroy(rec), self._destroys)
        self.poke()

    async def _destroy(self, rec: SandboxRecord) -> None:
        if rec.state in (State.READY, State.LEASED):
            rec.move(State.RELEASING, self._clock.time())
        try:
            if rec.handle:
                await self._backend.destroy(rec.handle)
        except Exception as e:  # the next restart's adoption sweep removes what is left
            log.warning("pool %s: destroy of %s failed: %s", self.config.name, rec.sandbox_id, e)
        finally:
            rec.move(State.GONE, self._clock.time())
            self.records.pop(rec.sandbox_id, None)
            self._on_change(rec)
            self.poke()

    async def drain(self) -> None:
        """Waits for background creates and destroys (tests, shutdown)."""
        while self._creates or self._destroys:
            await asyncio.gather(*self._creates, *self._destroys, return_exceptions=True)
