"""The leases ``/run_code`` holds, each owned from its grant until its release
is confirmed.

Whatever lets go of a sandbox (a request's end, a failed clean-up or
preparation, the reserve's surplus, a heartbeat the server refused, the app's
close) releases its lease here, once. Owning leases apart from the paths that
use them is what makes close complete: a task cancelled before its first step
runs none of its own clean-up, and a request still running when the app closes
has not given its sandbox back, yet both leases are owned here, so ``close``
releases them and waits until every release has been answered. A lease that
outlived close would outlive the server's shutdown too, which keeps leased
sandboxes for the next start to adopt.

A release is retried while the server cannot answer it
(sandboxd.client.releasing), and nobody who asks for one can cut it short
by being cancelled.
"""

from __future__ import annotations

import asyncio
import logging

from sandboxd.client import Lease
from sandboxd.client.releasing import release_lease

__all__ = ["HeldLeases"]

log = logging.getLogger(__name__)


class HeldLeases:
    """The leases of one run-code app's sandboxes, and their releases."""

    def __init__(self, pool: str) -> None:
        self.pool = pool
        self._owned: dict[str, Lease] = {}
        self._releasing: dict[str, asyncio.Task[None]] = {}

    def __len__(self) -> int:
        return len(self._owned)

    def own(self, lease: Lease) -> None:
        """Takes ``lease`` on as soon as it is granted (before anything can be cancelled)."""
        self._owned[lease.id] = lease

    def owns(self, lease: Lease) -> bool:
        """Whether ``lease`` is held and not yet released."""
        return lease.id in self._owned

    def release(self, lease: Lease) -> bool:
        """Releases ``lease`` in the background; False if it is not held or already being
        released (a second release of the same sandbox is a no-op)."""
        if lease.id not in self._owned or lease.id in self._releasing:
            return False
        task = asyncio.ensure_future(self._release(lease))
        self._releasing[lease.id] = task
        task.add_done_callback(self._released)
        return True

    def _released(self, task: asyncio.Task[None]) -> None:
        for lease_id, t in list(self._releasing.items()):
            if t is task:
                del self._releasing[lease_id]
        if not task.cancelled() and (e := task.exception()) is not None:
            log.warning("pool %s: a release failed: %r", self.pool, e)

    async def _release(self, lease: Lease) -> None:
        await release_lease(lease.release, lease.id, f"run-code pool {self.pool}")
        # Not on cancellation (the loop is going away): then it stays held.
        self._owned.pop(lease.id, None)

    async def close(self) -> int:
        """Releases every lease still held and waits for every release, including those
        started before (a cancelled close leaves them running); returns how many
        releases it started."""
        started = sum(self.release(lease) for lease in list(self._owned.values()))
        while self._releasing:
            await asyncio.wait(set(self._releasing.values()))
        return started
