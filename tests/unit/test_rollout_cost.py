"""The dollar arithmetic of the rollout figures, the [cost] settings'
validation, and the stage distributions of rollout lifecycles (pure)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from sandboxd.core.rollouts.cost import WindowFlow, cost_figures
from sandboxd.core.rollouts.timeline import (
    STAGE_NAMES,
    Milestones,
    SandboxFacts,
    StageSamples,
    percentile,
    stage_spans,
)
from sandboxd.cost_settings import CostSettings
from sandboxd.errors import InvalidArgument
from sandboxd.settings import load_settings

pytestmark = pytest.mark.timeout(10)


def flow(**kw: Any) -> WindowFlow:
    base: dict[str, Any] = dict(
        trainer_idle_seconds=0.0, trainer_busy_seconds=0.0, steps=0, rollouts=0, sandbox_usd=0.0, tokens=0
    )
    base.update(kw)
    return WindowFlow(**base)


def test_defaults_are_an_h200_and_on_demand_container_prices() -> None:
    c = CostSettings()
    assert c.gpu_hour_usd == 1.59 and c.trainer_gpus == 8
    assert c.trainer_usd_per_second == pytest.approx(8 * 1.59 / 3600)
    assert load_settings().cost == c


def test_sandbox_dollars_are_reservation_times_time() -> None:
    c = CostSettings(sandbox_cpu_hour_usd=0.04, sandbox_gb_hour_usd=0.005)
    # 2 cores and 4 GiB for half an hour: 0.5 * (2 * 0.04 + 4 * 0.005)
    assert c.sandbox_usd(2.0, 4 << 30, 1800.0) == pytest.approx(0.05)
    assert c.sandbox_usd(2.0, 4 << 30, -5.0) == 0.0


def test_trainer_idle_dollars_per_step_and_per_hour() -> None:
    c = CostSettings(gpu_hour_usd=3.6, trainer_gpus=2)  # $0.002 a second for the trainer
    f = cost_figures(c, flow(trainer_idle_seconds=30.0, trainer_busy_seconds=90.0, steps=3), 0.0)
    assert f.window_trainer_idle_usd == pytest.approx(0.06)
    assert f.trainer_idle_usd_per_step == pytest.approx(0.02)
    # idle a quarter of the time: a quarter of $7.20 an hour
    assert f.trainer_idle_usd_per_hour == pytest.approx(1.8)


def test_sandbox_dollars_per_rollout_step_and_mtok() -> None:
    c = CostSettings(gpu_hour_usd=3.6, trainer_gpus=1)  # $0.001 a second
    f = cost_figures(
        c,
        flow(
            trainer_idle_seconds=10.0,
            trainer_busy_seconds=90.0,
            steps=4,
            rollouts=32,
            sandbox_usd=0.8,
            tokens=2_000_000,
        ),
        5.0,
    )
    assert f.sandbox_usd_per_rollout == pytest.approx(0.025)
    assert f.sandbox_usd_per_step == pytest.approx(0.2)
    assert f.sandbox_usd_per_mtok == pytest.approx(0.4)
    assert f.trainer_idle_usd_per_mtok == pytest.approx(0.005)
    # trainer 100 s at $0.001 plus $0.8 of sandboxes, over 2 Mtok
    assert f.usd_per_mtok == pytest.approx(0.45)
    assert f.sandbox_usd_total == 5.0 and f.prices is c


def test_nothing_counted_gives_zero_not_a_division_error() -> None:
    f = cost_figures(CostSettings(), flow(trainer_idle_seconds=5.0), 0.0)
    assert f.trainer_idle_usd_per_step == 0.0 and f.sandbox_usd_per_rollout == 0.0
    assert f.usd_per_mtok == 0.0 and f.trainer_idle_usd_per_hour == pytest.approx(8 * 1.59)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("gpu_hour_usd", -1.0),
        ("gpu_hour_usd", math.nan),
        ("gpu_hour_usd", math.inf),
        ("gpu_hour_usd", "cheap"),
        ("sandbox_cpu_hour_usd", -0.01),
        ("sandbox_gb_hour_usd", True),
        ("trainer_gpus", -1),
        ("trainer_gpus", 1.5),
        ("bogus", 1),
    ],
)
def test_bad_cost_settings_are_named(key: str, value: object) -> None:
    with pytest.raises(InvalidArgument) as e:
        load_settings(overrides={f"cost.{key}": value})
    assert e.value.field == f"cost.{key}"


def test_cost_settings_from_toml(tmp_path: Any) -> None:
    path = tmp_path / "s.toml"
    path.write_text("[cost]\ngpu_hour_usd = 2.5\ntrainer_gpus = 16\n")
    c = load_settings(path).cost
    assert (c.gpu_hour_usd, c.trainer_gpus) == (2.5, 16)
    assert c.sandbox_cpu_hour_usd == CostSettings().sandbox_cpu_hour_usd


def test_stages_follow_the_milestones_and_skip_what_did_not_happen() -> None:
    m = Milestones(queued=10, granted=12, acquire_requested=12.5, ready=14, first_command=14.2,
                   submit_called=20, verifier_start=20.1, verifier_end=21, submitted=21.05,
                   delivered=30, consumed=33)  # fmt: skip
    got = {name: round(b - a, 3) for name, a, b in stage_spans(m)}
    assert got == {
        "slot_wait": 2.0, "to_acquire": 0.5, "acquire": 1.5, "to_first_command": 0.2, "rollout": 5.8,
        "verifier": 0.9, "scoring": 0.05, "queue_wait": 8.95, "training": 3.0,
    }  # fmt: skip
    # No first command, no verifier, dropped at submit: rollout runs from ready, scoring from the submit.
    m = Milestones(queued=1, granted=1, acquire_requested=2, ready=3, submit_called=9, submitted=9.5)
    got = {name: round(b - a, 3) for name, a, b in stage_spans(m)}
    assert got == {"slot_wait": 0.0, "to_acquire": 1.0, "acquire": 1.0, "rollout": 6.0, "scoring": 0.5}
    # A sandbox acquired before the slot: to_acquire would be negative and is left out.
    assert "to_acquire" not in {n for n, _, _ in stage_spans(Milestones(granted=5, acquire_requested=4))}


def test_percentiles_nearest_rank() -> None:
    values = sorted(float(i) for i in range(1, 101))
    assert (percentile(values, 0.5), percentile(values, 0.9), percentile(values, 0.99)) == (50.0, 90.0, 99.0)
    assert percentile([], 0.5) == 0.0 and percentile([7.0], 0.99) == 7.0


def test_distributions_shares_and_bottleneck() -> None:
    s = StageSamples()
    for i in range(10):
        # acquire grows 1..10 s; the rollout itself is always 2 s.
        t = 100.0  # wall-clock moments; 0 means "did not happen"
        s.add(Milestones(queued=t, granted=t, acquire_requested=t, ready=t + 1 + i, submit_called=t + 3 + i,
                         submitted=t + 3 + i, delivered=t + 3 + i, consumed=t + 4 + i))  # fmt: skip
    f = s.figures()
    by = {d.stage: d for d in f.stages}
    assert [d.stage for d in f.stages] == list(STAGE_NAMES)
    assert by["acquire"].count == 10 and by["acquire"].p50 == 5.0 and by["acquire"].p90 == 9.0
    assert by["acquire"].p99 == 10.0 and by["acquire"].max == 10.0 and by["acquire"].mean == 5.5
    assert by["rollout"].mean == 2.0 and by["verifier"].count == 0
    assert f.bottleneck == "acquire" and f.traces == 10
    assert sum(d.share for d in f.stages) == pytest.approx(1.0)


def test_warm_cold_and_pulled_sandboxes_are_counted() -> None:
    s = StageSamples()
    base: dict[str, Any] = dict(lease_id="ls-1", created_at=1.0, leased_at=6.0, cpu_cores=1.0, memory_bytes=1)
    s.add_sandbox(SandboxFacts("sb-w", requested_at=5.0, ready_at=2.0, **base))
    s.add_sandbox(SandboxFacts("sb-c", requested_at=5.0, ready_at=5.5, image_pulled=True, **base))
    s.add_sandbox(SandboxFacts("sb-adopted", requested_at=0.0, ready_at=2.0, **base))
    f = s.figures()
    assert (f.warm_sandboxes, f.cold_sandboxes, f.image_pulls) == (1, 1, 1)
    assert f.bottleneck == "" and f.traces == 0
