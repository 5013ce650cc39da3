"""The scale benchmark's quick mode on the real engine: each driver on a
throwaway dockerd of its own, the result's keys, no hung request, no orphan,
and nothing of either engine left on the host."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from benchmarks.scale import cli
from benchmarks.scale.engine import DATA_BASE, RUN_BASE

pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(os.geteuid() != 0, reason="the benchmark starts dockerds of its own (root)"),
]


def _engines_left() -> list[str]:
    return [p.name for base in (DATA_BASE, RUN_BASE) if base.is_dir() for p in base.iterdir()]


@pytest.mark.timeout(600)
def test_quick_scene_ends_typed_and_clean(
    tmp_path: Path, image: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before = set(_engines_left())
    out = tmp_path / "scale.json"
    code = cli.main(["--quick", "--rollouts", "16", "--image", image, "--output", str(out), "--no-plot"])
    report: dict[str, Any] = json.loads(out.read_text())
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == report
    assert set(cli.KEYS) <= set(report)
    assert report["hung"] == 0, report["sandboxd"]["reasons"]
    assert report["orphans"] == 0
    assert report["admitted"] + report["refused"] == 16
    assert report["sandboxd"]["completed"] == report["admitted"]
    assert report["sandboxd"]["left_leased"] == 0
    assert report["naive"]["stopped_by"] == "completed"
    assert code == 0
    assert set(_engines_left()) <= before  # both engines killed and removed
