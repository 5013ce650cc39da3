"""Integration tier: the real server in-process on port 0 against the real
Docker engine and the default sandbox image."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import docker
import pytest

from sandboxd.app import App, build_app
from sandboxd.backends.base import GVISOR, LABEL_INSTANCE, RUNC, RUNTIMES
from sandboxd.client import AsyncClient
from sandboxd.settings import Settings, load_settings

pytestmark = pytest.mark.docker


@pytest.fixture(scope="session")
def image() -> str:
    from sandboxd.images.build import ensure_default_image

    return ensure_default_image(log=lambda _: None)


@pytest.fixture(scope="session")
def engine() -> docker.DockerClient:
    client = docker.from_env()
    client.ping()
    return client


def gvisor_registered(engine: docker.DockerClient) -> bool:
    """Whether the engine has gVisor's runtime under the name the server's settings default to."""
    from sandboxd.settings import DockerBackendSettings

    return DockerBackendSettings().gvisor_runtime in (engine.info().get("Runtimes") or {})


@pytest.fixture
def runtime() -> str:
    """The runtime of the ``pool`` fixture's pool; a module that runs under
    every runtime overrides it with ``each_runtime``."""
    return RUNC


NO_GVISOR = "gVisor's runtime (runsc) is not registered with the engine (scripts/setup.sh test does it)"


@pytest.fixture(params=RUNTIMES)
def each_runtime(request: pytest.FixtureRequest, engine: docker.DockerClient) -> str:
    """Each runtime in turn; gVisor is skipped where the engine lacks it."""
    name = str(request.param)
    if name == GVISOR and not gvisor_registered(engine):
        pytest.skip(
            "gVisor's runtime (runsc) is not registered with the engine (scripts/setup.sh test does it)"
        )
    return name


def instance_containers(engine: docker.DockerClient, instance: str) -> list[Any]:
    # Listing inspects each container; one removed in between is simply gone.
    for _ in range(5):
        try:
            return list(engine.containers.list(all=True, filters={"label": f"{LABEL_INSTANCE}={instance}"}))
        except docker.errors.NotFound:
            continue
    return list(engine.containers.list(all=True, filters={"label": f"{LABEL_INSTANCE}={instance}"}))


async def poll(
    predicate: Callable[[], Awaitable[bool] | bool], timeout: float = 30.0, what: str = ""
) -> None:
    """Polls until ``predicate`` holds, failing after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value) or isinstance(value, asyncio.Future):
            value = await value
        if value:
            return
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        await asyncio.sleep(0.05)  # the poll interval of this deadline-bounded helper


def make_settings(tmp_path: Path, **overrides: Any) -> Settings:
    base: dict[str, Any] = {
        "instance_id": "it-" + secrets.token_hex(4),
        "state_dir": str(tmp_path / "state"),
        "server.port": 0,
        "leases.reap_interval_seconds": 0.1,
        "leases.orphan_sweep_seconds": 1.0,
    }
    base.update(overrides)
    return load_settings(None, base)


@contextlib.asynccontextmanager
async def running_app(settings: Settings, engine: docker.DockerClient) -> AsyncIterator[App]:
    """A started server; at the end, stopped and checked to have left no
    container behind (tests release what they lease)."""
    app = build_app(settings)
    await app.start()
    try:
        yield app
    finally:
        await app.stop(grace=1)
        left = await asyncio.to_thread(instance_containers, engine, settings.instance_id)
        for c in left:
            with contextlib.suppress(docker.errors.NotFound):
                await asyncio.to_thread(c.remove, force=True)
        assert not left, f"leaked containers: {[c.name for c in left]}"


@pytest.fixture
async def app(tmp_path: Path, engine: docker.DockerClient, image: str) -> AsyncIterator[App]:
    async with running_app(make_settings(tmp_path), engine) as app:
        yield app


@pytest.fixture
async def client(app: App) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(app.address) as c:
        yield c


@pytest.fixture
async def pool(client: AsyncClient, image: str, runtime: str) -> str:
    await client.create_pool("it", image, min_ready=2, max_size=8, runtime=runtime)
    return "it"
