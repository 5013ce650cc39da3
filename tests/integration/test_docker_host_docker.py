"""The engine address comes from DOCKER_HOST when [backend] base_url is
unset, as for every Docker tool: the real socket works, a bogus one fails
with an error naming it."""

from __future__ import annotations

import argparse
import re
import secrets
from pathlib import Path

import docker
import pytest

from sandboxd.app import make_backend
from sandboxd.cli import _settings
from sandboxd.client import AsyncClient
from sandboxd.errors import TransientBackendError
from sandboxd.settings import DockerBackendSettings, Settings
from tests.integration.conftest import running_app

pytestmark = [pytest.mark.docker, pytest.mark.timeout(120)]

SOCKET = "unix:///var/run/docker.sock"


def entry_point_settings(tmp_path: Path) -> Settings:
    """Settings as ``sandboxd serve`` builds them: no config file, no base_url."""
    args = argparse.Namespace(
        config=None, port=0, instance="it-" + secrets.token_hex(4), state_dir=tmp_path / "state"
    )
    return _settings(args)


async def test_docker_host_names_the_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine: docker.DockerClient, image: str
) -> None:
    monkeypatch.setenv("DOCKER_HOST", SOCKET)
    settings = entry_point_settings(tmp_path)
    assert isinstance(settings.backend, DockerBackendSettings)
    assert settings.backend.base_url == SOCKET
    async with running_app(settings, engine) as app, AsyncClient(app.address) as client:
        await client.create_pool("dh", image, min_ready=0, max_size=1)
        async with client.acquire("dh", timeout=60) as sb:
            assert (await sb.exec("echo engine")).text == "engine\n"
        await client.delete_pool("dh", force=True)


async def test_a_bogus_docker_host_is_honoured_and_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bogus = f"unix://{tmp_path}/no-engine.sock"
    monkeypatch.setenv("DOCKER_HOST", bogus)
    settings = entry_point_settings(tmp_path)

    async def start() -> None:
        backend = make_backend(settings)
        try:
            await backend.ping()
        finally:
            await backend.close()

    with pytest.raises(TransientBackendError, match=re.escape(f"Docker engine unreachable at {bogus}")):
        await start()
