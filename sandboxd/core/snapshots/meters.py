"""The change journals' use of the host's inotify limits as OpenTelemetry
instruments, observed at each collection: watches and instances held, and
the journals that fell back to walking their workspace, by reason
(sandboxd.core.snapshots.journal: overflow, budget, limit, flood, moved,
storm; a bounded label)."""

from __future__ import annotations

from collections.abc import Iterable

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from sandboxd.core.snapshots.journal import Watcher


def register_journal_meters(meter: Meter, watcher: Watcher) -> None:
    """Registers the journal gauges, read from ``watcher`` at each collection."""

    def degraded(options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(n, {"reason": reason}) for reason, n in sorted(watcher.degraded.items())]

    meter.create_observable_counter(
        "sandboxd_snapshot_journal_walks_total",
        callbacks=[degraded],
        description="Change journals that fell back to walking their workspace, by reason.",
    )
    meter.create_observable_gauge(
        "sandboxd_snapshot_journal_watches",
        callbacks=[lambda options: [Observation(watcher.watches)]],
        description=f"inotify watches held for snapshots (budget {watcher.budget.watches_total}).",
    )
    meter.create_observable_gauge(
        "sandboxd_snapshot_journal_instances",
        callbacks=[lambda options: [Observation(watcher.instances)]],
        description=f"inotify instances held for snapshots (budget {watcher.budget.instances}).",
    )
