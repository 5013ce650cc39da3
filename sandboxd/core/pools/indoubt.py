"""Sandboxes the engine never answered for: a create or destroy that timed
out may still be carried out by the engine later. They stay on the books
(counted against the global budget) until the engine answers again and a
listing by labels settles each one: found, it is destroyed; absent, it is
gone. Without this a wedged engine leaves containers nobody tracks until the
orphan sweep, minutes later."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sandboxd.backends.base import Backend
from sandboxd.clock import Clock
from sandboxd.core.lifecycle import SandboxRecord
from sandboxd.core.pools.congestion import Call
from sandboxd.core.pools.host import PoolHost

log = logging.getLogger(__name__)


@dataclass
class Doubt:
    """One sandbox whose create or destroy got no answer."""

    sandbox_id: str
    pool: str
    handle: str
    call: Call
    since: float


class InDoubt:
    """The book of sandboxes in doubt, and their resolution against a listing.
    ``observe(call, seconds)`` and ``timed_out(call, after)`` hear how the
    engine's list and destroy calls went."""

    def __init__(
        self,
        backend: Backend,
        clock: Clock,
        *,
        timeout: Callable[[], float],
        observe: Callable[[Call, float], None],
        timed_out: Callable[[Call, float], None],
    ) -> None:
        self._backend = backend
        self._clock = clock
        self._timeout = timeout
        self._observe = observe
        self._timed_out = timed_out
        self._doubts: dict[str, Doubt] = {}
        self.resolved_total = 0
        self.removed_total = 0

    def __len__(self) -> int:
        return len(self._doubts)

    def add(self, sandbox_id: str, pool: str, handle: str, call: Call) -> None:
        """Books a sandbox whose ``call`` got no answer."""
        if sandbox_id:
            self._doubts[sandbox_id] = Doubt(sandbox_id, pool, handle, call, self._clock.monotonic())

    def count(self, pool: str) -> int:
        """Sandboxes of ``pool`` in doubt."""
        return sum(1 for d in self._doubts.values() if d.pool == pool)

    def entries(self) -> list[Doubt]:
        """Every sandbox in doubt, oldest first."""
        return sorted(self._doubts.values(), key=lambda d: d.since)

    async def resolve(self) -> int:
        """Lists the backend (one call) and settles every doubt it can;
        returns how many were settled. A listing or destroy that fails or
        times out leaves its doubts booked for the next try."""
        if not self._doubts:
            return 0
        timeout = self._timeout()
        began = self._clock.monotonic()
        try:
            async with self._clock.timeout(timeout):
                listed = await self._backend.list()
        except TimeoutError:
            self._timed_out(Call.LIST, timeout)
            return 0
        except Exception as e:  # the engine answered with an error: try again later
            log.warning("in-doubt sandboxes: listing failed: %s", e)
            return 0
        self._observe(Call.LIST, self._clock.monotonic() - began)
        by_id = {s.sandbox_id: s for s in listed if s.sandbox_id}
        by_handle = {s.handle: s for s in listed}
        doomed: list[tuple[Doubt, str]] = []
        settled = 0
        for doubt in list(self._doubts.values()):
            found = by_id.get(doubt.sandbox_id) or by_handle.get(doubt.handle)
            if found is None:
                del self._doubts[doubt.sandbox_id]  # the engine never made it, or removed it
                settled += 1
            else:
                doomed.append((doubt, found.handle))
        results = await asyncio.gather(*(self._remove(d, h, timeout) for d, h in doomed))
        settled += sum(results)
        self.resolved_total += settled
        if settled:
            log.info("in-doubt sandboxes: %d settled, %d still in doubt", settled, len(self._doubts))
        return settled

    async def _remove(self, doubt: Doubt, handle: str, timeout: float) -> bool:
        began = self._clock.monotonic()
        try:
            async with self._clock.timeout(timeout):
                await self._backend.destroy(handle)
        except TimeoutError:
            self._timed_out(Call.DESTROY, timeout)
            return False
        except Exception as e:
            log.warning("in-doubt sandbox %s: destroy failed: %s", doubt.sandbox_id, e)
            return False
        self._observe(Call.DESTROY, self._clock.monotonic() - began)
        self._doubts.pop(doubt.sandbox_id, None)
        self.removed_total += 1
        return True


async def destroy_or_book(
    backend: Backend, clock: Clock, host: PoolHost[Any], timeout: float, rec: SandboxRecord
) -> None:
    """Destroys ``rec``'s sandbox within ``timeout``, telling ``host`` how
    the call went; one that failed or got no answer is booked in doubt."""
    began = clock.monotonic()
    try:
        async with clock.timeout(timeout):
            await backend.destroy(rec.handle)
    except TimeoutError:
        host.engine_call(Call.DESTROY, timeout, timed_out=True)
    except Exception as e:
        log.warning("pool %s: destroy of %s failed: %s", rec.pool, rec.sandbox_id, e)
        host.engine_call(Call.DESTROY, 0.0, failed=True)
    else:
        host.engine_call(Call.DESTROY, clock.monotonic() - began)
        return
    host.book_in_doubt(rec.sandbox_id, rec.pool, rec.handle, Call.DESTROY)
