"""The Prometheus text exposition format (version 0.0.4), rendered from an
OpenTelemetry metric reader at scrape time, and an aiohttp server for it.

Rendering ourselves keeps the OTel SDK the only metrics library and avoids
the process-global registry of the Prometheus client."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from aiohttp import web
from opentelemetry.sdk.metrics.export import Gauge, Histogram, HistogramDataPoint, MetricsData, Sum

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_INVALID_NAME = re.compile(r"[^a-zA-Z0-9_:]")


def metric_name(name: str) -> str:
    """A name Prometheus accepts: other characters become '_', a leading digit gets a '_' before it."""
    name = _INVALID_NAME.sub("_", name)
    return "_" + name if name[:1].isdigit() else name


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(attributes: Mapping[str, Any] | None, extra: Iterable[tuple[str, str]] = ()) -> str:
    pairs = [(metric_name(k), str(v)) for k, v in sorted((attributes or {}).items())]
    pairs += list(extra)
    if not pairs:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in pairs) + "}"


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    if float(value).is_integer() and abs(value) < 1 << 53:
        return str(int(value))
    return repr(float(value))


def render(data: MetricsData | None) -> str:
    """Every metric of ``data`` as Prometheus text; cumulative sums become
    counters (monotonic) or gauges, histograms get _bucket/_sum/_count."""
    lines: list[str] = []
    seen: set[str] = set()
    for resource_metrics in data.resource_metrics if data else ():
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                name = metric_name(metric.name)
                if name in seen:
                    continue
                seen.add(name)
                points = metric.data
                if isinstance(points, Histogram):
                    kind = "histogram"
                elif isinstance(points, Sum) and points.is_monotonic:
                    kind = "counter"
                elif isinstance(points, Sum | Gauge):
                    kind = "gauge"
                else:  # exponential histograms are not used
                    continue
                if metric.description:
                    lines.append(f"# HELP {name} {_escape(metric.description)}")
                lines.append(f"# TYPE {name} {kind}")
                for point in points.data_points:
                    if isinstance(point, HistogramDataPoint):
                        cumulative = 0
                        bounds = [*point.explicit_bounds, math.inf]
                        for bound, count in zip(bounds, point.bucket_counts, strict=True):
                            cumulative += count
                            le = _labels(point.attributes, [("le", _number(bound))])
                            lines.append(f"{name}_bucket{le} {cumulative}")
                        lines.append(f"{name}_sum{_labels(point.attributes)} {_number(point.sum)}")
                        lines.append(f"{name}_count{_labels(point.attributes)} {point.count}")
                    else:
                        lines.append(f"{name}{_labels(point.attributes)} {_number(point.value)}")
    return "\n".join(lines) + "\n"


class MetricsServer:
    """Serves ``GET /metrics`` (and ``/healthz``) with aiohttp. Port 0 binds
    a free port (read it from ``port`` after ``start``). ``detail`` gives the
    lines ``/healthz`` adds after "ok" (why the engine is degraded); the
    answer stays 200 since the server itself still answers, with typed refusals."""

    def __init__(
        self, collect: Callable[[], str], host: str, port: int, detail: Callable[[], str] = lambda: ""
    ) -> None:
        self._collect = collect
        self._detail = detail
        self.host = host
        self.port = port
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        """Binds and starts serving; ``port`` then holds the port actually bound."""
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port)
        await site.start()
        self._runner = runner
        for address in runner.addresses:
            if isinstance(address, tuple):
                self.port = int(address[1])
                break

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self._collect().encode(), headers={"Content-Type": CONTENT_TYPE})

    async def _healthz(self, request: web.Request) -> web.Response:
        detail = self._detail()
        return web.Response(text="ok\n" + (detail + "\n" if detail else ""))

    async def stop(self) -> None:
        """Stops serving and frees the port; a second call, or one before ``start``, does nothing."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
