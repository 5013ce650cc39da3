"""OpenTelemetry metrics and traces of a server, exported on a Prometheus
scrape endpoint (aiohttp) and optionally over OTLP."""

from sandboxd.telemetry.prometheus import MetricsServer, render
from sandboxd.telemetry.setup import Telemetry

__all__ = ["MetricsServer", "Telemetry", "render"]
