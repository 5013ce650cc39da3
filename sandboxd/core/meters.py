"""Pool metrics through an injected OpenTelemetry ``Meter`` (no-op by
default). Units are in the names; labels are few and bounded: the pool name,
a sandbox state, and a failure reason from a fixed set.

Observed at each collection (gauges): ``sandboxd_pool_sandboxes{state}``
(ready, leased, starting, releasing), ``sandboxd_pool_warm_target``,
``sandboxd_pool_warm_keep``, ``sandboxd_pool_waiting_acquirers``,
``sandboxd_pool_acquire_rate_per_second``,
``sandboxd_pool_startup_estimate_seconds``, ``sandboxd_pool_announced_sandboxes``.
Recorded as they happen: ``sandboxd_acquire_latency_seconds``,
``sandboxd_startup_latency_seconds`` and ``sandboxd_reset_latency_seconds``
(a recycled sandbox's reset in place, beside the create it saves)
(histograms), ``sandboxd_create_failures_total{reason}``,
``sandboxd_sandbox_failures_total{reason}`` and
``sandboxd_reset_destroyed_total{reason}`` (counters); gauge
``sandboxd_pool_recycled_total``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from opentelemetry.metrics import CallbackOptions, Meter, NoOpMeter, Observation

LATENCY_BUCKETS_SECONDS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
)

# Bounded label values for failures.
CREATE_FAILURE_REASONS = ("transient", "permanent", "timeout", "cancelled")
SANDBOX_FAILURE_REASONS = ("died_warm", "lost_leased")


class PoolView(Protocol):
    """What the observable gauges read from a pool."""

    @property
    def name(self) -> str:
        """The pool's internal key, used as the ``pool`` label of every gauge."""
        ...

    def gauges(self) -> dict[str, float]:
        """Gauge name (without the ``sandboxd_pool_`` prefix) -> value; the
        ``sandboxes_<state>`` keys feed ``sandboxd_pool_sandboxes``."""
        ...


class PoolMeters:
    """The instruments, created once per meter and shared by every pool."""

    def __init__(self, meter: Meter | None = None, pools: Callable[[], Iterable[PoolView]] = tuple) -> None:
        meter = meter or NoOpMeter("sandboxd")
        self._pools = pools
        self.acquire_latency = meter.create_histogram(
            "sandboxd_acquire_latency_seconds",
            unit="s",
            description="Time from an acquire's arrival to its sandboxes being handed over.",
            explicit_bucket_boundaries_advisory=LATENCY_BUCKETS_SECONDS,
        )
        self.startup_latency = meter.create_histogram(
            "sandboxd_startup_latency_seconds",
            unit="s",
            description="Time from a sandbox's reservation to READY (retries included).",
            explicit_bucket_boundaries_advisory=LATENCY_BUCKETS_SECONDS,
        )
        self.create_failures = meter.create_counter(
            "sandboxd_create_failures_total",
            description="Failed create attempts, by reason (transient, permanent, timeout, cancelled).",
        )
        self.reset_latency = meter.create_histogram(
            "sandboxd_reset_latency_seconds",
            unit="s",
            description="Time to reset a released sandbox in place and check it (recycling pools).",
            explicit_bucket_boundaries_advisory=LATENCY_BUCKETS_SECONDS,
        )
        self.reset_failures = meter.create_counter(
            "sandboxd_reset_destroyed_total",
            description=(
                "Released sandboxes of recycling pools destroyed instead of reset, by reason "
                "(check, failed, timeout, max uses, in use, in doubt, no baseline, run gone)."
            ),
        )
        self.sandbox_failures = meter.create_counter(
            "sandboxd_sandbox_failures_total",
            description="Sandboxes found dead, by reason (died_warm, lost_leased).",
        )
        meter.create_observable_gauge(
            "sandboxd_pool_sandboxes",
            callbacks=[self._observe_states],
            description="Sandboxes of a pool by state (ready, leased, starting, releasing).",
        )
        for key, description in [
            ("warm_target", "READY sandboxes the policy creates up to."),
            ("warm_keep", "READY sandboxes the policy keeps (destroys only above)."),
            ("waiting_acquirers", "Acquire calls waiting for sandboxes (wait-queue length)."),
            ("acquire_rate_per_second", "Smoothed rate of unannounced acquires."),
            ("startup_estimate_seconds", "Smoothed start-up latency the policy uses."),
            ("announced_sandboxes", "Announced acquires not yet consumed."),
            ("failed_total", "Failed creates and sandboxes lost since the pool started."),
            ("oldest_wait_seconds", "How long the longest-waiting acquirer has waited."),
            ("in_doubt", "Sandboxes whose create or destroy got no answer from the engine."),
            ("recycled_total", "Released sandboxes reset in place and READY again."),
        ]:
            meter.create_observable_gauge(
                f"sandboxd_pool_{key}", callbacks=[self._observer(key)], description=description
            )

    def _observe_states(self, options: CallbackOptions) -> Iterable[Observation]:
        out = []
        for pool in self._pools():
            for key, value in pool.gauges().items():
                if key.startswith("sandboxes_"):
                    out.append(
                        Observation(value, {"pool": pool.name, "state": key.removeprefix("sandboxes_")})
                    )
        return out

    def _observer(self, key: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            return [
                Observation(pool.gauges()[key], {"pool": pool.name})
                for pool in self._pools()
                if key in pool.gauges()
            ]

        return observe
