"""benchmarks.acquire_exec's report of several trials: medians, goals judged on them."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.acquire_exec import combine, goals_of

pytestmark = pytest.mark.timeout(30)


def _trial(exec_per_s: float, acquire: float, floor: float, leaked: int = 0) -> dict[str, Any]:
    report: dict[str, Any] = {
        "acquire_p50_ms": acquire,
        "acquire_p99_ms": acquire * 2,
        "grpc_floor_p50_ms": floor,
        "grpc_floor_p99_ms": floor * 2,
        "exec_p50_ms": 1.0,
        "grpc_floor_1_p50_ms": 0.6,
        "exec_per_s": exec_per_s,
        "exec_layout": f"layout of {exec_per_s:g}",
        "leaked": leaked,
        "quick": False,
        "details": {"marker": exec_per_s},
    }
    report["goals"] = goals_of(report)
    return report


def test_one_trial_is_its_own_report() -> None:
    only = _trial(1000.0, 20.0, 15.0)
    assert combine([only]) is only


def test_numbers_are_medians_and_goals_are_judged_on_them() -> None:
    trials = [_trial(1500.0, 30.0, 15.0), _trial(2600.0, 17.0, 15.0, leaked=1), _trial(2700.0, 16.0, 15.0)]
    out = combine(trials)
    assert out["exec_per_s"] == 2600.0
    assert out["acquire_p50_ms"] == 17.0
    # 17 <= 1.2 x 15 and 2,600 >= 2,500: met on the medians, though one trial missed both.
    assert out["goals"]["acquire_p50_ms"]["met"] is True
    assert out["goals"]["exec_per_s"]["met"] is True
    assert out["leaked"] == 1
    # The median trial (by exec throughput) gives the details and the layout's name.
    assert out["details"]["marker"] == 2600.0
    assert out["exec_layout"] == "layout of 2600"
    assert [t["exec_per_s"] for t in out["details"]["trials"]] == [1500.0, 2600.0, 2700.0]
    assert "3 trials" in out["details"]["combined"]


def test_a_failed_trial_is_named() -> None:
    bad = _trial(100.0, 50.0, 15.0)
    bad["error"] = "TimeoutError: pool not quiet"
    out = combine([_trial(1500.0, 30.0, 15.0), bad])
    assert out["error"] == "TimeoutError: pool not quiet"
    assert out["goals_met"] is False
