"""OpenTelemetry metrics and traces of a server, exported on a Prometheus
scrape endpoint (aiohttp) and optionally over OTLP, and ``sandboxd status``.

Owns the meter and tracer set-up (``setup``), the metrics endpoint and
``/healthz`` (``prometheus``) and the live status table (``status``, a
client of the server). The metrics themselves are defined where they are
measured (``sandboxd.core.meters``, the rollout queue).

May import: ``sandboxd.settings``, ``sandboxd.errors``, and for
``status`` the public client API (``sandboxd.client``, ``sandboxd.v1``).
"""

from sandboxd.telemetry.prometheus import MetricsServer, render
from sandboxd.telemetry.setup import Telemetry

__all__ = ["MetricsServer", "Telemetry", "render"]
