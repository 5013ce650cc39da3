"""Live snapshots: a running gVisor sandbox checkpointed whole (memory, the
processes of its init tree, its tmpfs workspace and /tmp) and restored into
fresh sandboxes, n of them for a fork.

The checkpoint image (a directory of a few files) is written by the backend
into a staging directory and streamed as one deterministic archive
(sandboxd.core.snapshots.images; equal images are one blob) into the
snapshot store as a content-addressed blob of the tenant; the catalog
records it like a file snapshot whose only reference is that blob, so
quotas, TTL, deletion, garbage collection and lineage are the file
snapshots'. A restore streams the blob back, unpacking it while it checks
the digest and that it is an image (regular files with plain names,
checkpoint.img among them), before anything is leased; then it leases n
warm sandboxes of a gVisor pool and starts each from the image: they keep
their own container (limits, mounts, name, user) and continue every
process of the sandbox's: its shells are kept by its keeper, and only their
relays, engine execs, are lost (sandboxd.backends.docker.keeper). The
snapshot's session, if named, also gets its captured cwd and exported
environment set again (a no-op in its own shell; what a backend without kept
shells has).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from sandboxd.backends.base import LiveCheckpoints
from sandboxd.backends.snapshot_shell import restore_script
from sandboxd.core.leases import Lease
from sandboxd.core.lifecycle import SandboxRecord
from sandboxd.core.live_setting import refuse_keeperless
from sandboxd.core.pausing import live_backend
from sandboxd.core.root_setting import refuse_root_change
from sandboxd.core.snapshots import manifest as mf
from sandboxd.core.snapshots.baselines import Baselines
from sandboxd.core.snapshots.catalog import SnapshotCatalog
from sandboxd.core.snapshots.gc import Pins
from sandboxd.core.snapshots.images import Unpacker, archive_chunks, archived_size
from sandboxd.core.snapshots.info import SnapshotInfo
from sandboxd.core.snapshots.lineage import LABEL_SNAPSHOT, lineage_labels, parent_of
from sandboxd.core.snapshots.manifest import UnsafeSnapshot
from sandboxd.core.snapshots.packs import PackedBlobs, blob_key, tenant_namespace
from sandboxd.core.snapshots.restore import restore_target
from sandboxd.core.snapshots.taking import (
    SandboxLocks,
    SnapshotRequest,
    describe,
    requested,
    unpin_stored,
    within_quota,
)
from sandboxd.core.snapshots.workspaces import Workspaces
from sandboxd.core.tenancy import current_tenant, pool_key
from sandboxd.errors import (
    BackendError,
    FailedPrecondition,
    NotFound,
    SandboxdError,
)
from sandboxd.settings import SnapshotSettings

if TYPE_CHECKING:
    from sandboxd.core.control import ControlPlane

log = logging.getLogger(__name__)


class LiveSnapshots:
    """Takes and restores live snapshots of the current tenant's sandboxes."""

    def __init__(
        self,
        control: ControlPlane,
        catalog: SnapshotCatalog,
        blobs: PackedBlobs,
        workspaces: Workspaces,
        pins: Pins,
        settings: SnapshotSettings,
        now: Callable[[], float],
        staging: Path,
        baselines: Baselines | None = None,
    ) -> None:
        """``baselines``: where restores in progress are marked (a snapshot
        of their targets is refused until they answer)."""
        self._baselines = baselines or Baselines()
        self._control = control
        self._catalog = catalog
        self._blobs = blobs
        self._workspaces = workspaces
        self._pins = pins
        self._settings = settings
        self._now = now
        self._staging = staging
        self._locks = SandboxLocks()

    async def clear(self) -> None:
        """Removes what operations a previous run of this instance left staged."""
        await asyncio.to_thread(shutil.rmtree, self._staging, True)

    def _workdir(self) -> Path:
        where = self._staging / secrets.token_hex(8)
        where.mkdir(parents=True, mode=0o700)
        return where

    # -- snapshot -------------------------------------------------------------

    async def snapshot(
        self,
        sandbox_id: str,
        *,
        session: str = "",
        labels: dict[str, str] | None = None,
        policy_version: int | None = None,
        turn: int = 0,
        ttl: float = 0.0,
    ) -> SnapshotInfo:
        """Checkpoints the current tenant's leased sandbox, which keeps running."""
        rec, request = requested(
            self._control, self._baselines, self._settings, sandbox_id,
            session=session, labels=labels, policy_version=policy_version, turn=turn, ttl=ttl,
        )  # fmt: skip
        backend = live_backend(self._control, rec, "take a live snapshot of")
        pool = self._control.registry.pools.get(rec.pool)
        if pool is not None:
            refuse_keeperless(pool.config, f"take a live snapshot of sandbox {rec.sandbox_id}")
        quota = await within_quota(self._catalog, self._settings, current_tenant())
        self._locks.prune(self._control.is_live)
        async with self._locks.of(rec.sandbox_id):
            with self._control.using(rec):
                return await self._snapshot(rec, backend, request, quota)

    async def _snapshot(
        self, rec: SandboxRecord, backend: LiveCheckpoints, request: SnapshotRequest, quota: int
    ) -> SnapshotInfo:
        started = time.monotonic()
        tenant = current_tenant()
        ns = tenant_namespace(tenant)
        # Recorded like a file snapshot's (Get and List show it).
        cwd, env = await self._workspaces.session_state(rec, request.session)
        work = await asyncio.to_thread(self._workdir)
        pinned: list[str] = []
        recorded = False
        try:
            # Said, not silently dropped: what a restore will not have running.
            try:
                not_carried = await backend.not_carried(rec.handle)
            except BackendError as e:
                # A sandbox that cannot start one more process can still be checkpointed.
                log.warning("live snapshot of %s: its processes could not be listed: %s", rec.sandbox_id, e)
                not_carried = [f"unknown: the sandbox's processes could not be listed ({e})"]
            image = work / "image"
            await backend.checkpoint(rec.handle, image)
            checkpointed = time.monotonic()
            size = await asyncio.to_thread(archived_size, image)

            async def pin(key: str) -> None:
                pinned.extend(await self._pins.pin([key]))

            digest, stored = await self._blobs.put_stream(ns, archive_chunks(image), size, pin)
            parent = await parent_of(self._catalog, rec, None)
            info = describe(
                rec, request, tenant=tenant, now=self._now(), parent=parent, cwd=cwd, env=env,
                size_bytes=size, stored_bytes=stored, entry_count=0, digest=f"sha256:{digest}",
                live=True, not_carried=not_carried,
            )  # fmt: skip
            await self._catalog.insert(info, mf.encode([]), {blob_key(ns, digest): size}, quota)
            recorded = True
        finally:
            # A refused snapshot (over quota) leaves nothing stored.
            await unpin_stored(
                self._catalog, self._blobs, self._pins, tenant, pinned,
                failed=not recorded, what=f"live snapshot of {rec.sandbox_id}",
            )  # fmt: skip
            await asyncio.to_thread(shutil.rmtree, work, True)
        rec.labels[LABEL_SNAPSHOT] = info.id
        log.info(
            "live snapshot %s of %s: image %d bytes, %d new (parent %s); checkpoint %.0f ms, total %.0f ms; "
            "%d processes not carried",
            info.id, rec.sandbox_id, size, stored, info.parent_id or "-", (checkpointed - started) * 1000,
            (time.monotonic() - started) * 1000, len(not_carried),
        )  # fmt: skip
        return info

    # -- restore --------------------------------------------------------------

    async def restore(
        self,
        info: SnapshotInfo,
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
        """Leases ``n`` sandboxes (under ``network`` rules narrower than the
        pool's when given) and starts each from the snapshot's checkpoint; on
        any failure none stays leased."""
        n, labels, target = restore_target(self._control, info, n, pool, labels)
        name = target.config.name
        backend = self._control.backend
        refusal = (
            backend.live_refusal(target.config.runtime)
            if isinstance(backend, LiveCheckpoints)
            else "this backend cannot restore a running sandbox (only Docker with the gVisor runtime can)"
        )
        if refusal:
            raise FailedPrecondition(
                f"live snapshot {info.id} cannot be restored into pool {name!r}: {refusal}"
            )
        assert isinstance(backend, LiveCheckpoints)
        refuse_keeperless(target.config, f"restore live snapshot {info.id} into pool {name!r}")
        source = self._control.registry.pools.get(pool_key(info.tenant, info.pool))
        if source is not None:
            refuse_root_change(source.config, target.config, f"restore live snapshot {info.id}")
        memory = target.config.limits.memory_bytes
        if memory and (not info.memory_limit_bytes or memory < info.memory_limit_bytes):
            raise FailedPrecondition(
                f"live snapshot {info.id} was taken of a sandbox with "
                f"{info.memory_limit_bytes or 'unlimited'} bytes of memory; pool {name!r} sandboxes have "
                f"{memory}: its processes could not all be held"
            )
        digest = info.digest.removeprefix("sha256:")
        key = blob_key(tenant_namespace(info.tenant), digest)
        pinned = await self._pins.pin([key])
        work = await asyncio.to_thread(self._workdir)
        try:
            if not await self._catalog.exists(info.id):
                raise NotFound(f"snapshot {info.id!r} not found (deleted while restoring)")
            started = time.monotonic()
            image = await self._fetch(info, key, digest, work)
            fetched = time.monotonic()
            with self._control.reconciler.urgent(), self._baselines.restoring(info.id) as restoring:
                lease, records = await self._control.acquire(
                    pool or info.pool,
                    n,
                    0,
                    {**labels, **lineage_labels(info)},
                    ttl,
                    timeout,
                    call_remaining,
                    request_id=request_id,
                    network=network,
                )
                restoring.update(r.sandbox_id for r in records)
                try:
                    leased = time.monotonic()
                    await asyncio.gather(*(self._restore_into(backend, rec, info, image) for rec in records))
                except BaseException as e:
                    await asyncio.shield(self._control.release(lease.lease_id, []))
                    if isinstance(e, SandboxdError) and not isinstance(e, FailedPrecondition | NotFound):
                        raise FailedPrecondition(
                            f"restore of {info.id} failed and its sandboxes were destroyed: {e}"
                        ) from e
                    raise
        finally:
            self._pins.unpin(pinned)
            await asyncio.to_thread(shutil.rmtree, work, True)
        log.info(
            "live restore of %s into %d: image read and checked %.0f ms, leased %.0f ms, started %.0f ms",
            info.id, n, (fetched - started) * 1000, (leased - fetched) * 1000,
            (time.monotonic() - leased) * 1000,
        )  # fmt: skip
        return lease, records, info

    async def _fetch(self, info: SnapshotInfo, key: str, digest: str, work: Path) -> Path:
        """The snapshot's image, read back, unpacked under ``work`` and
        verified; UnsafeSnapshot when it is missing, corrupt or not a
        checkpoint image."""
        image = work / "image"
        unpacker = await asyncio.to_thread(Unpacker, image)
        sha = hashlib.sha256()
        read = 0
        # A parse failure is read to the end: only the digest tells a
        # corrupt image from a foreign one.
        refused: UnsafeSnapshot | None = None
        try:
            async for piece in self._blobs.open_stream(key, info.size_bytes):
                await asyncio.to_thread(sha.update, piece)  # sha256 releases the GIL
                read += len(piece)
                if refused is None:
                    try:
                        await asyncio.to_thread(unpacker.feed, piece)
                    except UnsafeSnapshot as e:
                        refused = e
            intact = read == info.size_bytes and sha.hexdigest() == digest
            if intact and refused is None:
                try:
                    unpacker.finish()
                except UnsafeSnapshot as e:
                    refused = e
        except NotFound as e:
            raise UnsafeSnapshot(
                f"live snapshot {info.id} was not restored: its checkpoint image is missing from the store"
            ) from e
        finally:
            unpacker.close()
        if not intact:
            raise UnsafeSnapshot(
                f"live snapshot {info.id} was not restored: its checkpoint image is corrupt (the store "
                f"holds {read} bytes that do not hash to the recorded {info.size_bytes}, {digest[:16]}...)"
            )
        if refused is not None:
            raise UnsafeSnapshot(f"live snapshot {info.id} was not restored: {refused}") from refused
        return image

    async def _restore_into(
        self, backend: LiveCheckpoints, rec: SandboxRecord, info: SnapshotInfo, image: Path
    ) -> None:
        with self._control.using(rec):
            await backend.restore_checkpoint(rec.handle, image)
            if info.session:
                script = restore_script(fixups=False, cwd=info.cwd, env=info.env)
                await self._workspaces.run(rec, script, session=info.session)
