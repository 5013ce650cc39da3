"""Image metrics through an injected OpenTelemetry ``Meter`` (no-op by default).

Counters: ``sandboxd_image_pulls_total{result}`` (done, present, not_found,
unavailable, failed), ``sandboxd_image_evictions_total{reason}`` (budget),
``sandboxd_image_builds_total{result}`` (built, cached, failed),
``sandboxd_image_pulls_over_budget_total`` (pulls begun without room in the
budget: what the cache held was in use or wanted). Histogram:
``sandboxd_image_pull_seconds``. Gauges: ``sandboxd_image_cache_bytes``,
``sandboxd_image_cache_budget_bytes``, ``sandboxd_image_pulls_in_flight``,
``sandboxd_image_cache_reserved_bytes`` (set aside for pulls under way).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from opentelemetry.metrics import CallbackOptions, Meter, NoOpMeter, Observation

from sandboxd.core.meters import LATENCY_BUCKETS_SECONDS

PULL_RESULTS = ("done", "present", "not_found", "unavailable", "failed")
EVICTION_REASONS = ("budget",)
BUILD_RESULTS = ("built", "cached", "failed")


class ImageMeters:
    """The image cache's instruments; ``gauges`` is read at each collection."""

    def __init__(self, meter: Meter | None, gauges: Callable[[], dict[str, float]]) -> None:
        meter = meter or NoOpMeter("sandboxd")
        self._gauges = gauges
        self.pulls = meter.create_counter(
            "sandboxd_image_pulls_total", description="Image pulls asked for, by result."
        )
        self.evictions = meter.create_counter(
            "sandboxd_image_evictions_total", description="Images the cache removed, by reason."
        )
        self.builds = meter.create_counter(
            "sandboxd_image_builds_total", description="Image builds asked for, by result."
        )
        self.over_budget = meter.create_counter(
            "sandboxd_image_pulls_over_budget_total",
            description="Pulls begun without room in the cache's budget (the rest in use or wanted).",
        )
        self.pull_seconds = meter.create_histogram(
            "sandboxd_image_pull_seconds",
            unit="s",
            description="Time from a pull's start to the image being on the engine.",
            explicit_bucket_boundaries_advisory=(*LATENCY_BUCKETS_SECONDS, 300.0, 600.0, 1800.0),
        )
        for key, description in [
            ("cache_bytes", "Disk the images sandboxd pulled or built take (estimate)."),
            ("cache_budget_bytes", "Disk the image cache may take."),
            ("pulls_in_flight", "Pulls running or waiting for a slot."),
            ("cache_reserved_bytes", "Disk set aside for pulls under way (estimate from their manifests)."),
        ]:
            meter.create_observable_gauge(
                f"sandboxd_image_{key}", callbacks=[self._observer(key)], description=description
            )

    def _observer(self, key: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(self._gauges()[key])]

        return observe
