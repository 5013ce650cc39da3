"""Rollout lifecycles over gRPC on the fake backend: one trace per
trajectory with a span per stage, stage distributions and dollars in
GetFigures, cancelled and dropped groups traced to their end, and the
status line that shows them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sandboxd.app import App, build_app
from sandboxd.backends.fake import FakeBackend
from sandboxd.client import AsyncClient
from sandboxd.client.rollouts import RolloutClient, trajectory
from sandboxd.core.rollouts.spans import ROOT_SPAN, SANDBOX_START_SPAN, STAGE_SPAN_PREFIX
from sandboxd.settings import TelemetrySettings
from sandboxd.telemetry import Telemetry
from sandboxd.telemetry.status import run_detail_lines, usd
from tests.lifecycle_run import TOKENS_PER_TRAJECTORY, run_rollouts, traces
from tests.unit.conftest import IMAGE, make_settings

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
async def traced(no_task_leaks: None) -> AsyncIterator[tuple[App, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    telemetry = Telemetry(TelemetrySettings(), span_processors=(SimpleSpanProcessor(exporter),))
    settings = make_settings(cost__gpu_hour_usd=3.6, cost__trainer_gpus=2)
    app = build_app(settings, backend=FakeBackend(), persist=False, telemetry=telemetry)
    await app.start()
    try:
        yield app, exporter
    finally:
        await app.stop(grace=0.5)


async def test_each_trajectory_is_one_trace_and_figures_carry_stages_and_dollars(
    traced: tuple[App, InMemorySpanExporter],
) -> None:
    app, exporter = traced
    async with AsyncClient(app.address) as client:
        await client.create_pool("p", IMAGE, max_size=4)
        r = RolloutClient(client)
        await r.configure("run", batch_groups=1, group_size=2, max_staleness=0)
        f, used = await run_rollouts(client, "p", "run", groups=2)

    lc = f.lifecycle
    by = {d.stage: d for d in lc.stages}
    assert lc.traces == 4 and lc.warm_sandboxes + lc.cold_sandboxes == 4
    for stage in ("slot_wait", "to_acquire", "acquire", "to_first_command", "rollout", "verifier",
                  "scoring", "queue_wait", "training"):  # fmt: skip
        assert by[stage].count == 4, stage
        d = by[stage]
        assert 0 <= d.p50_seconds <= d.p90_seconds <= d.p99_seconds <= d.max_seconds
    assert lc.bottleneck in {d.stage for d in lc.stages}

    c = f.cost
    assert c.steps == 2 and c.rollouts == 4 and c.tokens == 4 * TOKENS_PER_TRAJECTORY
    assert (c.gpu_hour_usd, c.trainer_gpus) == (3.6, 2)
    assert c.sandbox_usd_total > 0 and c.sandbox_usd_per_rollout == pytest.approx(c.window_sandbox_usd / 4)
    assert c.sandbox_usd_per_step == pytest.approx(c.window_sandbox_usd / 2)
    assert c.usd_per_mtok > c.sandbox_usd_per_mtok > 0

    got = traces(exporter.get_finished_spans())
    assert sorted(got) == ["g0t0", "g0t1", "g1t0", "g1t1"]
    for tid, spans in got.items():
        root, children = spans[0], spans[1:]
        assert root.parent is None and root.name == ROOT_SPAN
        assert (root.attributes or {})["sandboxd.outcome"] == "consumed"
        assert (root.attributes or {})["sandboxd.tokens"] == TOKENS_PER_TRAJECTORY
        names = {s.name for s in children}
        for stage in ("queue_wait", "training", "verifier", "acquire", "rollout"):
            assert STAGE_SPAN_PREFIX + stage in names, (tid, names)
        assert root.start_time is not None and root.end_time is not None
        for s in children:
            assert s.start_time is not None and s.end_time is not None
            assert root.start_time <= s.start_time <= s.end_time <= root.end_time
            assert s.parent is not None
        acquire = next(s for s in children if s.name == STAGE_SPAN_PREFIX + "acquire")
        assert (acquire.attributes or {})["sandboxd.sandbox_id"] in used
        if not (acquire.attributes or {})["sandboxd.warm"]:
            start = [s for s in children if s.name == SANDBOX_START_SPAN]
            assert start and start[0].parent is not None and acquire.context is not None
            assert start[0].parent.span_id == acquire.context.span_id

    lines = run_detail_lines(f)
    assert lines[0].startswith("cost: trainer idle $") and "2 GPUs at $3.60" in lines[0]
    assert "lifecycle: 4 rollouts" in lines[1] and any("acquire" in ln and "p99" in ln for ln in lines)


async def test_cancelled_and_dropped_groups_end_their_traces(
    traced: tuple[App, InMemorySpanExporter],
) -> None:
    app, exporter = traced
    async with AsyncClient(app.address) as client:
        await client.create_pool("p", IMAGE, max_size=8)
        r = RolloutClient(client)
        await r.configure(
            "run", batch_groups=1, group_size=2, over_sample=1.0, filter_mode="FILTER_MODE_DROP_AND_BACKFILL"
        )
        a, b = await r.request_slots("run", 2)
        lease = await client.lease("p")
        await r.report_progress(
            "run", b.group_id, lease_ids=[lease.id], trajectories=[trajectory("b0", sandbox_id=lease[0].id)]
        )
        same = [trajectory("flat0", reward=1.0), trajectory("flat1", reward=1.0)]
        dropped = await r.submit("run", a.group_id, same)  # zero advantage: dropped
        assert dropped.outcome == 3  # GROUP_OUTCOME_DROPPED
        (c,) = await r.request_slots("run")
        await r.submit("run", c.group_id, [trajectory("c0", reward=1.0), trajectory("c1", reward=0.0)])
        straggler = await r.report_progress("run", b.group_id)
        assert straggler.cancelled
        f = await r.figures("run")
    outcomes: dict[str, Any] = {}
    for tid, spans in traces(exporter.get_finished_spans()).items():
        outcomes[tid] = (spans[0].attributes or {})["sandboxd.outcome"]
    # c is admitted, not yet consumed: its trace is still open
    assert outcomes == {"flat0": "dropped", "flat1": "dropped", "b0": "cancelled"}
    assert f.lifecycle.traces == 3 and f.cost.rollouts == 5  # dropped 2, cancelled 1, admitted 2
    assert f.cost.sandbox_usd_total > 0  # the straggler's sandbox, held until it was cancelled
    assert app.rollouts is not None
    (run,) = app.rollouts.runs.values()
    assert app.rollouts.lifecycle(run).following == 1


@pytest.mark.parametrize(
    ("amount", "shown"),
    [(0.0, "$0.00"), (1.59, "$1.59"), (0.0493, "$0.05"), (0.0012345, "$0.00123"), (0.000015, "$0.0000150")],
)
def test_status_shows_dollars_to_the_cent_or_three_digits(amount: float, shown: str) -> None:
    assert usd(amount) == shown


async def test_an_acquire_that_pulls_its_image_is_cold_and_says_so(no_task_leaks: None) -> None:
    task = "127.0.0.1:5000/swe/task-0:v1"
    backend = FakeBackend(images={IMAGE})
    backend.registry.add(task, 40 << 20)
    exporter = InMemorySpanExporter()
    telemetry = Telemetry(TelemetrySettings(), span_processors=(SimpleSpanProcessor(exporter),))
    app = build_app(make_settings(), backend=backend, persist=False, telemetry=telemetry)
    await app.start()
    try:
        async with AsyncClient(app.address) as client:
            await client.create_pool("swe", IMAGE, max_size=4, images=["*"])
            r = RolloutClient(client)
            # No pool on the run: nothing announces the image ahead, the acquire pulls it.
            await r.configure("run", batch_groups=1, group_size=1, max_staleness=0)
            (slot,) = await r.request_slots("run")
            async with client.acquire("swe", image=task) as box:
                await r.report_progress("run", slot.group_id, lease_ids=[box.lease_id])
                await r.submit("run", slot.group_id, [trajectory("t", sandbox_id=box.id, verifier="echo 1")])
            async for batch in r.pull("run", max_batches=1):
                await r.ack("run", batch.batch_id)
            f = await r.figures("run")
    finally:
        await app.stop(grace=0.5)
    assert backend.registry.pulls[task] == 1
    assert (f.lifecycle.image_pulls, f.lifecycle.cold_sandboxes, f.lifecycle.warm_sandboxes) == (1, 1, 0)
    (spans,) = traces(exporter.get_finished_spans()).values()
    acquire = next(s for s in spans if s.name == STAGE_SPAN_PREFIX + "acquire")
    assert (acquire.attributes or {})["sandboxd.image_pulled"] is True
    assert (acquire.attributes or {})["sandboxd.warm"] is False
    assert any(s.name == SANDBOX_START_SPAN for s in spans)


async def test_a_group_dropped_as_stale_at_batching_ends_its_trace(
    traced: tuple[App, InMemorySpanExporter],
) -> None:
    app, exporter = traced
    async with AsyncClient(app.address) as client:
        r = RolloutClient(client)
        await r.configure("run", batch_groups=1, group_size=2, max_staleness=0)
        (old,) = await r.request_slots("run")
        await r.submit("run", old.group_id, [trajectory("old0", reward=1.0), trajectory("old1", reward=0.0)])
        await r.publish("run", 1)  # the queued group is now a version too old
        (new,) = await r.request_slots("run")
        await r.submit("run", new.group_id, [trajectory("new0", reward=1.0), trajectory("new1", reward=0.0)])
        async for batch in r.pull("run", max_batches=1):
            assert [g.group_id for g in batch.groups] == [new.group_id]
            await r.ack("run", batch.batch_id)
        f = await r.figures("run")
    roots = {tid: spans[0] for tid, spans in traces(exporter.get_finished_spans()).items()}
    assert {tid: (s.attributes or {})["sandboxd.outcome"] for tid, s in roots.items()} == {
        "old0": "dropped", "old1": "dropped", "new0": "consumed", "new1": "consumed",
    }  # fmt: skip
    assert (roots["old0"].attributes or {})["sandboxd.reason"] == "stale"
    assert f.lifecycle.traces == 4
