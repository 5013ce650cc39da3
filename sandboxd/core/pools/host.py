"""What a pool needs from whatever runs it (the reconciler, in a server)."""

from __future__ import annotations

from typing import Protocol, TypeVar

from sandboxd.core.pools.congestion import Call

# Generic in the pool type so that this module, which the pool imports,
# need not import the pool: hosts are written as PoolHost[WarmPool].
PoolT = TypeVar("PoolT", contravariant=True)


class PoolHost(Protocol[PoolT]):
    """What runs a pool: wakes up on poke, paces backend create attempts."""

    def attach(self, pool: PoolT) -> None:
        """Starts running ``pool``."""
        ...

    def detach(self, pool: PoolT) -> None:
        """Stops running ``pool``."""
        ...

    def poke(self) -> None:
        """Something in a pool changed: look again soon."""
        ...

    async def paced(self, deferrable: bool = False) -> None:
        """Waits for the pacer's go-ahead for one backend create attempt.
        ``deferrable``: the sandbox only tops up a warm buffer (no acquirer
        waits for it), so it may also wait, boundedly, for urgent work in
        flight (restores) to finish."""
        ...

    def observe_startup(self, seconds: float) -> None:
        """A start-up latency measured by one of the pools."""
        ...

    def startup_estimate(self) -> float | None:
        """Start-up latency measured across pools; None until there is one.
        A pool that has not started anything yet uses it."""
        ...

    def engine_call(
        self, call: Call, seconds: float, *, timed_out: bool = False, failed: bool = False
    ) -> None:
        """How one engine call went: answered after ``seconds``, answered
        with an error (``failed``), or no answer within ``seconds`` (``timed_out``)."""
        ...

    def book_in_doubt(self, sandbox_id: str, pool: str, handle: str, call: Call) -> None:
        """A create or destroy of this sandbox got no answer: keep it on the
        books until the engine answers for it."""
        ...

    def start_window(self) -> int:
        """Starts allowed in flight across pools now: the engine's window,
        which grows past a pool's ``max_starting`` while creates stay fast."""
        ...

    def ceiling(self) -> int:
        """Sandboxes all pools may hold together (0 = no limit)."""
        ...

    def refusal_cause(self) -> str:
        """Why acquirers are not being served, as far as the host knows ("" = nothing known)."""
        ...

    def engine_view(self, pool: str) -> tuple[str, int, int]:
        """(why the engine is degraded or "", the start window or 0, the
        sandboxes of ``pool`` in doubt), for status and metrics."""
        ...
