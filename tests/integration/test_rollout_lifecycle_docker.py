"""Rollout lifecycles on the real engine, under runc and gVisor: rollouts
through the rollout queue in sandboxes leased from a warm pool and from a
cold one, their traces read from an in-memory exporter, and GetFigures'
stages and dollars checked against those traces and the sandboxes'
reservations."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import docker
import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sandboxd.app import App, build_app
from sandboxd.client import AsyncClient
from sandboxd.client.rollouts import RolloutClient
from sandboxd.core.rollouts.spans import SANDBOX_START_SPAN, STAGE_SPAN_PREFIX
from sandboxd.settings import DEFAULT_LIMITS
from sandboxd.telemetry import Telemetry
from tests.integration.conftest import instance_containers, make_settings, poll
from tests.lifecycle_run import run_rollouts, traces

pytestmark = [pytest.mark.docker, pytest.mark.timeout(240)]

GPU_HOUR, GPUS = 1.59, 8


@pytest.fixture
async def traced_app(
    tmp_path: Path, engine: docker.DockerClient, image: str
) -> AsyncIterator[tuple[App, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    settings = make_settings(tmp_path, **{"cost.trainer_gpus": GPUS})
    telemetry = Telemetry(settings.telemetry, span_processors=(SimpleSpanProcessor(exporter),))
    app = build_app(settings, telemetry=telemetry)
    await app.start()
    try:
        yield app, exporter
    finally:
        await app.stop(grace=1)
        left = await asyncio.to_thread(instance_containers, engine, settings.instance_id)
        for c in left:
            with contextlib.suppress(docker.errors.NotFound):
                await asyncio.to_thread(c.remove, force=True)
        assert not left, f"leaked containers: {[c.name for c in left]}"


def _seconds(ns: int | None) -> float:
    assert ns is not None
    return ns / 1e9


async def test_rollouts_on_docker_are_traced_and_costed(
    traced_app: tuple[App, InMemorySpanExporter], image: str, each_runtime: str
) -> None:
    app, exporter = traced_app
    async with AsyncClient(app.address) as client:
        await client.create_pool("warm", image, min_ready=2, max_size=6, runtime=each_runtime)
        await client.create_pool("cold", image, min_ready=0, max_size=2, runtime=each_runtime)

        async def warm_ready() -> bool:
            return (await client.get_pool("warm")).status.ready >= 2

        await poll(warm_ready, 120, "two warm sandboxes")
        r = RolloutClient(client)
        await r.configure("warm-run", batch_groups=1, group_size=2, max_staleness=0)
        await r.configure("cold-run", batch_groups=1, group_size=2, max_staleness=0)
        warm, warm_ids = await run_rollouts(client, "warm", "warm-run", groups=2)
        cold, cold_ids = await run_rollouts(client, "cold", "cold-run", groups=1)

    spans = exporter.get_finished_spans()
    warm_traces, cold_traces = traces(spans, "warm-run"), traces(spans, "cold-run")
    assert sorted(warm_traces) == ["g0t0", "g0t1", "g1t0", "g1t1"] and sorted(cold_traces) == ["g0t0", "g0t1"]
    acquired = {
        str((s.attributes or {})["sandboxd.sandbox_id"])
        for trace in warm_traces.values()
        for s in trace
        if s.name == STAGE_SPAN_PREFIX + "acquire"
    }
    assert acquired == set(warm_ids)

    # The warm pool's first two sandboxes were ready before they were asked for.
    lc = warm.lifecycle
    assert lc.warm_sandboxes >= 2 and lc.warm_sandboxes + lc.cold_sandboxes == 4
    assert lc.traces == 4 and lc.image_pulls == 0
    by = {d.stage: d for d in lc.stages}
    for stage in ("acquire", "to_first_command", "rollout", "verifier", "queue_wait", "training"):
        assert by[stage].count == 4, stage
    # The cold pool started its first sandbox for the acquire: its trace shows the start.
    assert cold.lifecycle.cold_sandboxes >= 1
    cold_starts = [s for trace in cold_traces.values() for s in trace if s.name == SANDBOX_START_SPAN]
    assert cold_starts and all(_seconds(s.end_time) > _seconds(s.start_time) for s in cold_starts)

    # Dollars: each trajectory's sandbox reserved the pool's limits from its
    # hand-over (the acquire stage's end) to the group's submit (scoring's end).
    prices = app.settings.cost
    expected = 0.0
    for trace in warm_traces.values():
        stage = {s.name.removeprefix(STAGE_SPAN_PREFIX): s for s in trace}
        held = _seconds(stage["scoring"].end_time) - _seconds(stage["acquire"].end_time)
        expected += prices.sandbox_usd(DEFAULT_LIMITS.cpu_millis / 1000, DEFAULT_LIMITS.memory_bytes, held)
    c = warm.cost
    assert c.window_sandbox_usd == pytest.approx(expected, rel=1e-6)
    assert c.sandbox_usd_per_rollout == pytest.approx(expected / 4, rel=1e-6)
    assert c.sandbox_usd_per_step == pytest.approx(expected / 2, rel=1e-6)
    assert c.steps == 2 and c.rollouts == 4 and c.tokens > 0 and c.usd_per_mtok > 0
    assert (c.gpu_hour_usd, c.trainer_gpus) == (GPU_HOUR, GPUS)
    assert c.trainer_idle_usd_per_hour == pytest.approx(warm.trainer_idle_ratio * GPUS * GPU_HOUR, rel=1e-6)
    assert set(warm_ids).isdisjoint(cold_ids)
