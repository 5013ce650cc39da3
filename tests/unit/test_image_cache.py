"""The image cache over the fake backend's in-memory registry: one pull per
image, typed answers, deadlines on the injected clock, credentials from a
Docker config, and eviction within the budget of only sandboxd's own,
unused, unwanted images (remembered across a restart)."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from sandboxd.api.errors import status_for
from sandboxd.backends.base import ImageStore, RegistryAuth
from sandboxd.backends.fake import FakeBackend
from sandboxd.backends.image_refs import normalize, registry_of
from sandboxd.clock import FakeClock, SystemClock
from sandboxd.core.images import DONE, FAILED, PULLING, ImageCache
from sandboxd.core.images.credentials import Credentials, read_auths
from sandboxd.core.images.eviction import Footprint, cache_bytes
from sandboxd.errors import DeadlineExceeded, FailedPrecondition, InvalidArgument, Unavailable
from sandboxd.settings import ImageSettings
from tests.unit.conftest import wait_for

REG = "registry.test:5000"
A, B, C, D = (f"{REG}/task-{name}:v1" for name in "abcd")
MB = 1 << 20


def settings(**kw: object) -> ImageSettings:
    # The fake registry serves layers at the size they take on the engine.
    base: dict[str, object] = {
        "evict_interval_seconds": 0.0,
        "docker_config": "/nonexistent",
        "unpack_ratio": 1.0,
    }
    base.update(kw)
    return ImageSettings(**base)  # type: ignore[arg-type]


@pytest.fixture
def backend() -> FakeBackend:
    b = FakeBackend(images=set())
    for ref in (A, B, C, D):
        b.registry.add(ref, 10 * MB)
    return b


@pytest.fixture
async def cache(backend: FakeBackend) -> AsyncIterator[ImageCache]:
    c = ImageCache(backend, SystemClock(), settings(cache_bytes=1 << 40))
    await c.start()
    yield c
    await c.stop()


def test_fake_backend_is_an_image_store(backend: FakeBackend) -> None:
    assert isinstance(backend, ImageStore)


async def test_concurrent_ensures_share_one_pull(backend: FakeBackend, cache: ImageCache) -> None:
    backend.registry.hold()
    waiters = [asyncio.create_task(cache.ensure(A)) for _ in range(16)]
    await wait_for(lambda: any(p.bytes_total for p in cache.progress()), what="pull under way")
    [pulling] = cache.progress()
    assert (pulling.image, pulling.state, pulling.bytes_total) == (A, PULLING, 10 * MB)
    assert not cache.present(A)
    backend.registry.release()
    await asyncio.gather(*waiters)
    assert backend.registry.pulls[A] == 1
    assert cache.present(A)
    assert cache.progress()[0].state == DONE
    # Present now: no second pull.
    await cache.ensure(A)
    assert backend.registry.pulls[A] == 1
    assert [e.reference for e in cache.entries()] == [A]


async def test_pulls_per_host_are_bounded(backend: FakeBackend) -> None:
    cache = ImageCache(backend, SystemClock(), settings(max_concurrent_pulls=2))
    await cache.start()
    try:
        backend.registry.hold()
        waiters = [asyncio.create_task(cache.ensure(ref)) for ref in (A, B, C, D)]
        await wait_for(lambda: sum(backend.registry.pulls.values()) == 2, what="two pulling")
        assert sorted(p.state for p in cache.progress()) == ["pulling", "pulling", "queued", "queued"]
        assert sum(backend.registry.pulls.values()) == 2
        backend.registry.release()
        await asyncio.gather(*waiters)
        assert all(backend.registry.pulls[ref] == 1 for ref in (A, B, C, D))
    finally:
        await cache.stop()


async def test_missing_image_is_failed_precondition_and_not_remembered(
    backend: FakeBackend, cache: ImageCache
) -> None:
    missing = f"{REG}/nope:1"
    with pytest.raises(FailedPrecondition, match="nope"):
        await cache.ensure(missing)
    assert cache.progress()[0].state == FAILED
    # The registry gets it later: the next ensure pulls it (a failure is not cached).
    backend.registry.add(missing, MB)
    await cache.ensure(missing)
    assert cache.present(missing)


async def test_unreachable_registry_is_unavailable_with_retry_info(
    backend: FakeBackend, cache: ImageCache
) -> None:
    backend.registry.unreachable = True
    with pytest.raises(Unavailable) as caught:
        await cache.ensure(A)
    assert caught.value.retry_after == cache.settings.unavailable_retry_seconds
    assert status_for(caught.value) == grpc.StatusCode.UNAVAILABLE


async def test_deadline_names_the_pull_and_its_progress_and_the_pull_goes_on(backend: FakeBackend) -> None:
    clock = FakeClock()
    cache = ImageCache(backend, clock, settings())
    await cache.start()
    try:
        backend.registry.hold()
        waiter = asyncio.create_task(cache.ensure(A, deadline=clock.monotonic() + 30))
        await wait_for(lambda: any(p.bytes_total for p in cache.progress()), what="pull under way")
        clock.advance(31)
        with pytest.raises(DeadlineExceeded) as caught:
            await waiter
        assert A in caught.value.message and "pulling" in caught.value.message
        assert "10.5 MB" in caught.value.message
        # A deadline already past answers at once, naming the same pull.
        with pytest.raises(DeadlineExceeded, match="pulling"):
            await cache.ensure(A, deadline=clock.monotonic() - 1)
        backend.registry.release()
        await cache.ensure(A)
        assert backend.registry.pulls[A] == 1
    finally:
        await cache.stop()


def _docker_config(directory: Path, server: str, user: str, password: str) -> None:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    (directory / "config.json").write_text(json.dumps({"auths": {server: {"auth": token}}}))


async def test_credentials_from_the_docker_config(backend: FakeBackend, tmp_path: Path) -> None:
    backend.registry.credentials = RegistryAuth(REG, "alice", "s3cret")
    anonymous = ImageCache(backend, SystemClock(), settings())
    await anonymous.start()
    try:
        with pytest.raises(FailedPrecondition, match="denied"):
            await anonymous.ensure(A)
    finally:
        await anonymous.stop()
    _docker_config(tmp_path, f"https://{REG}", "alice", "s3cret")
    cache = ImageCache(backend, SystemClock(), settings(docker_config=str(tmp_path)))
    await cache.start()
    try:
        await cache.ensure(A)
        assert cache.present(A)
    finally:
        await cache.stop()


def test_docker_config_reading(tmp_path: Path) -> None:
    _docker_config(tmp_path, "127.0.0.1:5000", "bob", "pw:with:colons")
    found = Credentials(tmp_path).for_reference("127.0.0.1:5000/x@sha256:" + "0" * 64)
    assert found == RegistryAuth("127.0.0.1:5000", "bob", "pw:with:colons")
    assert Credentials(tmp_path).for_reference("python:3.11") is None
    assert read_auths(tmp_path / "absent") == {}
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(InvalidArgument, match="images.docker_config"):
        read_auths(tmp_path)


def test_references() -> None:
    assert registry_of("python:3.11") == "docker.io"
    assert registry_of("localhost/x") == "localhost"
    assert registry_of("127.0.0.1:5000/a/b:c") == "127.0.0.1:5000"
    assert normalize("127.0.0.1:5000/a") == "127.0.0.1:5000/a:latest"
    assert normalize("127.0.0.1:5000/a:b") == "127.0.0.1:5000/a:b"
    assert normalize("a@sha256:00") == "a@sha256:00"


async def test_backend_without_pulls_checks_presence() -> None:
    class Plain:
        async def image_exists(self, image: str) -> bool:
            return image == "here:1"

    cache = ImageCache(Plain(), SystemClock(), settings())
    await cache.start()
    try:
        await cache.ensure("here:1")
        with pytest.raises(FailedPrecondition, match="does not pull"):
            await cache.ensure("absent:1")
    finally:
        await cache.stop()


def test_cache_bytes_counts_a_shared_base_once() -> None:
    assert cache_bytes({}) == 0
    three = {r: Footprint(10, 100) for r in "abc"}
    assert cache_bytes(three) == 130


async def test_eviction_removes_least_recently_used_of_its_own_only(backend: FakeBackend) -> None:
    clock = FakeClock()
    cache = ImageCache(backend, clock, settings(cache_bytes=25 * MB))
    foreign = f"{REG}/someone-elses:1"
    backend._put(foreign, 50 * MB, 0)
    await cache.start()
    try:
        for ref in (A, B):
            await cache.ensure(ref)
            clock.advance(200)  # past the grace an ensured image has before its sandbox exists
        await cache.enforce_budget()
        assert set(backend.engine_images) == {foreign, A, B}
        cache.use(A)  # A is now the most recently used, and in use
        clock.advance(200)
        await cache.ensure(C)
        clock.advance(200)
        # The check after C's pull or this one (they take turns): over budget
        # with A, B, C (30 MB), B is the least recently used unused one.
        await cache.enforce_budget()
        assert set(backend.engine_images) == {foreign, A, C}
        assert B not in {e.reference for e in cache.entries()}
        cache.want("queue", {D: 2, C: 1})
        await wait_for(lambda: cache.present(D), what="D prefetched")
        clock.advance(200)
        # A in use, C and D wanted: nothing may go although over budget.
        assert await cache.enforce_budget() == []
        assert set(backend.engine_images) == {foreign, A, C, D}
        assert cache.gauges()["cache_bytes"] == 30 * MB
        cache.want("queue", {})
        cache.unuse(A)
        clock.advance(200)
        cache.use(D)
        await cache.enforce_budget()
        assert set(backend.engine_images) == {foreign, A, D}
    finally:
        await cache.stop()


async def test_a_running_sandbox_keeps_its_image_whatever_the_cache_thinks(backend: FakeBackend) -> None:
    from sandboxd.backends.base import Limits, SandboxSpec

    clock = FakeClock()
    cache = ImageCache(backend, clock, settings(cache_bytes=1))
    await cache.start()
    try:
        await cache.ensure(A)
        await backend.create(SandboxSpec("sb-1", "pool", A, Limits()))
        clock.advance(200)
        assert await cache.enforce_budget() == []
        assert A in backend.engine_images
    finally:
        await cache.stop()


async def test_ledger_survives_a_restart_and_forgets_a_retagged_image(
    backend: FakeBackend, tmp_path: Path
) -> None:
    ledger = tmp_path / "images.sqlite3"
    clock = FakeClock()
    first = ImageCache(backend, clock, settings(cache_bytes=1 << 40), ledger_path=ledger)
    await first.start()
    await first.ensure(A)
    await first.ensure(B)
    await first.stop()
    # Someone else points B at another image while the server is down.
    backend._put(B, 10 * MB, 0)
    backend.engine_images[B] = backend.engine_images[B].__class__("sha256:other", (B,), 10 * MB)
    second = ImageCache(backend, clock, settings(cache_bytes=1), ledger_path=ledger)
    await second.start()
    try:
        assert [e.reference for e in second.entries()] == [A]
        clock.advance(200)
        await second.enforce_budget()
        assert A not in backend.engine_images
        assert B in backend.engine_images
    finally:
        await second.stop()


async def test_budget_defaults_to_a_share_of_the_engine_disk(backend: FakeBackend) -> None:
    backend.disk_total_bytes = 1000 * MB
    cache = ImageCache(backend, SystemClock(), settings(cache_share=0.25))
    await cache.start()
    try:
        assert cache.budget == 250 * MB
    finally:
        await cache.stop()


async def test_failed_prefetch_shows_in_progress(backend: FakeBackend, cache: ImageCache) -> None:
    cache.want("queue", {f"{REG}/gone:1": 1})
    await wait_for(lambda: any(p.state == FAILED for p in cache.progress()), what="prefetch failed")
    [failed] = cache.progress()
    assert "gone" in failed.detail


def test_unavailable_carries_its_retry_hint_to_the_client() -> None:
    from sandboxd.api.errors import _trailers
    from sandboxd.client.rpc import translate
    from sandboxd.errors import TransientBackendError

    error = Unavailable("registry for image 'x' cannot be reached", retry_after=5.0)
    trailers = dict(_trailers(status_for(error), error))
    assert trailers["retry-after-seconds"] == "5.000"
    failed = grpc.aio.AioRpcError(
        grpc.StatusCode.UNAVAILABLE,
        grpc.aio.Metadata(),
        grpc.aio.Metadata(("retry-after-seconds", "5.000")),
        details=error.message,
    )
    back = translate(failed)
    assert isinstance(back, Unavailable) and back.retry_after == 5.0
    plain = grpc.aio.AioRpcError(
        grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "busy"
    )
    assert type(translate(plain)) is TransientBackendError


def _recipe(directory: Path, dockerfile: str, files: dict[str, str] | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "Dockerfile").write_text(dockerfile)
    for name, text in (files or {}).items():
        (directory / name).write_text(text)
    return directory


async def test_builds_are_cached_by_the_recipe_hash(backend: FakeBackend, tmp_path: Path) -> None:
    cache = ImageCache(backend, SystemClock(), settings())
    await cache.start()
    try:
        context = _recipe(tmp_path / "ctx", "FROM base\nCOPY app.py /app.py\n", {"app.py": "print(1)\n"})
        lines: list[str] = []
        # Whichever asks second joins the build (its log replayed from the
        # first line) or, on a slow host, finds the image already built.
        first, second = await asyncio.gather(
            cache.build(context, on_log=lines.append),
            cache.build(context, build_args=None, on_log=lines.append),
        )
        assert first == second and first.startswith("sandboxd-build:")
        assert backend.builds[first] == 1
        assert any("COPY app.py" in line for line in lines)
        assert cache.present(first)
        assert {e.reference: e.how for e in cache.entries()} == {first: "built"}
        # Found again: no build.
        assert await cache.build(context) == first
        assert backend.builds[first] == 1
        # A changed file or build argument is another recipe.
        (context / "app.py").write_text("print(2)\n")
        changed = await cache.build(context)
        with_arg = await cache.build(context, build_args={"PY": "3.12"})
        assert len({first, changed, with_arg}) == 3
    finally:
        await cache.stop()


async def test_a_failed_build_names_its_step(backend: FakeBackend, tmp_path: Path) -> None:
    from sandboxd.errors import BuildFailed

    cache = ImageCache(backend, SystemClock(), settings())
    await cache.start()
    try:
        context = _recipe(tmp_path / "bad", "FROM base\nRUN true\nRUN false\nRUN never\n")
        with pytest.raises(BuildFailed) as caught:
            await cache.build(context)
        assert caught.value.step == "RUN false"
        assert "step 3" in caught.value.message
        assert "RUN true" in caught.value.log_tail
        assert cache.entries() == []
        with pytest.raises(InvalidArgument, match="dockerfile"):
            await cache.build(context, dockerfile="Nope")
        with pytest.raises(InvalidArgument, match="context"):
            await cache.build(tmp_path / "absent")
    finally:
        await cache.stop()


def test_status_shows_each_pull_once_and_the_images_of_a_pool() -> None:
    from sandboxd.telemetry.status import format_table
    from sandboxd.v1 import demand_pb2

    pull = demand_pb2.ImagePull(
        image=A, state="pulling", bytes_done=5 * MB, bytes_total=10 * MB, detail="Downloading"
    )
    pools = [
        demand_pb2.PoolScaling(
            pool="p1", images=[demand_pb2.ImageScaling(image=A, ready=1, warm_target=2)], pulls=[pull]
        ),
        demand_pb2.PoolScaling(pool="p2", pulls=[pull]),
    ]
    text = format_table(pools)
    assert text.count(f"pull {A}: pulling, 5.2 of 10.5 MB (Downloading)") == 1
    assert f"image {A}: ready 1 starting 0 waiting 0 target 2" in text


async def test_pulls_and_evictions_are_counted_in_metrics(
    backend: FakeBackend, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from sandboxd.telemetry import render

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    clock = FakeClock()
    cache = ImageCache(backend, clock, settings(cache_bytes=15 * MB), meter=provider.get_meter("t"))
    await cache.start()
    try:
        await cache.ensure(A)
        clock.advance(200)
        with caplog.at_level(logging.INFO, logger="sandboxd.core.images.cache"):
            await cache.ensure(B)
            clock.advance(200)
            await cache.enforce_budget()
        with pytest.raises(FailedPrecondition):
            await cache.ensure(f"{REG}/absent:1")
        text = render(reader.get_metrics_data())
    finally:
        await cache.stop()
        provider.shutdown()
    assert 'sandboxd_image_pulls_total{result="done"} 2' in text
    assert 'sandboxd_image_pulls_total{result="not_found"} 1' in text
    assert 'sandboxd_image_evictions_total{reason="budget"} 1' in text
    assert "sandboxd_image_cache_budget_bytes 15728640" in text
    assert f"removed {A}" in caplog.text and "least recently used" in caplog.text


async def test_an_image_used_while_others_are_removed_stays(backend: FakeBackend) -> None:
    clock = FakeClock()
    cache = ImageCache(backend, clock, settings(cache_bytes=1))
    await cache.start()
    try:
        # Both within their grace: the checks after their pulls remove nothing.
        await cache.ensure(A)
        await cache.ensure(B)
        assert set(backend.engine_images) == {A, B}
        remove = backend.remove_image

        async def remove_then_use(reference: str) -> None:
            await remove(reference)
            cache.use(B)  # a sandbox of B starts while A is being removed

        backend.remove_image = remove_then_use  # type: ignore[method-assign]
        clock.advance(200)
        await cache.enforce_budget()
        assert A not in backend.engine_images
        assert B in backend.engine_images
    finally:
        await cache.stop()


async def test_a_build_in_flight_shows_in_progress(backend: FakeBackend, tmp_path: Path) -> None:
    clock = FakeClock()
    cache = ImageCache(backend, clock, settings())
    await cache.start()
    try:
        context = _recipe(tmp_path / "ctx", "FROM base\nRUN make\n")
        seen: list[list[str]] = []
        lines: list[str] = []

        def on_log(line: str) -> None:
            lines.append(line)
            seen.append([p.detail for p in cache.progress()])

        tag = await cache.build(context, on_log=on_log)
        assert any(f"building: {lines[0]}" in details for details in seen)
        assert all(p.image != tag for p in cache.progress())  # ended builds are not listed
    finally:
        await cache.stop()


async def test_without_a_disk_to_size_the_budget_pulls_work_and_nothing_is_evicted(
    backend: FakeBackend, caplog: pytest.LogCaptureFixture
) -> None:
    from sandboxd.errors import TransientBackendError

    async def remote_engine() -> object:
        raise TransientBackendError("the Docker engine is on another host")

    backend.image_disk = remote_engine  # type: ignore[assignment,method-assign]
    clock = FakeClock()
    cache = ImageCache(backend, clock, settings())
    await cache.start()
    try:
        assert cache.budget == 0
        assert "set images.cache_bytes" in caplog.text
        await cache.ensure(A)
        clock.advance(200)
        assert await cache.enforce_budget() == []
        assert A in backend.engine_images
    finally:
        await cache.stop()
