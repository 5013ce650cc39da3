"""Lineage: which snapshot a new one descends from, and the labels a restored
sandbox carries so that its next snapshot (and an operator) can tell."""

from __future__ import annotations

import secrets

from sandboxd.core.lifecycle import SandboxRecord
from sandboxd.core.snapshots.catalog import SnapshotCatalog
from sandboxd.core.snapshots.info import ChainRef, SnapshotInfo
from sandboxd.core.snapshots.listing import Baseline

LABEL_SNAPSHOT = "sandboxd.snapshot"
LABEL_POLICY = "sandboxd.snapshot.policy_version"
LABEL_TURN = "sandboxd.snapshot.turn"


def new_snapshot_id() -> str:
    """A fresh, unguessable snapshot id."""
    return "sn-" + secrets.token_hex(12)


def lineage_labels(info: SnapshotInfo) -> dict[str, str]:
    """Labels a sandbox restored from ``info`` carries."""
    out = {LABEL_SNAPSHOT: info.id, LABEL_TURN: str(info.turn)}
    if info.policy_version is not None:
        out[LABEL_POLICY] = str(info.policy_version)
    return out


async def parent_of(
    catalog: SnapshotCatalog, rec: SandboxRecord, baseline: Baseline | None
) -> tuple[str, list[ChainRef]]:
    """(parent id, the parent's chain) of a snapshot of ``rec`` now: its
    baseline's snapshot, else the snapshot it was restored from ("" if none)."""
    if baseline is not None:
        return baseline.snapshot_id, list(baseline.chain)
    parent_id = rec.labels.get(LABEL_SNAPSHOT, "")
    if not parent_id:
        return "", []
    parent = await catalog.get(parent_id)
    return parent_id, list(parent.chain) if parent is not None else []
