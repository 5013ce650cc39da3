"""SnapshotService: snapshot, restore (fork), inspect, list, delete."""

from __future__ import annotations

from typing import Any

from sandboxd.api.abandoning import Abandoned
from sandboxd.api.convert import lease_to, sandbox_to, ts
from sandboxd.core import validation as v
from sandboxd.core.narrowing import asked_network
from sandboxd.core.snapshots import SnapshotInfo, SnapshotManager
from sandboxd.errors import printable
from sandboxd.v1 import snapshots_pb2, snapshots_pb2_grpc


def exact(text: str) -> bytes:
    """The bytes a session's text stands for (sandboxd holds bytes that are
    not UTF-8 as surrogate escapes)."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate not from an escape
        return text.encode("utf-8", "surrogatepass")


def snapshot_to(info: SnapshotInfo) -> snapshots_pb2.Snapshot:
    """A snapshot's wire form with its ancestry; ``policy_version`` is set only where one was recorded."""
    msg = snapshots_pb2.Snapshot(
        id=info.id,
        pool=info.pool,
        image=info.image,
        labels=info.labels,
        turn=info.turn,
        parent_id=info.parent_id,
        session=info.session,
        cwd=printable(info.cwd),
        env={k: printable(val) for k, val in info.env.items()},
        cwd_bytes=exact(info.cwd),
        env_bytes={k: exact(val) for k, val in info.env.items()},
        size_bytes=info.size_bytes,
        stored_bytes=info.stored_bytes,
        entry_count=info.entry_count,
        digest=info.digest,
        created_at=ts(info.created_at),
        expires_at=ts(info.expires_at),
        live=info.live,
        memory_limit_bytes=info.memory_limit_bytes,
        not_carried=[printable(p) for p in info.not_carried],
    )
    if info.policy_version is not None:
        msg.policy_version = info.policy_version
    for ref in info.chain:
        item = msg.chain.add(id=ref.id, turn=ref.turn, created_at=ts(ref.created_at))
        if ref.policy_version is not None:
            item.policy_version = ref.policy_version
    return msg


class SnapshotServicer(snapshots_pb2_grpc.SnapshotServiceServicer):
    """SnapshotService over the snapshot manager; a call only ever sees the caller's tenant's snapshots.
    ``abandoned`` releases what a cancelled Restore was granted (shared with Acquire)."""

    def __init__(self, snapshots: SnapshotManager, abandoned: Abandoned) -> None:
        self._snapshots = snapshots
        self._abandoned = abandoned

    async def Snapshot(
        self, request: snapshots_pb2.SnapshotRequest, context: Any
    ) -> snapshots_pb2.SnapshotResponse:
        """INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION (not leased, uncarriable workspace),
        RESOURCE_EXHAUSTED (over quota or never restorable); nothing is stored on failure.
        ``live``: FAILED_PRECONDITION naming the runtime or backend that cannot checkpoint."""
        info = await self._snapshots.snapshot(
            request.sandbox_id,
            session=request.session,
            labels=v.settable_labels("labels", dict(request.labels)),
            policy_version=request.policy_version if request.HasField("policy_version") else None,
            turn=request.turn,
            ttl=request.ttl_seconds,
            live=request.live,
        )
        return snapshots_pb2.SnapshotResponse(snapshot=snapshot_to(info))

    async def Restore(
        self, request: snapshots_pb2.RestoreRequest, context: Any
    ) -> snapshots_pb2.RestoreResponse:
        """INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION (does not fit the pool, or corrupt),
        DEADLINE_EXCEEDED (too few warm sandboxes in time); nothing stays leased on failure."""
        lease, records, info = await self._snapshots.restore(
            request.snapshot_id,
            n=request.n,
            pool=request.pool,
            labels=v.settable_labels("labels", dict(request.labels)),
            ttl=request.lease_ttl_seconds,
            timeout=request.timeout_seconds,
            call_remaining=context.time_remaining(),
            network=asked_network(request.network, request.no_network),
            request_id=request.request_id,
        )
        # A call ended CANCELLED from here on never delivers the lease (see api.abandoning).
        self._abandoned.watch(context, lease.lease_id)
        return snapshots_pb2.RestoreResponse(
            lease=lease_to(lease),
            sandboxes=[sandbox_to(r, lease) for r in records],
            snapshot=snapshot_to(info),
        )

    async def GetSnapshot(
        self, request: snapshots_pb2.GetSnapshotRequest, context: Any
    ) -> snapshots_pb2.GetSnapshotResponse:
        """NOT_FOUND for an unknown or expired snapshot."""
        info = await self._snapshots.get(request.snapshot_id)
        return snapshots_pb2.GetSnapshotResponse(snapshot=snapshot_to(info))

    async def ListSnapshots(
        self, request: snapshots_pb2.ListSnapshotsRequest, context: Any
    ) -> snapshots_pb2.ListSnapshotsResponse:
        """The caller's live snapshots matching all labels (and pool, parent when set);
        INVALID_ARGUMENT for bad labels."""
        infos = await self._snapshots.list_snapshots(dict(request.labels), request.pool, request.parent_id)
        return snapshots_pb2.ListSnapshotsResponse(snapshots=[snapshot_to(i) for i in infos])

    async def DeleteSnapshot(
        self, request: snapshots_pb2.DeleteSnapshotRequest, context: Any
    ) -> snapshots_pb2.DeleteSnapshotResponse:
        """NOT_FOUND for an unknown or expired snapshot; its children keep working."""
        await self._snapshots.delete(request.snapshot_id)
        return snapshots_pb2.DeleteSnapshotResponse()
