"""Snapshots of leased sandboxes: taking, finding and deleting them.
Restoring one hands out a lease, so it lives with the leases (``aio``)."""

from __future__ import annotations

from collections.abc import Mapping

from sandboxd.client.rpc import Connection, rpc_errors
from sandboxd.v1 import snapshots_pb2


class SnapshotCalls(Connection):
    """The client's snapshot calls, restore aside."""

    async def snapshot(
        self,
        sandbox_id: str,
        *,
        session: str = "",
        labels: Mapping[str, str] | None = None,
        policy_version: int | None = None,
        turn: int = 0,
        ttl: float = 0.0,
        live: bool = False,
    ) -> snapshots_pb2.Snapshot:
        """Snapshots a leased sandbox's workspace and the cwd and exported
        environment of ``session`` (if given). ``live``: checkpoints the
        running sandbox instead (gVisor pools): memory, the processes started
        through ``Sandbox.keep`` and the workspace; it keeps running."""
        request = snapshots_pb2.SnapshotRequest(
            sandbox_id=sandbox_id,
            session=session,
            labels=labels or {},
            policy_version=policy_version,
            turn=turn,
            ttl_seconds=ttl,
            live=live,
        )
        with rpc_errors():
            response: snapshots_pb2.SnapshotResponse = await self.snapshots.Snapshot(
                request, metadata=self.metadata
            )
        return response.snapshot

    async def get_snapshot(self, snapshot_id: str) -> snapshots_pb2.Snapshot:
        """A snapshot with its lineage (``chain``, oldest first)."""
        with rpc_errors():
            response: snapshots_pb2.GetSnapshotResponse = await self.snapshots.GetSnapshot(
                snapshots_pb2.GetSnapshotRequest(snapshot_id=snapshot_id), metadata=self.metadata
            )
        return response.snapshot

    async def list_snapshots(
        self, *, labels: Mapping[str, str] | None = None, pool: str = "", parent_id: str = ""
    ) -> list[snapshots_pb2.Snapshot]:
        """Live snapshots whose labels all match (and pool / parent, when set)."""
        request = snapshots_pb2.ListSnapshotsRequest(labels=labels or {}, pool=pool, parent_id=parent_id)
        with rpc_errors():
            response = await self.snapshots.ListSnapshots(request, metadata=self.metadata)
        return list(response.snapshots)

    async def delete_snapshot(self, snapshot_id: str) -> None:
        """Deletes a snapshot; snapshots made from it keep working."""
        with rpc_errors():
            await self.snapshots.DeleteSnapshot(
                snapshots_pb2.DeleteSnapshotRequest(snapshot_id=snapshot_id), metadata=self.metadata
            )
