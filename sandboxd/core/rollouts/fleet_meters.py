"""The shared fleet's figures as OpenTelemetry gauges: per run (one series
per run, a bounded label) and for the fleet as a whole."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from sandboxd.core.rollouts.fleet import Fleet, FleetFigures
from sandboxd.core.rollouts.sharing import Share

RUN_GAUGES: dict[str, tuple[str, Callable[[Share], float]]] = {
    "sandboxd_fleet_guaranteed_sandboxes": ("the run's weighted share of the fleet", lambda s: s.guaranteed),
    "sandboxd_fleet_allowed_sandboxes": (
        "what the run may hold: entitlement plus borrowing",
        lambda s: s.allowed,
    ),
    "sandboxd_fleet_held_sandboxes": ("what the run's running groups hold", lambda s: s.held),
    "sandboxd_fleet_borrowed_sandboxes": ("allowed beyond the run's guarantee", lambda s: s.borrowed),
    "sandboxd_fleet_demand_sandboxes": ("what the run would use now", lambda s: s.demand),
}

FLEET_GAUGES: dict[str, tuple[str, Callable[[FleetFigures], float]]] = {
    "sandboxd_fleet_sandboxes": ("sandboxes the runs share", lambda f: f.sandboxes),
    "sandboxd_fleet_held_total_sandboxes": ("sandboxes all runs' groups hold", lambda f: f.held),
    "sandboxd_fleet_reclaims_open": ("runs giving borrowed sandboxes back now", lambda f: f.reclaims_open),
    "sandboxd_fleet_reclaims_forced_total": (
        "reclaims that ended groups at the bound",
        lambda f: f.reclaims_forced,
    ),
    "sandboxd_fleet_reclaim_p99_seconds": (
        "p99 time to give borrowed sandboxes back",
        lambda f: f.reclaim_p99_seconds,
    ),
}


def register_fleet_gauges(meter: Meter, fleet: Fleet) -> None:
    """Registers the fleet gauges, read from the fleet's figures at each collection."""

    def per_run(read: Callable[[Share], float]) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def callback(options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(read(s), {"run": key}) for key, s in fleet.figures().shares.items()]

        return callback

    def whole(read: Callable[[FleetFigures], float]) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def callback(options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(read(fleet.figures()))]

        return callback

    for name, (description, read_share) in RUN_GAUGES.items():
        meter.create_observable_gauge(name, callbacks=[per_run(read_share)], description=description)
    for name, (description, read_fleet) in FLEET_GAUGES.items():
        meter.create_observable_gauge(name, callbacks=[whole(read_fleet)], description=description)
