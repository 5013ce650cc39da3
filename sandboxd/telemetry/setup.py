"""Telemetry wiring: OpenTelemetry meter and tracer providers for one
server, a Prometheus scrape endpoint, and an optional OTLP exporter.

Every App builds its own providers (never the process-global ones), so two
servers in one process, as in tests, keep their metrics apart."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from typing import Any

from opentelemetry.metrics import Meter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import NoOpTracer, Tracer

from sandboxd.errors import InvalidArgument
from sandboxd.settings import TelemetrySettings
from sandboxd.telemetry.prometheus import MetricsServer, render

log = logging.getLogger(__name__)

_OTLP_PACKAGE = "opentelemetry-exporter-otlp-proto-grpc"


def _otlp(module: str, cls: str, endpoint: str) -> Any:
    try:
        mod = importlib.import_module(f"opentelemetry.exporter.otlp.proto.grpc.{module}")
    except ImportError as e:
        raise InvalidArgument(
            "telemetry.otlp_endpoint", f"needs the {_OTLP_PACKAGE} package (pip install 'sandboxd[otlp]')"
        ) from e
    return getattr(mod, cls)(endpoint=endpoint, insecure=endpoint.startswith("http://"))


class Telemetry:
    """Meter and tracer of one server, and where they are exported to."""

    def __init__(
        self,
        settings: TelemetrySettings | None = None,
        *,
        span_processors: tuple[SpanProcessor, ...] = (),
        metric_readers: tuple[MetricReader, ...] = (),
    ) -> None:
        self.settings = settings or TelemetrySettings()
        resource = Resource.create({"service.name": self.settings.service_name})
        self._scrape = InMemoryMetricReader()
        readers: list[MetricReader] = [self._scrape, *metric_readers]
        processors = list(span_processors)
        if self.settings.otlp_endpoint:
            exporter = _otlp("metric_exporter", "OTLPMetricExporter", self.settings.otlp_endpoint)
            readers.append(
                PeriodicExportingMetricReader(
                    exporter, export_interval_millis=self.settings.otlp_interval_seconds * 1000
                )
            )
            processors.append(
                BatchSpanProcessor(_otlp("trace_exporter", "OTLPSpanExporter", self.settings.otlp_endpoint))
            )
        self.meter_provider = MeterProvider(metric_readers=readers, resource=resource, shutdown_on_exit=False)
        self.tracer_provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        for processor in processors:
            self.tracer_provider.add_span_processor(processor)
        self.meter: Meter = self.meter_provider.get_meter("sandboxd")
        # Spans nobody exports are pure cost on the hot path (measured: 20-60
        # microseconds per exec): without an exporter the tracer is a no-op.
        self.tracer: Tracer = self.tracer_provider.get_tracer("sandboxd") if processors else NoOpTracer()
        self.server: MetricsServer | None = None
        self.health_detail: Callable[[], str] = lambda: ""
        """What ``/healthz`` says beside "ok" (the server sets it: why the engine is degraded)."""

    def prometheus_text(self) -> str:
        """The current metrics in the Prometheus text format."""
        return render(self._scrape.get_metrics_data())

    async def start(self) -> None:
        """Opens the Prometheus scrape endpoint when a metrics port is configured; else does nothing."""
        if self.settings.metrics_port:
            self.server = MetricsServer(
                self.prometheus_text,
                self.settings.metrics_host,
                self.settings.metrics_port,
                detail=lambda: self.health_detail(),
            )
            await self.server.start()
            log.info("metrics on http://%s:%d/metrics", self.server.host, self.server.port)

    async def stop(self) -> None:
        """Closes the scrape endpoint and shuts both providers down, flushing what the exporters hold."""
        if self.server is not None:
            await self.server.stop()
            self.server = None
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()
