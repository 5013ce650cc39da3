"""``sandboxd image build --context``: a recipe built through the image
cache (fake backend here), the tag on stdout, a failure naming its step."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandboxd.cli import main


def _config(tmp_path: Path) -> Path:
    config = tmp_path / "sandboxd.toml"
    config.write_text(f'state_dir = "{tmp_path / "state"}"\n[backend]\nkind = "fake"\n')
    return config


def test_builds_a_recipe_and_prints_its_tag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    context = tmp_path / "recipe"
    context.mkdir()
    (context / "Dockerfile").write_text("FROM base\nRUN make\n")
    argv = ["image", "build", "--context", str(context), "--config", str(_config(tmp_path))]
    assert main([*argv, "--build-arg", "A=1"]) == 0
    out = capsys.readouterr()
    assert out.out.strip().startswith("sandboxd-build:")
    assert "RUN make" in out.err
    (context / "Dockerfile").write_text("FROM base\nRUN false\n")
    assert main(argv) == 1
    assert "RUN false" in capsys.readouterr().err
    assert main([*argv, "--build-arg", "nope"]) == 1
    assert "KEY=VALUE" in capsys.readouterr().err
