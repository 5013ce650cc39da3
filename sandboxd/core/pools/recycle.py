"""Recycling: a recycling pool's released sandboxes are reset in place and
handed out again instead of being destroyed and replaced.

A pool's ``recycle`` setting says whose a recycled sandbox may become:

- ``off`` (the default): released sandboxes are destroyed;
- ``same-tenant``: any later acquire of the pool. A pool belongs to one
  tenant (its key is the tenant's, sandboxd.core.tenancy), so a sandbox
  never reaches another tenant;
- ``same-run``: only an acquire whose ``recycle_label`` lease label has the
  value the sandbox's last lease had (a training run, an experiment). Such
  sandboxes wait aside (``RunReserve``), not in the pool's line, and are
  destroyed when their run has not come back for them in time or when they
  stand in the way of another run's waiters.

A sandbox is recycled only if its baseline was taken before it was first
handed out (sandboxd.sandbox_reset), it has served fewer than ``max_uses``
leases, nothing of it is in doubt, and no command, transfer, snapshot or
fork of it is in flight at its release. Then it is reset in place
(sandboxd.backends.recycling) within ``RESET_TIMEOUT_SECONDS``, its limits,
labels and network rules are put back to the pool's, and it is READY again only if the
verdict finds nothing in doubt. Anything else destroys it.
"""

from __future__ import annotations

import logging
import statistics
from collections import deque
from collections.abc import Callable, Mapping

from sandboxd.backends.base import Backend, EgressNarrowing
from sandboxd.backends.recycling import InPlaceReset
from sandboxd.clock import Clock
from sandboxd.core import validation as v
from sandboxd.core.lifecycle import SandboxRecord, State
from sandboxd.core.live_setting import keeps_sessions
from sandboxd.core.meters import PoolMeters
from sandboxd.core.pools.config import PoolConfig
from sandboxd.errors import BackendError, FailedPrecondition, InvalidArgument, TransientBackendError
from sandboxd.sandbox_reset import verdict

log = logging.getLogger(__name__)

RECYCLE_OFF = "off"
SAME_TENANT = "same-tenant"
SAME_RUN = "same-run"
RECYCLE_MODES = (RECYCLE_OFF, SAME_TENANT, SAME_RUN)
DEFAULT_MAX_USES = 50
"""Leases a recycled sandbox serves when the pool does not say."""
MAX_MAX_USES = 100_000
RESET_TIMEOUT_SECONDS = 30.0
"""Longest a baseline or a reset may take; past it the sandbox is destroyed."""
RUN_KEEP_SECONDS = 60.0
"""How long a same-run sandbox waits for its run to acquire again."""
_WINDOW = 512
# Durations the p50s are taken over (the latest ones).


def check_recycle(config: PoolConfig, backend: object) -> None:
    """Validates a pool spec's recycling fields against ``backend``."""
    if config.recycle not in RECYCLE_MODES:
        raise InvalidArgument(
            "spec.recycle", f"must be one of {', '.join(RECYCLE_MODES)}, got {config.recycle!r}"
        )
    if config.recycle == SAME_RUN:
        if not config.recycle_label:
            raise InvalidArgument(
                "spec.recycle_label", 'names the lease label whose value is the run (recycle "same-run")'
            )
        v.labels("spec.recycle_label", {config.recycle_label: ""})
    elif config.recycle_label:
        raise InvalidArgument("spec.recycle_label", 'is only read with recycle "same-run"')
    if not 0 <= config.max_uses <= MAX_MAX_USES:
        raise InvalidArgument("spec.max_uses", f"must be between 0 and {MAX_MAX_USES}, got {config.max_uses}")
    if config.max_uses and config.recycle == RECYCLE_OFF:
        raise InvalidArgument("spec.max_uses", "is only read when the pool recycles (spec.recycle)")
    if config.recycle != RECYCLE_OFF and not isinstance(backend, InPlaceReset):
        raise FailedPrecondition(
            f"the {type(backend).__name__} backend cannot reset sandboxes in place; "
            'leave spec.recycle "off" (released sandboxes are destroyed)'
        )


def check_recycle_live(config: PoolConfig) -> None:
    """FAILED_PRECONDITION for a recycling gVisor pool whose sandboxes keep
    their shells in the keeper (live snapshots on): those shells' FIFOs in
    the sandbox's /tmp change with every shell, so no reset could tell them
    from a tenant's changes."""
    if config.recycle != RECYCLE_OFF and keeps_sessions(config):
        raise FailedPrecondition(
            f'spec.recycle "{config.recycle}" needs spec.live_snapshots "off" under gVisor (sandboxes '
            'started with the keeper for live snapshots are not reset in place); set it, or recycle "off"'
        )


class RunReserve:
    """Recycled sandboxes of a same-run pool, waiting aside for their run."""

    def __init__(self) -> None:
        self._kept: dict[tuple[str, str], deque[tuple[float, SandboxRecord]]] = {}

    def __len__(self) -> int:
        return sum(len(q) for q in self._kept.values())

    def put(self, rec: SandboxRecord, now: float) -> None:
        """Keeps ``rec`` for the run its key names."""
        self._kept.setdefault((rec.recycle_key or "", rec.image), deque()).append((now, rec))

    def take(self, key: str, image: str, n: int) -> list[SandboxRecord]:
        """Up to ``n`` of run ``key``'s sandboxes of ``image``."""
        q = self._kept.get((key, image))
        out: list[SandboxRecord] = []
        while q and len(out) < n:
            out.append(q.popleft()[1])
        if q is not None and not q:
            del self._kept[(key, image)]
        return out

    def give_back(self, records: list[SandboxRecord], now: float) -> None:
        """Returns sandboxes an acquire took but could not use (still READY, never handed over)."""
        for rec in records:
            if rec.state is State.READY:
                self.put(rec, now)

    def discard(self, rec: SandboxRecord) -> bool:
        """Forgets ``rec``; whether it was kept here."""
        q = self._kept.get((rec.recycle_key or "", rec.image))
        if not q:
            return False
        for i, (_, r) in enumerate(q):
            if r is rec:
                del q[i]
                if not q:
                    del self._kept[(rec.recycle_key or "", rec.image)]
                return True
        return False

    def expired(self, now: float, keep: float) -> list[SandboxRecord]:
        """Takes out those kept longer than ``keep`` seconds."""
        out = []
        for key in list(self._kept):
            q = self._kept[key]
            while q and now - q[0][0] > keep:
                out.append(q.popleft()[1])
            if not q:
                del self._kept[key]
        return out

    def oldest(self, n: int) -> list[SandboxRecord]:
        """Takes out the ``n`` kept longest (to make room for another run's waiters)."""
        entries = sorted((t, id(r), r) for q in self._kept.values() for t, r in q)[:n]
        for _, _, rec in entries:
            self.discard(rec)
        return [rec for _, _, rec in entries]

    def records(self) -> list[SandboxRecord]:
        """Every kept record."""
        return [r for q in self._kept.values() for _, r in q]

    def clear(self) -> None:
        """Forgets every kept record."""
        self._kept.clear()


class Recycler:
    """One pool's recycling decisions, resets and their figures."""

    def __init__(
        self,
        config: PoolConfig,
        backend: Backend,
        clock: Clock,
        meters: PoolMeters,
        busy: Callable[[str], bool],
    ) -> None:
        self._config = config
        self._backend = backend
        self._clock = clock
        self._meters = meters
        self._busy = busy
        self.max_uses = config.max_uses or DEFAULT_MAX_USES
        self.recycled_total = 0
        """Sandboxes reset and READY again."""
        self.destroyed: dict[str, int] = {}
        """Released sandboxes destroyed instead, by why (bounded keys)."""
        self._resets: deque[float] = deque(maxlen=_WINDOW)
        self._creates: deque[float] = deque(maxlen=_WINDOW)

    @property
    def enabled(self) -> bool:
        """Whether the pool recycles at all."""
        return self._config.recycle != RECYCLE_OFF and isinstance(self._backend, InPlaceReset)

    @property
    def by_run(self) -> bool:
        """Whether recycled sandboxes wait aside for their run (same-run)."""
        return self._config.recycle == SAME_RUN

    def key_of(self, labels: Mapping[str, str]) -> str:
        """The run a lease with ``labels`` belongs to ("" for same-tenant: the pool's tenant)."""
        return labels.get(self._config.recycle_label, "") if self.by_run else ""

    def why_not(self, rec: SandboxRecord) -> str:
        """ "" when the released ``rec`` may be reset; else why it is destroyed."""
        if not self.enabled:
            return "off"
        if rec.state is not State.LEASED:
            return "not leased"
        if rec.baseline is None or rec.baseline.usable:
            return "no baseline"
        if rec.doubt:
            return "in doubt"
        if rec.paused:
            return "paused"
        if self._busy(rec.sandbox_id):
            return "in use"
        if rec.uses + 1 >= self.max_uses:
            # The lease ending now was its last.
            return "max uses"
        return ""

    def note_destroyed(self, why: str) -> None:
        """Counts a released sandbox destroyed rather than recycled."""
        self.destroyed[why] = self.destroyed.get(why, 0) + 1
        self._meters.reset_failures.add(1, {"pool": self._config.name, "reason": why})

    def note_create(self, seconds: float) -> None:
        """A create of the pool took ``seconds`` (for the p50 beside the resets')."""
        self._creates.append(seconds)

    async def take_baseline(self, rec: SandboxRecord) -> None:
        """Records ``rec``'s baseline before it is first handed out; a sandbox
        whose baseline fails is used once, not recycled."""
        if not self.enabled or not isinstance(self._backend, InPlaceReset):
            return
        try:
            async with self._clock.timeout(RESET_TIMEOUT_SECONDS):
                rec.baseline = await self._backend.take_baseline(rec.handle, RESET_TIMEOUT_SECONDS)
        except (BackendError, TimeoutError) as e:
            log.warning("pool %s: sandbox %s will not be recycled: %s", self._config.name, rec.sandbox_id, e)
            return
        unusable = rec.baseline.usable
        if unusable:
            log.warning(
                "pool %s: sandbox %s will not be recycled: %s", self._config.name, rec.sandbox_id, unusable
            )

    async def reset(self, rec: SandboxRecord) -> str:
        """Resets ``rec`` in place and checks it; "" when it passed, else why not.
        Its limits, labels and network rules are the pool's again afterwards."""
        assert rec.baseline is not None and isinstance(self._backend, InPlaceReset)
        began = self._clock.monotonic()
        try:
            async with self._clock.timeout(RESET_TIMEOUT_SECONDS):
                report = await self._backend.reset_in_place(rec.handle, rec.baseline, RESET_TIMEOUT_SECONDS)
                doubt = verdict(rec.baseline, report)
                if not doubt and rec.limits != self._config.limits:
                    await self._backend.update_limits(rec.handle, self._config.limits)
                    rec.limits = self._config.limits
                if not doubt and rec.network:
                    # The lease's narrower rules end with it (every process it
                    # ran is gone by now): the next lease starts from the pool's.
                    if not isinstance(self._backend, EgressNarrowing):
                        raise TransientBackendError("the backend cannot put back the pool's network rules")
                    await self._backend.narrow_egress(rec.handle, ())
                    rec.network = ()
        except TimeoutError:
            doubt, why = f"the reset ran past {RESET_TIMEOUT_SECONDS:g}s", "timeout"
        except BackendError as e:
            doubt, why = f"the reset failed: {e}", "failed"
        else:
            why = "check"
        if doubt:
            self.note_destroyed(why)
            log.info(
                "pool %s: sandbox %s destroyed, not recycled: %s", self._config.name, rec.sandbox_id, doubt
            )
            return doubt
        seconds = self._clock.monotonic() - began
        rec.labels = dict(self._config.labels)
        rec.lease_id = ""
        self._resets.append(seconds)
        self.recycled_total += 1
        self._meters.reset_latency.record(seconds, {"pool": self._config.name})
        return ""

    def last_reset_seconds(self) -> float:
        """The latest reset's duration (0 before any)."""
        return self._resets[-1] if self._resets else 0.0

    @property
    def reset_p50_seconds(self) -> float:
        """Median of the latest resets' durations (0 before any)."""
        return statistics.median(self._resets) if self._resets else 0.0

    @property
    def create_p50_seconds(self) -> float:
        """Median of the latest creates' durations, measured the same way (0 before any)."""
        return statistics.median(self._creates) if self._creates else 0.0
