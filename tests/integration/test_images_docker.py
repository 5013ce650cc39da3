"""The image cache on the real engine pulling from a real registry (Debian's
docker-registry on 127.0.0.1, one with basic auth): by tag and by digest,
one pull for many waiters, typed refusals (no such image, unreachable
registry, past the deadline), credentials from a Docker config file, and
eviction under a small budget that never removes an image in use, wanted
or not sandboxd's own."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import os
import secrets
import tarfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import docker
import pytest

from sandboxd.backends.base import PullStatus, RegistryAuth
from sandboxd.backends.docker.backend import DockerBackend
from sandboxd.backends.docker.containers import DockerOptions
from sandboxd.clock import FakeClock, SystemClock
from sandboxd.core.images import ImageCache
from sandboxd.errors import DeadlineExceeded, FailedPrecondition, Unavailable
from tests.image_settings import image_settings
from tests.registry import Registry, closed_port, run_registry

pytestmark = pytest.mark.docker

MB = 1 << 20
PREFIX = "sandboxd-imagetest"


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    with run_registry(tmp_path_factory.mktemp("registry")) as running:
        yield running


@pytest.fixture(scope="module")
def auth_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    with run_registry(
        tmp_path_factory.mktemp("auth-registry"), username="rl", password="s3cret-pw"
    ) as running:
        yield running


@pytest.fixture(scope="module")
def published(engine: docker.DockerClient) -> Iterator[list[str]]:
    """Every image id the tests built; removed at the end with whatever references them."""
    ids: list[str] = []
    yield ids
    for container in engine.containers.list(all=True, filters={"label": f"{PREFIX}=1"}):
        container.remove(force=True)
    for image_id in ids:
        with contextlib.suppress(docker.errors.ImageNotFound):
            engine.images.remove(image_id, force=True)


def publish(
    engine: docker.DockerClient, registry: Registry, name: str, size: int, ids: list[str]
) -> tuple[str, str]:
    """Builds a one-layer image of ``size`` random bytes, pushes it as
    ``name`` (repo:tag) to ``registry`` and removes it from the engine;
    returns its tag and digest references."""
    payload = os.urandom(size)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        dockerfile = b"FROM scratch\nCOPY payload /payload\n"
        for arcname, data in (("Dockerfile", dockerfile), ("payload", payload)):
            info = tarfile.TarInfo(arcname)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    image, _ = engine.images.build(fileobj=buf, custom_context=True, rm=True, labels={PREFIX: "1"})
    ids.append(image.id)
    repo, tag = registry.reference(name).rsplit(":", 1)
    image.tag(repo, tag)
    auth = {"username": registry.username, "password": registry.password} if registry.username else None
    for event in engine.api.push(repo, tag, stream=True, decode=True, auth_config=auth):
        assert "error" not in event, event
    digests = engine.images.get(image.id).attrs["RepoDigests"]
    [digest] = [d for d in digests if d.startswith(repo + "@")]
    engine.images.remove(image.id, force=True)
    return f"{repo}:{tag}", digest


class CountingBackend(DockerBackend):
    """The real backend, counting the pulls it was asked for."""

    pulls: dict[str, int]

    def pull_image(self, reference: str, auth: RegistryAuth | None) -> AsyncIterator[PullStatus]:
        self.pulls[reference] = self.pulls.get(reference, 0) + 1
        return super().pull_image(reference, auth)


@pytest.fixture
async def backend() -> AsyncIterator[CountingBackend]:
    b = CountingBackend(DockerOptions(instance=f"imgtest-{secrets.token_hex(3)}"))
    b.pulls = {}
    yield b
    await b.close()


@pytest.fixture
async def cache(backend: CountingBackend) -> AsyncIterator[ImageCache]:
    c = ImageCache(backend, SystemClock(), image_settings())
    await c.start()
    yield c
    await c.stop()


def on_engine(engine: docker.DockerClient, reference: str) -> bool:
    try:
        engine.images.get(reference)
        return True
    except docker.errors.ImageNotFound:
        return False


async def test_pull_by_tag_and_by_digest(
    engine: docker.DockerClient, registry: Registry, published: list[str], cache: ImageCache
) -> None:
    tag, digest = publish(engine, registry, "task-tag:v1", 2 * MB, published)
    assert not on_engine(engine, tag)
    await cache.ensure(tag)
    assert on_engine(engine, tag) and cache.present(tag)
    [entry] = cache.entries()
    assert entry.reference == tag and entry.size >= 2 * MB
    done = cache.progress()[0]
    assert done.state == "done"
    engine.images.remove(tag, force=True)
    await cache.ensure(digest)
    assert on_engine(engine, digest)
    assert engine.images.get(digest).id == entry.image_id


async def test_concurrent_ensures_make_one_pull(
    engine: docker.DockerClient,
    registry: Registry,
    published: list[str],
    backend: CountingBackend,
    cache: ImageCache,
) -> None:
    tag, _ = publish(engine, registry, "task-many:v1", 4 * MB, published)
    await asyncio.gather(*(cache.ensure(tag) for _ in range(12)))
    assert backend.pulls == {tag: 1}
    assert on_engine(engine, tag)


async def test_missing_image_is_failed_precondition(registry: Registry, cache: ImageCache) -> None:
    with pytest.raises(FailedPrecondition, match="no-such-task"):
        await cache.ensure(registry.reference("no-such-task:v1"))


async def test_unreachable_registry_is_unavailable_with_retry_info(cache: ImageCache) -> None:
    with pytest.raises(Unavailable) as caught:
        await cache.ensure(f"127.0.0.1:{closed_port()}/task:v1")
    assert caught.value.retry_after == cache.settings.unavailable_retry_seconds
    assert "cannot be reached" in caught.value.message


async def test_pull_past_its_deadline_names_the_pull_and_goes_on(
    engine: docker.DockerClient,
    registry: Registry,
    published: list[str],
    backend: CountingBackend,
    cache: ImageCache,
) -> None:
    tag, _ = publish(engine, registry, "task-slow:v1", 2 * MB, published)
    with registry.frozen():
        with pytest.raises(DeadlineExceeded) as caught:
            await cache.ensure(tag, deadline=SystemClock().monotonic() + 2.0)
        assert tag in caught.value.message
        assert "pull of image" in caught.value.message
    # The registry answers again: the same pull finishes for the next caller.
    await cache.ensure(tag)
    assert backend.pulls == {tag: 1}
    assert on_engine(engine, tag)


async def test_basic_auth_from_a_docker_config_file(
    engine: docker.DockerClient,
    auth_registry: Registry,
    published: list[str],
    backend: CountingBackend,
    tmp_path: Path,
) -> None:
    tag, _ = publish(engine, auth_registry, "task-private:v1", MB, published)
    anonymous = ImageCache(backend, SystemClock(), image_settings())
    await anonymous.start()
    try:
        with pytest.raises(FailedPrecondition):
            await anonymous.ensure(tag)
    finally:
        await anonymous.stop()
    token = base64.b64encode(f"{auth_registry.username}:{auth_registry.password}".encode()).decode()
    (tmp_path / "config.json").write_text(json.dumps({"auths": {auth_registry.address: {"auth": token}}}))
    cache = ImageCache(backend, SystemClock(), image_settings(docker_config=str(tmp_path)))
    await cache.start()
    try:
        await cache.ensure(tag)
        assert on_engine(engine, tag)
    finally:
        await cache.stop()


async def test_eviction_under_a_small_budget_spares_used_wanted_and_foreign_images(
    engine: docker.DockerClient,
    registry: Registry,
    published: list[str],
    backend: CountingBackend,
) -> None:
    refs = [publish(engine, registry, f"task-evict-{n}:v1", 3 * MB, published)[0] for n in range(4)]
    used, wanted, old, new = refs
    foreign, _ = publish(engine, registry, "someone-elses:v1", 3 * MB, published)
    engine.images.pull(*foreign.rsplit(":", 1))  # pulled by someone else, not the cache
    clock = FakeClock()
    cache = ImageCache(backend, clock, image_settings(cache_bytes=7 * MB))
    await cache.start()
    try:
        await cache.ensure(old)
        clock.advance(300)
        await cache.ensure(used)
        # A sandbox of it: a container the engine knows, and the cache told.
        engine.containers.create(used, command=["/payload"], labels={PREFIX: "1"})
        cache.use(used)
        clock.advance(300)
        cache.want("queue", {wanted: 1})
        await cache.ensure(wanted)
        clock.advance(300)
        await cache.ensure(new)
        clock.advance(300)
        await cache.enforce_budget()
        # 12 MB of sandboxd's own over a 7 MB budget: the least recently
        # used of the unused, unwanted ones go (old, then new) until the
        # rest (used, wanted: 6 MB) fits.
        assert not on_engine(engine, old) and not on_engine(engine, new)
        assert on_engine(engine, used) and on_engine(engine, wanted)
        assert on_engine(engine, foreign)
        assert cache.gauges()["cache_bytes"] <= 7 * MB
        assert {e.reference for e in cache.entries()} == {used, wanted}
    finally:
        await cache.stop()


async def test_builds_offline_cached_by_hash_with_the_failing_step_named(
    engine: docker.DockerClient,
    registry: Registry,
    published: list[str],
    backend: CountingBackend,
    image: str,
    tmp_path: Path,
) -> None:
    from sandboxd.errors import BuildFailed

    base, _ = publish(engine, registry, "build-base:v1", MB, published)
    context = tmp_path / "recipe"
    context.mkdir()
    (context / "task.txt").write_text("repository checkout\n")
    # One base only in the local registry, one only on the engine: nothing
    # comes from the internet. (BuildKit skips a stage nothing uses: this one is used.)
    (context / "Dockerfile").write_text(
        f"FROM {base} AS files\nFROM {image}\n"
        "COPY --from=files /payload /base-payload\nCOPY task.txt /task.txt\n"
    )
    cache = ImageCache(backend, SystemClock(), image_settings())
    await cache.start()
    try:
        lines: list[str] = []
        tag = await cache.build(
            context, build_args={"TASK": "1"}, repository=f"{PREFIX}-build", on_log=lines.append
        )
        published.append(engine.images.get(tag).id)
        assert tag.startswith(f"{PREFIX}-build:")
        assert lines[0].startswith("builder: BuildKit")
        assert any("COPY task.txt" in line for line in lines)
        assert any("COPY --from=files /payload /base-payload" in line for line in lines)
        assert engine.images.get(tag).labels["sandboxd.build"].startswith(tag.rsplit(":", 1)[1])
        again: list[str] = []
        assert (
            await cache.build(
                context, build_args={"TASK": "1"}, repository=f"{PREFIX}-build", on_log=again.append
            )
            == tag
        )
        assert again == []  # found by its hash: no build ran
        (context / "Dockerfile").write_text(f"FROM {image}\nRUN true\nRUN exit 3\n")
        with pytest.raises(BuildFailed) as caught:
            await cache.build(context, repository=f"{PREFIX}-build")
        assert caught.value.step == "RUN exit 3"
        assert "exit code: 3" in caught.value.message
    finally:
        await cache.stop()


async def test_sizes_from_the_registry_without_a_pull(
    engine: docker.DockerClient,
    registry: Registry,
    auth_registry: Registry,
    published: list[str],
    backend: CountingBackend,
    cache: ImageCache,
    tmp_path: Path,
) -> None:
    tag, digest = publish(engine, registry, "task-sized:v1", 3 * MB, published)
    remote, on_engine_now = await cache.size_of(tag)
    assert not on_engine_now and 3 * MB <= remote < 4 * MB  # random bytes do not compress
    assert (await cache.size_of(digest))[0] == remote
    assert backend.pulls == {}
    with pytest.raises(FailedPrecondition, match="no image"):
        await cache.size_of(registry.reference("absent:v1"))
    with pytest.raises(Unavailable):
        await cache.size_of(f"127.0.0.1:{closed_port()}/task:v1")
    await cache.ensure(tag)
    local, on_engine_now = await cache.size_of(tag)
    assert on_engine_now and local >= 3 * MB
    private, _ = publish(engine, auth_registry, "task-private-sized:v1", MB, published)
    with pytest.raises(FailedPrecondition, match="credentials"):
        await cache.size_of(private)
    token = base64.b64encode(f"{auth_registry.username}:{auth_registry.password}".encode()).decode()
    (tmp_path / "config.json").write_text(json.dumps({"auths": {auth_registry.address: {"auth": token}}}))
    with_auth = ImageCache(backend, SystemClock(), image_settings(docker_config=str(tmp_path)))
    await with_auth.start()
    try:
        assert (await with_auth.size_of(private))[0] >= MB
    finally:
        await with_auth.stop()
