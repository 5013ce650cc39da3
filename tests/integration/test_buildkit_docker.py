"""Builds on the real engine's BuildKit through the image cache: syntax only
BuildKit knows (a cache mount kept between builds, ``COPY --chmod``, a
heredoc through the locally built Dockerfile frontend) gives the image it
says; a failing RUN names its step and output; a base only on the engine
builds with no registry; logs arrive while the build runs; a base in a
registry behind basic auth builds with the Docker config's credentials; the
classic builder, for an engine without BuildKit, still builds."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import secrets
import tarfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import docker
import pytest

from sandboxd.backends.base import BuildSpec
from sandboxd.backends.docker.backend import DockerBackend
from sandboxd.backends.docker.builds import CLASSIC, Builder, EngineBuild, context_tar
from sandboxd.backends.docker.containers import DockerOptions
from sandboxd.clock import SystemClock
from sandboxd.core.images import ImageCache
from sandboxd.errors import BuildFailed
from tests.image_settings import image_settings
from tests.registry import Registry, run_registry

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

PREFIX = "sandboxd-bktest"


@pytest.fixture(scope="module")
def frontend() -> str:
    """The Dockerfile frontend image (syntax 1.4), built once from its Go module (setup builds it too)."""
    from sandboxd.images.dockerfile_frontend import ensure_frontend_image

    return ensure_frontend_image(log=lambda _: None)


@pytest.fixture(scope="module")
def built(engine: docker.DockerClient) -> Iterator[list[str]]:
    """Tags and ids the tests made; removed at the end."""
    refs: list[str] = []
    yield refs
    for ref in reversed(refs):
        with contextlib.suppress(docker.errors.ImageNotFound, docker.errors.APIError):
            engine.images.remove(ref, force=True)


@pytest.fixture
async def backend() -> AsyncIterator[DockerBackend]:
    b = DockerBackend(DockerOptions(instance=f"bktest-{secrets.token_hex(3)}"))
    yield b
    await b.close()


@contextlib.asynccontextmanager
async def image_cache(backend: DockerBackend, **kw: object) -> AsyncIterator[ImageCache]:
    cache = ImageCache(backend, SystemClock(), image_settings(**kw))
    await cache.start()
    try:
        yield cache
    finally:
        await cache.stop()


def recipe(tmp_path: Path, dockerfile: str, files: dict[str, str] | None = None) -> Path:
    context = tmp_path / f"ctx-{secrets.token_hex(3)}"
    context.mkdir()
    (context / "Dockerfile").write_text(dockerfile)
    for name, text in (files or {}).items():
        (context / name).write_text(text)
    return context


def run(engine: docker.DockerClient, tag: str, script: str) -> str:
    out: bytes = engine.containers.run(
        tag, ["sh", "-c", script], user="root", network_mode="none", remove=True
    )
    return out.decode()


async def test_buildkit_only_syntax_builds_the_image_it_says(
    engine: docker.DockerClient,
    backend: DockerBackend,
    image: str,
    frontend: str,
    built: list[str],
    tmp_path: Path,
) -> None:
    cache_id = f"{PREFIX}-{secrets.token_hex(4)}"
    dockerfile = (
        f"FROM {image}\n"
        "USER root\n"
        "ARG ROUND\n"
        f"RUN --mount=type=cache,id={cache_id},target=/cache "
        'echo "$ROUND" >> /cache/rounds && wc -l < /cache/rounds > /rounds\n'
        "COPY --chmod=0755 tool.sh /usr/local/bin/tool\n"
        "RUN <<EOF\n"
        "set -e\n"
        "echo 'written by a heredoc' > /heredoc\n"
        "EOF\n"
    )
    context = recipe(tmp_path, dockerfile, {"tool.sh": "#!/bin/sh\necho tool ran\n"})
    (context / "tool.sh").chmod(0o600)
    async with image_cache(backend, dockerfile_frontend=frontend) as cache:
        lines: list[str] = []
        first = await cache.build(context, build_args={"ROUND": "1"}, on_log=lines.append)
        built.append(first)
        second = await cache.build(context, build_args={"ROUND": "2"})
        built.append(second)
    assert lines[0].startswith("builder: BuildKit")
    assert any("RUN <<EOF" in line for line in lines)
    assert any(line.startswith("#") and " DONE " in line for line in lines)
    assert run(engine, first, "cat /rounds") == "1\n"
    # The second build's RUN found the cache mount the first one filled.
    out = run(engine, second, "cat /rounds; stat -c %a /usr/local/bin/tool; cat /heredoc; tool")
    assert out.splitlines() == ["2", "755", "written by a heredoc", "tool ran"]


async def test_a_failing_run_names_its_step_and_its_output(
    engine: docker.DockerClient, backend: DockerBackend, image: str, tmp_path: Path
) -> None:
    step = "RUN echo compiling && echo 'fatal: no Makefile' >&2 && exit 7"
    context = recipe(tmp_path, f"FROM {image}\nRUN true\n{step}\n")
    async with image_cache(backend) as cache:
        lines: list[str] = []
        with pytest.raises(BuildFailed) as caught:
            await cache.build(context, repository=f"{PREFIX}-fail", on_log=lines.append)
    failed = caught.value
    assert failed.step == step
    assert "exit code: 7" in failed.message and step in failed.message
    # stdout and stderr come as two streams: their order between them is not kept.
    assert sorted(failed.log_tail.splitlines()) == ["compiling", "fatal: no Makefile"]
    assert any(" ERROR: " in line and "exit code: 7" in line for line in lines)


async def test_a_dockerfile_syntax_error_names_its_line(
    backend: DockerBackend, image: str, tmp_path: Path
) -> None:
    context = recipe(tmp_path, f"FROM {image}\nCOPY --no-such-flag a /a\n", {"a": "x"})
    async with image_cache(backend) as cache:
        with pytest.raises(BuildFailed) as caught:
            await cache.build(context, repository=f"{PREFIX}-fail")
    assert caught.value.step == "COPY --no-such-flag a /a"


async def test_a_base_only_on_the_engine_builds_offline_once(
    engine: docker.DockerClient, backend: DockerBackend, image: str, built: list[str], tmp_path: Path
) -> None:
    # A name no registry serves: BuildKit must take it from the engine.
    local = f"{PREFIX}-only-here/base:{secrets.token_hex(3)}"
    engine.images.get(image).tag(local)
    built.append(local)
    context = recipe(tmp_path, f"FROM {local}\nCOPY task.txt /task.txt\n", {"task.txt": "checkout\n"})
    async with image_cache(backend) as cache:
        lines: list[str] = []
        tag = await cache.build(context, repository=f"{PREFIX}-offline", on_log=lines.append)
        built.append(tag)
        assert any("COPY task.txt /task.txt" in line for line in lines)
        again: list[str] = []
        assert await cache.build(context, repository=f"{PREFIX}-offline", on_log=again.append) == tag
        assert again == []  # found by the recipe's hash: no build ran
    assert run(engine, tag, "cat /task.txt") == "checkout\n"


async def test_log_lines_arrive_while_the_build_runs(
    backend: DockerBackend, image: str, built: list[str], tmp_path: Path
) -> None:
    # The step prints, then runs long enough to look at the log in the
    # meantime; the build is cancelled once the line came.
    marker = secrets.token_hex(4)
    context = recipe(tmp_path, f"FROM {image}\nRUN echo started-{marker} && sleep 120\n")
    async with image_cache(backend) as cache:
        arrived = asyncio.Event()

        def on_log(line: str) -> None:
            if line.endswith(f"started-{marker}"):
                arrived.set()

        task = asyncio.create_task(cache.build(context, repository=f"{PREFIX}-stream", on_log=on_log))
        await asyncio.wait_for(arrived.wait(), timeout=60)
        assert not task.done()  # the line came from a build still running
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def publish_payload(engine: docker.DockerClient, registry: Registry, name: str) -> str:
    """A one-file image pushed to ``registry`` as ``name`` and removed from the engine."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for arcname, data in (
            ("Dockerfile", b"FROM scratch\nCOPY payload /payload\n"),
            ("payload", b"private\n"),
        ):
            info = tarfile.TarInfo(arcname)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    made, _ = engine.images.build(fileobj=buf, custom_context=True, rm=True)
    reference = registry.reference(name)
    repo, tag = reference.rsplit(":", 1)
    made.tag(repo, tag)
    auth = {"username": registry.username, "password": registry.password}
    for event in engine.api.push(repo, tag, stream=True, decode=True, auth_config=auth):
        assert "error" not in event, event
    engine.images.remove(reference, force=True)
    with contextlib.suppress(docker.errors.ImageNotFound, docker.errors.APIError):
        engine.images.remove(made.id, force=True)
    return reference


async def test_a_base_behind_basic_auth_builds_with_the_docker_config(
    engine: docker.DockerClient,
    backend: DockerBackend,
    image: str,
    built: list[str],
    tmp_path: Path,
) -> None:
    with run_registry(tmp_path / "registry", username="rl", password="s3cret-pw") as registry:
        private = publish_payload(engine, registry, f"private-base:{secrets.token_hex(3)}")
        context = recipe(
            tmp_path, f"FROM {private} AS files\nFROM {image}\nCOPY --from=files /payload /payload\n"
        )
        async with image_cache(backend) as anonymous:
            with pytest.raises(BuildFailed) as caught:
                await anonymous.build(context, repository=f"{PREFIX}-private")
        assert "credentials" in caught.value.message
        config = tmp_path / "docker-config"
        config.mkdir()
        token = base64.b64encode(b"rl:s3cret-pw").decode()
        (config / "config.json").write_text(json.dumps({"auths": {registry.address: {"auth": token}}}))
        async with image_cache(backend, docker_config=str(config)) as cache:
            lines: list[str] = []
            tag = await cache.build(context, repository=f"{PREFIX}-private", on_log=lines.append)
            built += [tag, private]
    assert any(f"pulling base {private}" in line for line in lines)
    assert run(engine, tag, "cat /payload") == "private\n"


def test_the_classic_builder_still_builds_and_names_its_failing_step(
    engine: docker.DockerClient, image: str, built: list[str], tmp_path: Path
) -> None:
    # What an engine without BuildKit gets (it cannot be turned off here
    # without restarting the engine): the same request on builder version 1.
    tag = f"{PREFIX}-classic:{secrets.token_hex(3)}"
    classic = Builder(CLASSIC, "asked for by the test")
    context = recipe(tmp_path, f"FROM {image}\nCOPY a /a\n", {"a": "x"})
    spec = BuildSpec(context, tag, labels={"sandboxd.test": "1"})
    lines = list(EngineBuild(engine.api, spec, classic, context_tar(spec)).lines())
    built.append(tag)
    assert any(line.startswith("Step 2/") and line.endswith(" : COPY a /a") for line in lines)
    assert engine.images.get(tag).labels["sandboxd.test"] == "1"
    failing = recipe(tmp_path, f"FROM {image}\nRUN echo oops && exit 5\n")
    spec = BuildSpec(failing, f"{tag}-failing")
    with pytest.raises(BuildFailed) as caught:
        list(EngineBuild(engine.api, spec, classic, context_tar(spec)).lines())
    assert caught.value.step == "RUN echo oops && exit 5"
    assert "oops" in caught.value.log_tail
