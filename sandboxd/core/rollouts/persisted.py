"""What the rollout store keeps of a run's queue (its counters, groups and
batches as JSON) and how a restarted run is put back from it."""

from __future__ import annotations

from typing import Any

from sandboxd.core.rollouts.model import Batch, GroupState, group_from_json, group_to_json
from sandboxd.core.rollouts.queue import RolloutQueue


def batch_to_json(b: Batch) -> dict[str, Any]:
    """What the store keeps of a batch: no stream or deadline, as a restart redelivers it."""
    return {
        "batch_id": b.batch_id,
        "groups": [group_to_json(g) for g in b.groups],
        "policy_version": b.policy_version,
        "delivery": b.delivery,
    }


def state_of(q: RolloutQueue) -> dict[str, Any]:
    """The queue's counters and version, as JSON for the store; ``restore`` reads them back."""
    return {
        "version": q.version,
        "accepted_total": q.accepted_total,
        "consumed_groups": q.consumed_groups,
        "filtered": dict(q.filtered),
        "infra_masked": q.infra_masked,
        "backfilled": {str(k): v for k, v in q.backfilled.items()},
        "cohort_done": {str(k): v for k, v in q.cohort_done.items()},
        "target": q.target,
        "seq": q._seq,
    }


def restore(
    q: RolloutQueue, state: dict[str, Any], groups: list[dict[str, Any]], batches: list[dict[str, Any]]
) -> None:
    """Puts a restarted run back as it was; delivered batches wait for redelivery."""
    q.version = int(state["version"])
    q.accepted_total = int(state["accepted_total"])
    q.consumed_groups = int(state["consumed_groups"])
    q.filtered.update(state["filtered"])
    q.infra_masked = int(state["infra_masked"])
    q.backfilled.update({int(k): v for k, v in dict(state["backfilled"]).items()})
    q.cohort_done.update({int(k): v for k, v in dict(state["cohort_done"]).items()})
    q.target = int(state["target"])
    q._seq = int(state["seq"])
    for body in groups:
        g = group_from_json(body)
        if g.state is GroupState.RUNNING:
            q.running[g.group_id] = g
        elif g.state is GroupState.QUEUED:
            q.queued.append(g)
        elif g.state is GroupState.PARKED:
            g.snapshots_ready = True
            q.parked[g.group_id] = g
    q.queued.sort(key=lambda g: g.accepted_seq)
    for body in batches:
        b = Batch(
            str(body["batch_id"]),
            [group_from_json(g) for g in body["groups"]],
            int(body["policy_version"]),
            delivery=int(body["delivery"]),
        )
        q.batches[b.batch_id] = b
        q.redeliver.append(b.batch_id)
