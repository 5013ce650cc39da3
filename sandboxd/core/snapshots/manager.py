"""The snapshot manager: the one object the servicers, the rollout service and
the app see. It wires capture, restore, the catalog, the packed blob store
and the collector together, and answers lookups itself."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from sandboxd.clock import Clock
from sandboxd.core import validation as v
from sandboxd.core.leases import Lease
from sandboxd.core.lifecycle import SandboxRecord
from sandboxd.core.root_setting import refuse_writable_root
from sandboxd.core.snapshots.baselines import Baselines
from sandboxd.core.snapshots.capture import Capture
from sandboxd.core.snapshots.catalog import SnapshotCatalog
from sandboxd.core.snapshots.contents import Contents
from sandboxd.core.snapshots.gc import GcResult, Pins, collect
from sandboxd.core.snapshots.info import SnapshotInfo
from sandboxd.core.snapshots.journal import Budget, Watcher
from sandboxd.core.snapshots.listing import Baseline
from sandboxd.core.snapshots.live import LiveSnapshots
from sandboxd.core.snapshots.packs import PackedBlobs
from sandboxd.core.snapshots.restore import Restore
from sandboxd.core.snapshots.tars import Tars
from sandboxd.core.snapshots.workspaces import Workspaces
from sandboxd.core.tenancy import current_tenant
from sandboxd.errors import AlreadyExists, FailedPrecondition, NotFound
from sandboxd.settings import SnapshotSettings
from sandboxd.stores.base import BlobStore

if TYPE_CHECKING:
    from sandboxd.core.control import ControlPlane

log = logging.getLogger(__name__)


class SnapshotManager:
    """Snapshots of the current tenant: take, look up, list, delete, restore
    (fork), and collect what no snapshot needs any more."""

    def __init__(
        self,
        control: ControlPlane,
        catalog: SnapshotCatalog,
        blobs: BlobStore,
        settings: SnapshotSettings,
        clock: Clock,
        staging: Path | None = None,
    ) -> None:
        """``staging``: where live snapshots' checkpoint images are written
        and read back, this instance's alone (on the engine's host; None: a
        temporary directory); emptied at start and stop."""
        self._catalog = catalog
        self._control = control
        self.blobs = PackedBlobs(blobs, catalog)
        self.settings = settings
        self._clock = clock
        self._pins = Pins()
        budget = Budget.from_host(
            settings.inotify_watches_per_sandbox, settings.inotify_watches_total, settings.inotify_instances
        )
        self._baselines = Baselines(budget)
        self._tars = Tars(self.blobs)
        self._workspaces = Workspaces(control, settings)
        self._capture = Capture(
            control,
            catalog,
            Contents(catalog, self.blobs, self._pins, self._workspaces),
            self._workspaces,
            self._baselines,
            self._pins,
            settings,
            self._now,
        )
        self._restore = Restore(control, catalog, self._tars, self._workspaces, self._baselines, self._pins)
        self._live = LiveSnapshots(
            control,
            catalog,
            self.blobs,
            self._workspaces,
            self._pins,
            settings,
            self._now,
            staging or Path(tempfile.gettempdir()) / f"sandboxd-live-{secrets.token_hex(6)}",
            self._baselines,
        )
        self._gc_task: asyncio.Task[None] | None = None

    def _now(self) -> float:
        # Read through the manager, so a clock swapped in later is the one used.
        return self._clock.time()

    # -- start and stop -------------------------------------------------------

    async def start(self) -> None:
        """Opens the catalog and starts periodic GC (if configured)."""
        await self._catalog.open()
        await self._live.clear()
        if self.settings.gc_interval_seconds > 0:
            self._gc_task = asyncio.create_task(self._gc_loop(), name="snapshot-gc")

    async def stop(self) -> None:
        """Stops GC and the change journals, then closes the catalog and the store."""
        self._baselines.close()
        if self._gc_task is not None:
            self._gc_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._gc_task
        await self._catalog.close()
        await self.blobs.close()
        await self._live.clear()

    async def _gc_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.gc_interval_seconds)
            try:
                await self.gc()
            except Exception:  # keep collecting whatever one round hit
                log.exception("snapshot GC round failed")

    # -- snapshot and restore -------------------------------------------------

    async def snapshot(
        self,
        sandbox_id: str,
        *,
        session: str = "",
        labels: dict[str, str] | None = None,
        policy_version: int | None = None,
        turn: int = 0,
        ttl: float = 0.0,
        live: bool = False,
    ) -> SnapshotInfo:
        """Snapshots the current tenant's leased sandbox (workspace, and
        ``session``'s cwd and environment if named); incremental on the
        sandbox's last snapshot or restore. ``live``: checkpoints the running
        sandbox instead (processes, memory, workspace, and a writable
        root's changes). A file snapshot of a sandbox with a writable root is
        FAILED_PRECONDITION (sandboxd.core.root_setting)."""
        if not live:
            rec = self._control.registry.leased(sandbox_id)
            pool = self._control.registry.pools.get(rec.pool)
            if pool is not None:
                refuse_writable_root(pool.config, f"take a file snapshot of sandbox {rec.sandbox_id}")
        if live:
            return await self._live.snapshot(
                sandbox_id, session=session, labels=labels, policy_version=policy_version, turn=turn, ttl=ttl
            )
        return await self._capture.snapshot(
            sandbox_id, session=session, labels=labels, policy_version=policy_version, turn=turn, ttl=ttl
        )

    async def restore(
        self,
        snapshot_id: str,
        *,
        n: int = 1,
        pool: str = "",
        labels: dict[str, str] | None = None,
        ttl: float = 0.0,
        timeout: float = 0.0,
        call_remaining: float | None = None,
        network: tuple[str, ...] = (),
        request_id: str = "",
    ) -> tuple[Lease, list[SandboxRecord], SnapshotInfo]:
        """Restores a snapshot into ``n`` sandboxes leased under one lease
        (a fork when n > 1), under ``network`` rules narrower than the pool's
        when given; on any failure every one of them is destroyed. The lease
        is found by ``request_id`` (when given) as an Acquire's is, so that a
        client that gave up on the call can release it."""
        if request_id:
            granted = self._control.leases.find_request(
                current_tenant(), v.request_id("request_id", request_id)
            )
            if granted is not None:
                # Answering it again would restore over what its holder did since.
                raise AlreadyExists(
                    f"request_id {request_id!r} was granted lease {granted.lease_id}, still in force; "
                    "give each Restore its own id"
                )
        info = await self.get(snapshot_id)
        restore = self._live.restore if info.live else self._restore.restore
        return await restore(
            info,
            n=n,
            pool=pool,
            labels=labels,
            ttl=ttl,
            timeout=timeout,
            call_remaining=call_remaining,
            network=network,
            request_id=request_id,
        )

    # -- lookups --------------------------------------------------------------

    async def get(self, snapshot_id: str) -> SnapshotInfo:
        """The current tenant's unexpired snapshot; NotFound otherwise."""
        v.object_id("snapshot_id", snapshot_id, "snapshot")
        info = await self._catalog.get(snapshot_id)
        if info is None or info.tenant != current_tenant() or info.expires_at <= self._clock.time():
            raise NotFound(f"snapshot {snapshot_id!r} not found (deleted, expired or never taken)")
        return info

    async def list_snapshots(
        self, labels: dict[str, str] | None = None, pool: str = "", parent_id: str = ""
    ) -> list[SnapshotInfo]:
        """The current tenant's unexpired snapshots that match every filter given."""
        wanted = v.labels("labels", labels or {})
        out = []
        for info in await self._catalog.list_infos(current_tenant(), self._clock.time()):
            if pool and info.pool != pool:
                continue
            if parent_id and info.parent_id != parent_id:
                continue
            if any(info.labels.get(k) != val for k, val in wanted.items()):
                continue
            out.append(info)
        return out

    async def delete(self, snapshot_id: str) -> None:
        """Deletes a snapshot (hidden until nothing builds on it any more)."""
        try:
            snapshot_id = (await self.get(snapshot_id)).id
        except FailedPrecondition:
            # A record that cannot be read is still its tenant's to delete.
            if await self._catalog.tenant_of(snapshot_id) != current_tenant():
                raise NotFound(f"snapshot {snapshot_id!r} not found") from None
        await self._catalog.delete(snapshot_id, self._pins.kept_snapshots())
        self._tars.forget(snapshot_id)

    async def usage(self) -> int:
        """Bytes the current tenant's snapshots hold (distinct blobs)."""
        return await self._catalog.usage(current_tenant())

    # -- garbage collection ---------------------------------------------------

    async def gc(self) -> GcResult:
        """Drops expired snapshots, then deletes every stored blob that no
        snapshot references and no operation in flight has pinned."""
        return await collect(self._catalog, self.blobs, self._pins, self._tars, self._now)

    # -- helpers for tests and tools ------------------------------------------

    def pinned(self) -> int:
        """Blob pins held by operations in flight (0 when idle)."""
        return self._pins.count()

    @property
    def watcher(self) -> Watcher:
        """The change journals' inotify instances, their budget and the journals that fell back to walks."""
        return self._baselines.watcher

    def baseline_of(self, sandbox_id: str) -> Baseline | None:
        """What the next snapshot of ``sandbox_id`` builds on, if anything."""
        return self._baselines.get(sandbox_id)

    def forget_tar_cache(self) -> None:
        """Drops every cached restore archive (so the next restore builds one)."""
        self._tars.clear()
