"""DemandService, WatchPool, `sandboxd status`, RPC traces and the Prometheus
endpoint, through an in-process server on the FakeBackend."""

from __future__ import annotations

import io
import socket
from collections.abc import AsyncIterator

import aiohttp
import grpc
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sandboxd.app import App, build_app
from sandboxd.backends.fake import FakeBackend
from sandboxd.client import AsyncClient
from sandboxd.errors import DeadlineExceeded, FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted
from sandboxd.settings import TelemetrySettings
from sandboxd.telemetry import MetricsServer, Telemetry
from sandboxd.telemetry.status import format_table, run_status
from sandboxd.v1 import demand_pb2
from tests.unit.conftest import IMAGE, MakeApp, make_settings, wait_for

pytestmark = pytest.mark.timeout(30)


async def test_set_demand_warms_a_pool_and_withdrawing_stops_it(app: App, client: AsyncClient) -> None:
    await client.create_pool("p", IMAGE, min_ready=0, max_size=16, max_ready=12, idle_seconds=5)
    pool = (await client.get_pool("p")).spec
    assert pool.max_ready == 12 and pool.idle_seconds == 5
    scaling = await client.set_demand("p", 6, in_seconds=0, ttl=60, source="gen-0")
    assert scaling.pool == "p" and scaling.announced == 6 and scaling.max_ready == 12
    await wait_for(lambda: app.control.get_pool("p").ready == 6, what="6 warm")
    status = (await client.get_pool("p")).status
    assert status.warm_target == 6 and status.ready == 6
    withdrawn = await client.set_demand("p", 0, source="gen-0")
    assert withdrawn.announced == 0


async def test_demand_errors_map_to_status_codes(client: AsyncClient) -> None:
    await client.create_pool("static", IMAGE, min_ready=1, max_size=4)
    with pytest.raises(FailedPrecondition, match="max_ready"):
        await client.set_demand("static", 2)
    with pytest.raises(NotFound):
        await client.set_demand("nope", 2)
    await client.create_pool("d", IMAGE, max_size=4, max_ready=4)
    with pytest.raises(InvalidArgument) as info:
        await client.set_demand("d", -1)
    assert info.value.field == "count"
    with pytest.raises(InvalidArgument) as info:
        await client.create_pool("bad", IMAGE, max_size=4, max_ready=5)
    assert info.value.field == "spec.max_ready"
    updated = await client.update_pool("d", max_ready=2)
    assert updated.spec.max_ready == 2


async def test_demand_sources_and_prewarm_timeouts_are_checked(app: App, client: AsyncClient) -> None:
    await client.create_pool("d", IMAGE, max_size=4, max_ready=4)
    for source in ("gen\x00", "gen\n0", "s" * 129):
        with pytest.raises(InvalidArgument) as info:
            await client.set_demand("d", 1, source=source)
        assert info.value.field == "source"
        with pytest.raises(InvalidArgument) as info:
            await client.prewarm("d", 1, source=source)
        assert info.value.field == "source"
    # NaN and infinity would have made the wait endless. (The raw stub: the
    # client would derive its own RPC deadline from these.)
    for timeout in (-1.0, float("nan"), float("inf")):
        request = demand_pb2.PrewarmRequest(pool="d", count=1, wait=True, timeout_seconds=timeout)
        with pytest.raises(grpc.aio.AioRpcError) as raw:
            await client.demand.Prewarm(request, timeout=5)
        assert raw.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert (raw.value.details() or "").startswith("timeout_seconds: ")
    # Only this announcement counts: none of the refused ones was recorded.
    assert (await client.set_demand("d", 1, source="gen-0 ü")).announced == 1


async def test_prewarm_with_wait_returns_once_ready(client: AsyncClient) -> None:
    await client.create_pool("p", IMAGE, max_size=8, max_ready=8)
    scaling = await client.prewarm("p", 5, wait=True, timeout=5)
    assert scaling.ready >= 5
    assert scaling.created_total >= 5
    async with client.acquire_group("p", n=5, timeout=1) as group:
        assert len(group) == 5


async def test_prewarm_that_cannot_finish_in_time_is_deadline_exceeded(make_app: MakeApp) -> None:
    app = await make_app(backend=FakeBackend(start_delay=60.0))
    async with AsyncClient(app.address) as client:
        await client.create_pool("p", IMAGE, max_size=8, max_ready=8)
        with pytest.raises(DeadlineExceeded, match="0 of 3"):
            await client.prewarm("p", 3, wait=True, timeout=0.3)


async def test_prewarm_past_the_ceiling_is_refused_at_once_and_warms_what_fits(make_app: MakeApp) -> None:
    app = await make_app(pools__max_total_sandboxes=6)
    async with AsyncClient(app.address) as client:
        await client.create_pool("other", IMAGE, min_ready=2, max_size=4)
        await wait_for(lambda: app.control.get_pool("other").ready == 2, what="2 warm in other")
        await client.create_pool("p", IMAGE, max_size=16, max_ready=16)
        # Long before the 20 s wait would run out: the answer names the room.
        with pytest.raises(ResourceExhausted, match=r"4 fit this pool now \(2 held by other pools"):
            await client.prewarm("p", 10, wait=True, timeout=20)
        await wait_for(lambda: app.control.get_pool("p").ready == 4, what="what fits, warm")
        # What fits is still served with a wait.
        scaling = await client.prewarm("p", 4, wait=True, timeout=5, source="fits")
        assert scaling.ready >= 4


async def test_watch_pool_streams_updates(app: App, client: AsyncClient) -> None:
    await client.create_pool("p", IMAGE, max_size=8, max_ready=8)
    await client.create_pool("q", IMAGE, min_ready=1, max_size=2)
    seen: list[int] = []
    stream = client.watch_pools("p", interval=0.05)
    try:
        async for update in stream:
            (scaling,) = update.pools
            seen.append(scaling.ready)
            if len(seen) == 1:
                await client.set_demand("p", 3)
            if scaling.ready == 3 and scaling.warm_target == 3:
                assert "announced 3" in scaling.reason
                break
    finally:
        await stream.aclose()  # type: ignore[attr-defined]
    assert seen[0] == 0 and seen[-1] == 3
    everything = client.watch_pools(interval=0.05)
    try:
        update = await anext(everything)  # type: ignore[arg-type]
        assert [p.pool for p in update.pools] == ["p", "q"]
        assert update.at.seconds > 0
    finally:
        await everything.aclose()  # type: ignore[attr-defined]
    with pytest.raises(NotFound):
        await anext(client.watch_pools("nope"))  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        await anext(client.watch_pools("p", interval=1000))  # type: ignore[arg-type]


async def test_status_prints_a_table_once(app: App, client: AsyncClient) -> None:
    await client.create_pool("p", IMAGE, min_ready=2, max_size=8, max_ready=4)
    await wait_for(lambda: app.control.get_pool("p").ready == 2, what="warm")
    out = io.StringIO()
    assert await run_status(app.address, once=True, out=out) == 0
    text = out.getvalue()
    header, row = text.splitlines()[1:3]
    assert header.split()[:6] == ["POOL", "READY", "LEASED", "START", "WAIT", "TARGET"]
    assert row.split()[:2] == ["p", "2"]
    assert "p: " in text and "min_ready 2" in text
    assert "\x1b[" not in text  # not a terminal: no screen clearing
    assert "(no pools)" in format_table([])


async def test_every_rpc_gets_a_span(tmp_path: object) -> None:
    exporter = InMemorySpanExporter()
    telemetry = Telemetry(TelemetrySettings(), span_processors=(SimpleSpanProcessor(exporter),))
    app = build_app(make_settings(), backend=FakeBackend(), persist=False, telemetry=telemetry)
    await app.start()
    try:
        async with AsyncClient(app.address) as client:
            await client.create_pool("p", IMAGE, max_size=2)
            with pytest.raises(NotFound):
                await client.get_pool("nope")
            stream = client.watch_pools("p", interval=0.05)
            await anext(stream)  # type: ignore[arg-type]
            await stream.aclose()  # type: ignore[attr-defined]
        await wait_for(lambda: len(exporter.get_finished_spans()) >= 3, what="spans")
    finally:
        await app.stop(grace=0.5)
    spans: dict[str, ReadableSpan] = {s.name: s for s in exporter.get_finished_spans()}
    created = spans["sandboxd.v1.PoolService/CreatePool"]
    assert created.attributes is not None
    assert created.attributes["rpc.system"] == "grpc"
    assert created.attributes["rpc.method"] == "CreatePool"
    assert created.attributes["rpc.grpc.status_code"] == 0
    missing = spans["sandboxd.v1.PoolService/GetPool"]
    assert missing.attributes is not None
    assert missing.attributes["rpc.grpc.status_code"] == 5  # NOT_FOUND: the caller's doing, not an error
    assert missing.attributes["error.type"] == "NotFound"
    assert "sandboxd.v1.DemandService/WatchPool" in spans


@pytest.fixture
async def metrics_app() -> AsyncIterator[App]:
    app = build_app(make_settings(), backend=FakeBackend(), persist=False)
    await app.start()
    yield app
    await app.stop(grace=0.5)


async def test_prometheus_endpoint_serves_pool_metrics(metrics_app: App) -> None:
    assert metrics_app.telemetry is not None
    server = MetricsServer(metrics_app.telemetry.prometheus_text, "127.0.0.1", 0)
    await server.start()
    try:
        async with AsyncClient(metrics_app.address) as client:
            await client.create_pool("p", IMAGE, min_ready=2, max_size=4)
            await wait_for(lambda: metrics_app.control.get_pool("p").ready == 2, what="warm")
            async with client.acquire("p", timeout=5):
                pass
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://127.0.0.1:{server.port}/metrics") as response,
        ):
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            text = await response.text()
    finally:
        await server.stop()
    assert "# TYPE sandboxd_pool_sandboxes gauge" in text
    assert 'sandboxd_pool_warm_target{pool="p"} 2' in text
    assert 'sandboxd_pool_waiting_acquirers{pool="p"} 0' in text
    assert 'sandboxd_acquire_latency_seconds_bucket{pool="p",le="+Inf"} 1' in text
    assert "sandboxd_startup_latency_seconds_count" in text


async def test_metrics_port_setting_starts_the_endpoint() -> None:
    # 0 = off (the default); any other port serves /metrics while the app runs.
    app = build_app(make_settings(), backend=FakeBackend(), persist=False)
    await app.start()
    try:
        assert app.telemetry is not None and app.telemetry.server is None
    finally:
        await app.stop(grace=0.5)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = build_app(make_settings(telemetry__metrics_port=port), backend=FakeBackend(), persist=False)
    await app.start()
    try:
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://127.0.0.1:{port}/metrics") as response,
        ):
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/plain")
    finally:
        await app.stop(grace=0.5)
