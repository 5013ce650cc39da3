"""``sandboxd loop`` without --target: the CLI starts the embedded server and
hands the loop (which only speaks the client API) its address."""

from __future__ import annotations

import secrets
from pathlib import Path

import docker
import pytest

from sandboxd import cli
from tests.integration.conftest import instance_containers

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]


def test_loop_with_an_embedded_server(
    tmp_path: Path, engine: docker.DockerClient, image: str, capsys: pytest.CaptureFixture[str]
) -> None:
    instance = "it-" + secrets.token_hex(4)
    argv = ["loop", "--instance", instance, "--state-dir", str(tmp_path / "state")]
    code = cli.main([*argv, "--steps", "2", "--workers", "2", "--policy", "numpy"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "policy implementation: numpy" in out
    assert "mean reward per step: " in out
    # Stopping the embedded server destroyed its warm sandboxes.
    assert not instance_containers(engine, instance)
