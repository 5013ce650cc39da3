"""Engine latency over time: one cheap container listing a second, timed.

The listing is what sandboxd's own reconciler asks the engine for, so its
latency is the engine's answer time as sandboxd meets it; a call that does
not answer within ``timeout`` is recorded as a timeout (latency None).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import docker


class LatencyProbe:
    """A daemon thread timing ``GET /containers/json?limit=1`` every ``interval`` seconds."""

    def __init__(self, url: str, origin: float, *, interval: float = 1.0, timeout: float = 10.0) -> None:
        self.url = url
        self.origin = origin
        """perf_counter() value the samples' t counts from."""
        self.interval = interval
        self.timeout = timeout
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="engine-probe", daemon=True)

    def __enter__(self) -> LatencyProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(self.timeout + 2)

    def _loop(self) -> None:
        client = docker.DockerClient(base_url=self.url, timeout=self.timeout)
        try:
            while not self._stop.is_set():
                t0 = time.perf_counter()
                try:
                    client.api.containers(all=True, limit=1)
                    latency: float | None = round(time.perf_counter() - t0, 4)
                except Exception:
                    latency = None
                self.samples.append({"t": round(t0 - self.origin, 3), "latency_s": latency})
                self._stop.wait(max(0.0, self.interval - (time.perf_counter() - t0)))
        finally:
            client.close()

    def summary(self) -> dict[str, Any]:
        answered = sorted(s["latency_s"] for s in self.samples if s["latency_s"] is not None)
        return {
            "probes": len(self.samples),
            "timeouts": sum(s["latency_s"] is None for s in self.samples),
            "p50_s": answered[len(answered) // 2] if answered else None,
            "max_s": answered[-1] if answered else None,
        }
