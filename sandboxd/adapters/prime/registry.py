"""The sandbox registry behind the Prime routes: Prime sandboxes by id and
the sandboxd leases they hold, the pools their images map to, and the loop
that heartbeats every lease and ends sandboxes past their time."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import secrets
import time
from collections import deque
from collections.abc import Callable

from sandboxd import errors
from sandboxd.client import AsyncClient, Lease
from sandboxd.client.releasing import release_lease

from .sandbox import TERMINAL, PrimeSandbox, utc_now
from .settings import PrimeSettings

__all__ = ["PrimeServer"]

log = logging.getLogger(__name__)

_GIB = 1 << 30


class PrimeServer:
    """The state behind the routes: sandboxes by id, the pools they map to,
    and one loop that heartbeats every lease and ends expired sandboxes."""

    def __init__(
        self, client: AsyncClient, settings: PrimeSettings, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.client = client
        self.settings = settings
        self._clock = clock
        self._boxes: dict[str, PrimeSandbox] = {}
        self._finished: deque[str] = deque()
        self._idempotency: dict[str, str] = {}
        self._pools: dict[tuple[str, float, float, float], str] = {}
        self._pool_locks: dict[tuple[str, float, float, float], asyncio.Lock] = {}
        self._secret = secrets.token_bytes(32)
        self._keeper: asyncio.Task[None] | None = None

    # -- lookups ----------------------------------------------------------

    def find(self, sandbox_id: str) -> PrimeSandbox | None:
        """The sandbox with this id, if it is remembered."""
        return self._boxes.get(sandbox_id)

    def sandboxes(self) -> list[PrimeSandbox]:
        """Every sandbox remembered, live or finished."""
        return list(self._boxes.values())

    def for_idempotency_key(self, key: str) -> PrimeSandbox | None:
        """The sandbox an earlier create with this key made, if remembered."""
        sandbox_id = self._idempotency.get(key)
        return None if sandbox_id is None else self._boxes.get(sandbox_id)

    def touch(self, box: PrimeSandbox) -> None:
        """Marks ``box`` active now (for its idle timeout)."""
        box.last_active = self._clock()

    # -- lifecycle --------------------------------------------------------

    async def start(self) -> None:
        """Starts the loop that heartbeats leases and ends expired sandboxes."""
        self._keeper = asyncio.create_task(self._keep())

    async def close(self) -> None:
        """Ends every sandbox this server holds (their leases are released)."""
        if self._keeper is not None:
            self._keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keeper
        live = [b for b in self._boxes.values() if b.status not in TERMINAL]
        pending = [b.task for b in live if b.task is not None]
        await asyncio.gather(*(self.end(b, "TERMINATED", None, None, "server shutdown") for b in live))
        await asyncio.gather(*pending, return_exceptions=True)

    def add(self, box: PrimeSandbox, idempotency_key: str | None = None) -> None:
        """Registers a new PENDING sandbox, gives it its gateway token and
        starts acquiring its lease behind it."""
        box.token = hmac.new(self._secret, box.id.encode(), hashlib.sha256).hexdigest()
        self._boxes[box.id] = box
        if idempotency_key is not None:
            self._idempotency[idempotency_key] = box.id
        box.task = asyncio.create_task(self._provision(box))

    async def end(
        self, box: PrimeSandbox, status: str, error_type: str | None, message: str | None, reason: str
    ) -> None:
        """Ends ``box`` with a terminal status and releases its lease."""
        if box.status in TERMINAL:
            return
        box.finish(status, error_type, message)
        box.termination_reason = reason
        task, box.task = box.task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
        lease, box.lease = box.lease, None
        if lease is not None:
            await asyncio.shield(self._release(lease))
        self._finished.append(box.id)
        while len(self._finished) > self.settings.keep_finished:
            self._boxes.pop(self._finished.popleft(), None)

    async def _keep(self) -> None:
        """Heartbeats leases, ends sandboxes past their lifetime or idle time."""
        interval = max(0.5, self.settings.lease_ttl / 3)
        while True:
            await asyncio.sleep(interval)
            now = self._clock()
            running = [b for b in self._boxes.values() if b.status == "RUNNING" and b.lease is not None]
            for box in running:
                idle = box.idle_timeout_minutes
                if box.ends_at is not None and now >= box.ends_at:
                    await self.end(
                        box, "TIMEOUT", "TIMEOUT", "the sandbox reached timeout_minutes", "timeout"
                    )
                elif idle and now - box.last_active >= idle * 60:
                    await self.end(box, "TIMEOUT", "IDLE_TIMEOUT", "the sandbox was idle too long", "idle")
            beats = [b for b in running if b.status == "RUNNING" and b.lease is not None]
            results = await asyncio.gather(
                *(self.client.heartbeat(b.lease.id) for b in beats if b.lease is not None),
                return_exceptions=True,
            )
            for box, result in zip(beats, results, strict=True):
                if isinstance(result, errors.NotFound | errors.FailedPrecondition):
                    await self.end(
                        box, "ERROR", "SANDBOX_LOST", f"the sandbox's lease ended: {result}", "lost"
                    )
                elif isinstance(result, Exception):
                    log.warning("heartbeat of %s failed: %s", box.id, result)

    # -- pools ------------------------------------------------------------

    async def _pool_for(self, box: PrimeSandbox) -> tuple[str, str]:
        """The pool a sandbox is leased from, and the image to ask it for
        ("" = the pool's own)."""
        mapped = self.settings.image_pools.get(box.image)
        if mapped:
            return mapped, ""
        if self.settings.template_pool:
            return self.settings.template_pool, box.image
        return await self._own_pool(box), ""

    async def _own_pool(self, box: PrimeSandbox) -> str:
        key = (box.image, box.cpu_cores, box.memory_gb, box.disk_size_gb)
        if key in self._pools:
            return self._pools[key]
        async with self._pool_locks.setdefault(key, asyncio.Lock()):
            if key in self._pools:
                return self._pools[key]
            name = "prime-" + hashlib.sha256(repr(key).encode()).hexdigest()[:16]
            limits = {
                "memory_bytes": int(box.memory_gb * _GIB),
                "cpu_millis": int(box.cpu_cores * 1000),
                "disk_bytes": int(box.disk_size_gb * _GIB),
            }
            s = self.settings
            # An existing pool was made by an earlier run of this server.
            with contextlib.suppress(errors.AlreadyExists):
                await self.client.create_pool(
                    name,
                    box.image,
                    min_ready=s.min_ready,
                    max_ready=s.max_ready,
                    max_size=s.max_size,
                    limits=limits,
                    labels={"sandboxd.adapter": "prime"},
                )
            self._pools[key] = name
            return name

    async def _provision(self, box: PrimeSandbox) -> None:
        lease: Lease | None = None
        try:
            pool, image = await self._pool_for(box)
            lease = await self.client.lease(
                pool,
                image=image,
                labels={"prime.sandbox": box.id},
                lease_ttl=self.settings.lease_ttl,
                timeout=self.settings.acquire_timeout,
            )
            if box.status != "PENDING":
                return  # deleted while it waited: the finally releases the lease
            box.lease, box.sandbox, lease = lease, lease.sandboxes[0].id, None
            box.status, box.started_at, box.updated_at = "RUNNING", utc_now(), utc_now()
            box.last_active = self._clock()
            if box.timeout_minutes > 0:
                box.ends_at = self._clock() + box.timeout_minutes * 60
        except errors.FailedPrecondition as e:
            kind = "IMAGE_PULL_FAILED" if "image" in e.message.lower() else "PROVISIONING_FAILED"
            await self.end(box, "ERROR", kind, e.message, "error")
        except errors.Unavailable as e:
            # The registry could not be reached for the image's pull.
            await self.end(box, "ERROR", "IMAGE_PULL_FAILED", e.message, "error")
        except errors.DeadlineExceeded as e:
            await self.end(box, "ERROR", "PROVISIONING_TIMEOUT", e.message, "error")
        except errors.SandboxdError as e:
            await self.end(box, "ERROR", "PROVISIONING_FAILED", e.message, "error")
        finally:
            if lease is not None:
                await asyncio.shield(self._release(lease))

    async def _release(self, lease: Lease) -> None:
        # Retried while the server cannot answer: no longer held here, the lease
        # would otherwise outlive this server, its sandbox with it.
        await release_lease(lambda: self.client.release(lease.id), lease.id, "prime")
