"""How a pool starts one sandbox on the backend, and what it remembers of
the attempts.

Each backend attempt waits for the host's pacer and runs under the create
timeout. A transient failure is retried in place (tenacity, exponential
backoff with jitter) under a new sandbox id, while the pool holds back new
creates for a while; a permanent one (missing image, rejected spec) is
remembered, so the pool stops creating and fails its acquirers at once.
Every attempt's latency goes to the host's engine health; one that timed out
is booked as in doubt (the engine may still make its container).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import replace

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt

from sandboxd.backends.base import Backend, SandboxSpec
from sandboxd.clock import Clock
from sandboxd.core.meters import PoolMeters
from sandboxd.core.pools.congestion import Call
from sandboxd.core.tuning import MAX_BACKOFF_SECONDS, PoolTuning
from sandboxd.errors import PermanentBackendError

log = logging.getLogger(__name__)


def new_sandbox_id() -> str:
    """A fresh sandbox id (``sb-`` and 12 hex digits)."""
    return "sb-" + secrets.token_hex(6)


def _jitter() -> float:
    # In [0.5, 1.5): retries of many sandboxes and pools do not line up.
    return 0.5 + secrets.randbelow(1000) / 1000


def _retry_wait(initial: float, ceiling: float) -> Callable[[RetryCallState], float]:
    def wait(state: RetryCallState) -> float:
        base = min(ceiling, initial * 2 ** (state.attempt_number - 1))
        return float(base * _jitter())

    return wait


class Starter:
    """Runs one pool's backend creates and keeps their record: failures,
    the last error, a permanent error, the backoff after failures.

    ``pace(deferrable)`` waits for the host's go-ahead for one attempt;
    ``started(seconds)`` hears how long each successful one took;
    ``on_permanent(reason)`` hears of the first permanent failure;
    ``engine_call`` hears how each attempt went and ``in_doubt(sandbox_id)``
    of each attempt that got no answer."""

    def __init__(
        self,
        pool: str,
        backend: Backend,
        clock: Clock,
        *,
        pace: Callable[[bool], Awaitable[None]],
        started: Callable[[float], None],
        on_permanent: Callable[[str], None],
        create_timeout: float,
        tuning: PoolTuning,
        meters: PoolMeters,
        engine_call: Callable[..., None] = lambda *a, **k: None,
        in_doubt: Callable[[str], None] = lambda sandbox_id: None,
    ) -> None:
        self._pool = pool
        self._backend = backend
        self._clock = clock
        self._pace = pace
        self._started = started
        self._on_permanent = on_permanent
        self._create_timeout = create_timeout
        self._tuning = tuning
        self._meters = meters
        self._engine_call = engine_call
        self._in_doubt = in_doubt
        self.failed_total = 0
        """Backend create attempts that failed."""
        self.created_total = 0
        self.last_error = ""
        self.permanent_error = ""
        self._consecutive_failures = 0
        self._backoff_until = 0.0
        self._halted = False

    def halt(self) -> None:
        """No more retries: the pool is closing."""
        self._halted = True

    def backoff_remaining(self, now: float) -> float:
        """Seconds left before the pool may start creates again after failures."""
        return max(0.0, self._backoff_until - now)

    def describe(self, error: Exception) -> str:
        """The failure reason recorded for a create that raised ``error``."""
        if isinstance(error, TimeoutError):
            return f"create took longer than {self._create_timeout:g}s"
        return str(error) or type(error).__name__

    async def create(
        self,
        spec: SandboxSpec,
        *,
        rename: Callable[[], str],
        deferrable: Callable[[], bool],
        pool_wide: bool = True,
    ) -> str:
        """Creates ``spec`` on the backend and returns its handle, retrying
        transient failures; each retry runs under the id ``rename()`` gives.
        ``deferrable()``: nobody waits for this sandbox right now.
        ``pool_wide``: a permanent failure stops the whole pool (its own
        image); otherwise it is raised for the caller to stop that image only."""
        t = self._tuning
        retrying = AsyncRetrying(
            retry=retry_if_exception(self._retryable),
            stop=stop_after_attempt(max(1, t.create_attempts)),
            wait=_retry_wait(t.retry_initial_seconds, t.retry_max_seconds),
            sleep=self._clock.sleep,
            reraise=True,
        )
        handle = ""
        async for attempt in retrying:
            with attempt:
                if attempt.retry_state.attempt_number > 1:
                    # A new id, so a new name on the backend: an attempt the
                    # engine half-did while failing may still hold the old one.
                    spec = replace(spec, sandbox_id=rename())
                await self._pace(deferrable())
                began = self._clock.monotonic()
                try:
                    async with self._clock.timeout(self._create_timeout):
                        handle = await self._backend.create(spec)
                except asyncio.CancelledError:
                    raise
                except Exception as e:
                    if isinstance(e, TimeoutError):
                        self._engine_call(Call.CREATE, self._create_timeout, timed_out=True)
                        self._in_doubt(spec.sandbox_id)
                    else:
                        self._engine_call(Call.CREATE, self._clock.monotonic() - began, failed=True)
                    self._attempt_failed(e, pool_wide)
                    raise
                took = max(0.0, self._clock.monotonic() - began)
                self._engine_call(Call.CREATE, took)
                self._started(took)
        return handle

    def succeeded(self) -> None:
        """A sandbox started: the backend is well again."""
        self._consecutive_failures = 0
        self._backoff_until = 0.0
        self.last_error = ""
        self.created_total += 1

    def _retryable(self, error: BaseException) -> bool:
        # Cancellation (a BaseException) is never retried: tenacity re-raises it.
        return (
            isinstance(error, Exception)
            and not isinstance(error, PermanentBackendError)
            and not self.permanent_error
            and not self._halted
        )

    def _attempt_failed(self, error: Exception, pool_wide: bool = True) -> None:
        reason = self.describe(error)
        permanent = isinstance(error, PermanentBackendError)
        kind = "permanent" if permanent else "timeout" if isinstance(error, TimeoutError) else "transient"
        self._meters.create_failures.add(1, {"pool": self._pool, "reason": kind})
        self.failed_total += 1
        self.last_error = reason
        log.warning("pool %s: create failed (%s): %s", self._pool, kind, reason)
        if permanent and not pool_wide:
            # One of the images a template pool serves: the others go on.
            return
        if permanent:
            # Retrying cannot help (missing image, rejected spec): fail fast.
            self.permanent_error = reason
            self._on_permanent(reason)
            return
        # Hold back new creates of this pool while the backend struggles; the
        # failed sandbox itself is retried in place with its own backoff.
        self._consecutive_failures += 1
        backoff = min(MAX_BACKOFF_SECONDS, 0.25 * 2 ** (self._consecutive_failures - 1))
        self._backoff_until = self._clock.monotonic() + backoff * _jitter()
