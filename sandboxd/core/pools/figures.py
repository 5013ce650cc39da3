"""What a warm pool tells about itself: its counts, the demand signals the
scaling policy reads and the plan it adopted, its announcements, and the
gauges the metrics exporter reads. Mixed into WarmPool, which owns the
state these read."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sandboxd.clock import Clock
from sandboxd.core.lifecycle import SandboxRecord, State
from sandboxd.core.pools.config import PoolConfig, check_announcement
from sandboxd.core.pools.demand import Demand
from sandboxd.core.pools.host import PoolHost
from sandboxd.core.pools.lines import ImageLines
from sandboxd.core.pools.prefetch import PoolImages
from sandboxd.core.pools.recycle import Recycler, RunReserve
from sandboxd.core.pools.starting import Starter
from sandboxd.core.scaling import Announcement, Plan, Signals
from sandboxd.core.tuning import PoolTuning


class PoolFigures:
    """Counts, signals, the policy's plan and the gauges of one pool."""

    config: PoolConfig
    records: dict[str, SandboxRecord]
    creating: int
    resetting: int
    _clock: Clock
    _host: PoolHost[Any]
    _tuning: PoolTuning
    _max_starting: int
    _lines: ImageLines
    _demand: Demand
    _images: PoolImages
    _starter: Starter
    _recycler: Recycler
    _run_reserve: RunReserve
    _leaving: set[str]
    _lost: int
    _closed: bool

    if TYPE_CHECKING:

        def poke(self) -> None: ...  # WarmPool's

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
        """READY sandboxes waiting to be handed out (to any acquirer: those
        a same-run pool keeps for their run are not counted)."""
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
    def recycled_total(self) -> int:
        """Released sandboxes reset in place and READY again since the pool started."""
        return self._recycler.recycled_total

    @property
    def reset_p50_seconds(self) -> float:
        """Median duration of the latest resets in place (0 before any)."""
        return self._recycler.reset_p50_seconds

    @property
    def create_p50_seconds(self) -> float:
        """Median duration of the latest creates, to set beside the resets' (0 before any)."""
        return self._recycler.create_p50_seconds

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
        """Leased (or handed over and about to be, or kept for a run), in O(1)."""
        return max(0, self._occupied() - self._lines.ready - self.creating - self.resetting)

    def _room(self) -> int:
        starting = max(self._max_starting, self._host.start_window())
        return max(0, min(self.config.max_size - self._occupied(), starting - self.creating))

    def creates_needed(self) -> int:
        """Creates this pool wants now: per image, its warm target plus what
        waiters are owed, less what is READY or already being created (or
        reset) of it, within max_size and max_starting."""
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
        """The demand signals the policy reads, as of ``now``. Sandboxes being
        reset in place count as starts in flight: each comes back READY."""
        return Signals(
            now=now,
            ready=self._lines.ready,
            creating=self.creating + self.resetting,
            leased=self._in_use(),
            waiting=self._lines.outstanding(),
            acquire_rate=self._demand.acquire_rate(now),
            startup_seconds=self.startup_seconds,
            announcements=self._demand.announcements,
        )

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
            "recycled_total": self.recycled_total,
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
        """Start-up latency estimate (this pool's, else the host's shared one);
        resets in place count as starts."""
        return self._demand.startup_seconds(self._host.startup_estimate)
