"""A few rollouts through the rollout queue the way a generator and trainer
run them (slot, acquire, progress, a command, submit with verifiers, pull,
ack), for the lifecycle and cost tests on the fake and the real engine; and
how to read their traces back from an in-memory exporter."""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan

from sandboxd import errors
from sandboxd.client import AsyncClient
from sandboxd.client.rollouts import RolloutClient, trajectory
from sandboxd.core.rollouts.spans import ROOT_SPAN
from sandboxd.v1 import rollouts_pb2 as pb

TOKENS_PER_TRAJECTORY = 250


async def run_rollouts(client: AsyncClient, pool: str, run: str, groups: int) -> tuple[pb.Figures, list[str]]:
    """Runs ``groups`` groups of two trajectories, one sandbox each, one
    group per step; returns the run's figures after the last ack and the
    sandbox ids used. The run must exist (batch_groups=1, group_size=2)."""
    r = RolloutClient(client)
    used: list[str] = []
    for i in range(groups):
        (slot,) = await r.request_slots(run)
        with contextlib.suppress(errors.ResourceExhausted):
            await r.request_slots(run)  # over the gate: queued (refused) until the trainer moves on
        sandboxes = [await client.lease(pool) for _ in range(2)]
        ids = [s[0].id for s in sandboxes]
        used += ids
        trajs = [
            trajectory(f"g{i}t{k}", sandbox_id=sid, segments=[(i, TOKENS_PER_TRAJECTORY)])
            for k, sid in enumerate(ids)
        ]
        await r.report_progress(run, slot.group_id, lease_ids=[s.id for s in sandboxes], trajectories=trajs)
        for sid in ids:
            await client.exec(sid, ["true"])
        # Rewards 1 and 0: a group with an advantage, admitted.
        scored = [
            trajectory(t.trajectory_id, sandbox_id=t.sandbox_id, segments=[(i, TOKENS_PER_TRAJECTORY)],
                       verifier=f"echo {1 - k}")
            for k, t in enumerate(trajs)
        ]  # fmt: skip
        group = await r.submit(run, slot.group_id, scored)
        assert group.outcome == pb.GROUP_OUTCOME_ADMITTED, group
        for s in sandboxes:
            await s.release()
        async for batch in r.pull(run, max_batches=1):
            await r.ack(run, batch.batch_id)
        await r.publish(run, i + 1)
    return await r.figures(run), used


def traces(spans: Sequence[ReadableSpan], run: str = "") -> dict[str, list[ReadableSpan]]:
    """Finished spans of rollout traces (of ``run`` only, when named), by
    trajectory id (each trace's spans, root first)."""
    by_trace: dict[int, list[ReadableSpan]] = defaultdict(list)
    for span in spans:
        assert span.context is not None
        by_trace[span.context.trace_id].append(span)
    out: dict[str, list[ReadableSpan]] = {}
    for group in by_trace.values():
        roots = [s for s in group if s.name == ROOT_SPAN]
        if not roots:
            continue
        assert len(roots) == 1, "one trace per trajectory"
        root = roots[0]
        if run and (root.attributes or {})["sandboxd.run"] != run:
            continue
        tid = str((root.attributes or {})["sandboxd.trajectory_id"])
        out[tid] = [root, *[s for s in group if s is not root]]
    return out
