"""Leases granted to calls whose answer never reached the client.

An Acquire or a Restore whose call ends cancelled after the lease was
granted leaves a lease nobody knows of: nobody would heartbeat or release it,
and it would hold its sandboxes until its TTL (and across a restart, which
keeps leases for their clients). So each such call watches its context: if it
ends with the status CANCELLED, the lease is released, and the server waits
for those releases when it stops, so that none is cut short.

A client's own cancellation does not reach the context once the lease is
granted (gRPC reports only the status the server sent, and an answer handed to
the transport may still never be read): for that, each Acquire and Restore
carries a request id, and the client releases by it what a call it gave up on
was granted.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from sandboxd.core.control import ControlPlane

__all__ = ["Abandoned"]

log = logging.getLogger(__name__)

# The longest the server's stop waits for releases of abandoned leases.
_DRAIN_SECONDS = 10.0


class Abandoned:
    """Releases the leases of cancelled calls; ``drain`` waits for those releases."""

    def __init__(self, control: ControlPlane) -> None:
        self._control = control
        self._releasing: set[asyncio.Task[None]] = set()

    def watch(self, context: Any, lease_id: str) -> None:
        """Releases ``lease_id`` if the call of ``context`` ends cancelled
        (its answer was not sent): called once the lease is granted."""
        context.add_done_callback(lambda ctx: self._release_if_cancelled(ctx, lease_id))

    def _release_if_cancelled(self, context: Any, lease_id: str) -> None:
        if context.cancelled():
            task = asyncio.get_running_loop().create_task(self._release(lease_id))
            self._releasing.add(task)
            task.add_done_callback(self._releasing.discard)

    async def _release(self, lease_id: str) -> None:
        try:
            await self._control.abandon(lease_id)
        except Exception:
            # Nobody awaits this task: its failure is only seen here.
            log.exception("the abandoned lease %s was not released; it ends with its TTL", lease_id)

    async def drain(self, timeout: float = _DRAIN_SECONDS) -> None:
        """Waits up to ``timeout`` seconds for the releases under way (at stop,
        after the last call ended and before the pools stop)."""
        if not self._releasing:
            return
        pending = set(self._releasing)
        _, late = await asyncio.wait(pending, timeout=timeout)
        if late:
            log.warning(
                "%d release(s) of abandoned leases did not finish in %.0fs; those leases end with their TTL",
                len(late),
                timeout,
            )
