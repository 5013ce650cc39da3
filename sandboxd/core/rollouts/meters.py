"""The rollout queue's throughput figures as OpenTelemetry gauges, observed
at each collection, one series per run (a bounded label: runs are few)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from sandboxd.core.rollouts.cost import CostFigures
from sandboxd.core.rollouts.figures import Figures
from sandboxd.core.rollouts.service import RolloutManager

GAUGES: dict[str, tuple[str, Callable[[Figures], float]]] = {
    "sandboxd_rollout_production_rate_per_second": (
        "R_p: completed samples per second",
        lambda f: f.production_rate,
    ),
    "sandboxd_rollout_keep_rate": ("k: admitted / completed groups", lambda f: f.keep_rate),
    "sandboxd_rollout_effective_rate_per_second": ("R_eff = k * R_p", lambda f: f.effective_rate),
    "sandboxd_rollout_consumption_rate_per_second": (
        "R_c: samples trained per busy second",
        lambda f: f.consumption_rate,
    ),
    "sandboxd_rollout_trainer_idle_ratio": (
        "time the trainer waited for a batch",
        lambda f: f.trainer_idle_ratio,
    ),
    "sandboxd_rollout_generator_idle_ratio": (
        "time generators waited for a slot",
        lambda f: f.generator_idle_ratio,
    ),
    "sandboxd_rollout_queue_depth_groups": ("admitted groups not yet delivered", lambda f: f.queue_depth),
    "sandboxd_rollout_in_flight_groups": ("groups running", lambda f: f.in_flight),
    "sandboxd_rollout_parked_trajectories": ("partial rollouts parked", lambda f: f.parked),
    "sandboxd_rollout_unacked_batches": (
        "batches delivered, not yet acknowledged",
        lambda f: f.unacked_batches,
    ),
    "sandboxd_rollout_policy_version": ("trainer's current policy version", lambda f: f.policy_version),
    "sandboxd_rollout_target_concurrency_groups": (
        "the controller's concurrency",
        lambda f: f.target_concurrency,
    ),
    "sandboxd_rollout_staleness_max_versions": (
        "max trajectory staleness",
        lambda f: f.staleness_trajectory.max,
    ),
    "sandboxd_rollout_infra_failures_masked_total": (
        "infrastructure failures masked",
        lambda f: f.infra_failures_masked,
    ),
}


COST_GAUGES: dict[str, tuple[str, Callable[[CostFigures], float]]] = {
    "sandboxd_rollout_trainer_idle_usd_per_hour": (
        "the trainer's idle share times its GPUs' hourly price ([cost])",
        lambda c: c.trainer_idle_usd_per_hour,
    ),
    "sandboxd_rollout_sandbox_usd_total": (
        "rollout sandboxes' CPU and memory reservation, priced, since the run was configured",
        lambda c: c.sandbox_usd_total,
    ),
}


def register_rollout_gauges(meter: Meter, manager: RolloutManager) -> None:
    """Registers the rollout gauges, one series per run, read from its figures at each collection."""

    def observe(read: Callable[[Figures], float]) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def callback(options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(read(run.queue.figures()), {"run": key}) for key, run in manager.runs.items()]

        return callback

    for name, (description, read) in GAUGES.items():
        meter.create_observable_gauge(name, callbacks=[observe(read)], description=description)

    def filtered(options: CallbackOptions) -> Iterable[Observation]:
        out = []
        for key, run in manager.runs.items():
            for reason, count in run.queue.figures().filtered.items():
                out.append(Observation(count, {"run": key, "reason": reason}))
        return out

    def dollars(read: Callable[[CostFigures], float]) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def callback(options: CallbackOptions) -> Iterable[Observation]:
            return [
                Observation(read(manager.lifecycle(run).cost(run.queue.figures())), {"run": key})
                for key, run in manager.runs.items()
            ]

        return callback

    for name, (description, read_cost) in COST_GAUGES.items():
        meter.create_observable_gauge(
            name, callbacks=[dollars(read_cost)], description=description, unit="USD"
        )

    meter.create_observable_gauge(
        "sandboxd_rollout_filtered_groups_total",
        callbacks=[filtered],
        description="groups filtered, by reason",
    )
