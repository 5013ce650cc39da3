"""The soak script itself, bounded to half a minute in CI: a server of its own,
rollouts churning through acquire, exec, files, snapshots and release, then
zero errors, zero leaked containers and the server sampled throughout. The
full ten-minute run is benchmarks/soak.py (result committed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import soak

pytestmark = [pytest.mark.docker, pytest.mark.timeout(240)]


def test_short_soak_runs_clean(tmp_path: Path, image: str, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "soak.json"
    code = soak.main(
        ["--minutes", "0.5", "--concurrency", "8", "--image", image, "--output", str(out), "--no-plot"]
    )
    result = json.loads(out.read_text())
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["errors"] == result["errors"] == 0, result["error_samples"]
    assert result["leaked"] == 0
    assert result["episodes"]["completed"] > 8 and result["episodes"]["failed"] == 0
    assert result["stopped_by"] == "max_seconds"
    assert len(result["process_samples"]) >= 4
    assert result["memory"]["flat"] is not None
    assert code == (0 if result["goals_met"] else 1)
