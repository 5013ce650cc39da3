"""E2B's sandbox metrics (``get_metrics``) from sandboxd's usage of a sandbox.

A metric is sampled when asked for: sandboxd reports a sandbox's memory,
workspace bytes and CPU seconds used so far, not a history. What is kept is
the samples earlier calls took, in this server's memory only (at most
``KEPT`` per sandbox, gone when the sandbox ends or the server restarts), so
a caller that asks now and then sees its own earlier samples within
``start``..``end``; nothing is sampled between calls.
"""

from __future__ import annotations

import datetime as dt
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sandboxd.v1 import common_pb2, sandboxes_pb2

__all__ = ["KEPT", "Sample", "Samples", "sample"]

KEPT = 720
"""The most samples kept per sandbox (an hour at one call every five seconds)."""


@dataclass(frozen=True)
class Sample:
    at: dt.datetime
    sandbox_id: str
    """The sandboxd sandbox sampled (a filesystem resume runs in another one)."""
    cpu_seconds: float
    metric: dict[str, Any]
    """E2B's SandboxMetric."""


def _stamp(t: dt.datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def sample(
    at: dt.datetime,
    since: dt.datetime,
    sandbox_id: str,
    usage: sandboxes_pb2.Usage,
    limits: common_pb2.Limits,
    previous: Sample | None,
) -> Sample:
    """One metric of ``sandbox_id`` at ``at``: CPU use since the previous
    sample of the same sandbox, or on average since ``since`` (its start),
    as a share of its CPU limit (of one core where it has none, capped at
    100); memory against its limit (its peak where it has none); the
    workspace's bytes against its size. Page cache is not reported (0)."""
    cpu_count = max(1, limits.cpu_millis // 1000)
    cores = limits.cpu_millis / 1000 if limits.cpu_millis else float(cpu_count)
    base_at, base_cpu = since, 0.0
    same = previous is not None and previous.sandbox_id == sandbox_id
    if previous is not None and same and previous.cpu_seconds <= usage.cpu_seconds:
        base_at, base_cpu = previous.at, previous.cpu_seconds
    elapsed = (at - base_at).total_seconds()
    used = (usage.cpu_seconds - base_cpu) / elapsed / cores * 100 if elapsed > 0 else 0.0
    memory_total = limits.memory_bytes or max(usage.memory_bytes, usage.memory_peak_bytes)
    metric = {
        "timestamp": _stamp(at),
        "timestampUnix": int(at.timestamp()),
        "cpuCount": cpu_count,
        "cpuUsedPct": round(min(100.0, max(0.0, used)), 2),
        "memUsed": usage.memory_bytes,
        "memTotal": memory_total,
        "memCache": 0,
        "diskUsed": usage.disk_bytes,
        "diskTotal": usage.disk_limit_bytes or limits.disk_bytes,
    }
    return Sample(at, sandbox_id, usage.cpu_seconds, metric)


class Samples:
    """The samples taken of each E2B sandbox, by its E2B id, oldest first."""

    def __init__(self) -> None:
        self._by_box: dict[str, deque[Sample]] = {}

    def last(self, box_id: str) -> Sample | None:
        kept = self._by_box.get(box_id)
        return kept[-1] if kept else None

    def add(self, box_id: str, taken: Sample) -> None:
        self._by_box.setdefault(box_id, deque(maxlen=KEPT)).append(taken)

    def between(self, box_id: str, start: float | None, end: float | None) -> list[dict[str, Any]]:
        """The kept metrics from ``start`` to ``end`` (unix seconds, None =
        unbounded; whole seconds, as the SDK sends them, so ``end`` takes
        in the second it names)."""
        return [
            s.metric
            for s in self._by_box.get(box_id, ())
            if (start is None or s.at.timestamp() >= start) and (end is None or s.at.timestamp() < end + 1)
        ]

    def forget(self, box_id: str) -> None:
        self._by_box.pop(box_id, None)

    def keep_only(self, box_ids: Iterable[str]) -> None:
        """Drops the samples of sandboxes not in ``box_ids`` (those that ended)."""
        alive = set(box_ids)
        for box_id in [b for b in self._by_box if b not in alive]:
            del self._by_box[box_id]
