"""A short load-harness run against the real engine: all three drivers
(sandboxd, the naive baseline, the floor of plain host processes), a few
rollouts, a few seconds; zero errors and zero leaked containers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.load import cli

pytestmark = pytest.mark.docker


@pytest.mark.timeout(360)
def test_all_drivers_run_clean(tmp_path: Path, image: str, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "smoke.json"
    code = cli.main(
        [
            "--profile", "burst", "--quick", "--rollouts", "4", "--max-seconds", "60",
            "--image", image, "--output", str(out), "--no-progress", "--no-plots",
        ]
    )  # fmt: skip
    report: dict[str, Any] = json.loads(out.read_text())
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == report
    assert report["errors"] == 0, {d: r.get("error_samples") for d, r in report["drivers"].items()}
    assert report["leaked"] == 0
    for name in ("sandboxd", "baseline", "floor"):
        driver = report["drivers"][name]
        assert driver["episodes"]["completed"] == 4, driver
        assert driver["stopped_by"] == "completed"
        assert driver["latency_ms"]["exec"]["n"] > 0
    assert report["sandboxd_step_s"] and report["baseline_step_s"] and report["floor_step_s"]
    assert report["sandboxd_over_floor"] == round(report["sandboxd_step_s"] / report["floor_step_s"], 3)
    assert code in (0, 1)  # the speedup and floor goals are not asserted on 4 rollouts
