"""The sandbox lifecycle as an explicit transition table.

    CREATING ──> READY ──> LEASED ──> RELEASING ──> GONE
        │          │  ^                    │         ^
        │          │  └─────── reset ──────┘         │
        └──────────┴──────────┴──> FAILED ───────────┘

A released sandbox is destroyed, unless its pool recycles
(sandboxd.core.pools.recycle): then it is reset in place while RELEASING and
comes back READY only once its checks pass; anything in doubt destroys it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from sandboxd.backends.base import Limits
from sandboxd.errors import FailedPrecondition
from sandboxd.sandbox_reset import Baseline


class State(enum.IntEnum):
    """Where a sandbox is in its lifecycle."""

    # Values match sandboxd.v1.SandboxState.
    CREATING = 1
    READY = 2
    LEASED = 3
    RELEASING = 4
    GONE = 5
    FAILED = 6


TRANSITIONS: dict[tuple[State, State], str] = {
    (State.CREATING, State.READY): "started and passed its health check",
    (State.CREATING, State.FAILED): "create failed, timed out or was cancelled",
    (State.READY, State.LEASED): "handed to an acquirer under a lease",
    (State.READY, State.RELEASING): "pool shrank, was deleted, or the server is shutting down",
    (State.READY, State.FAILED): "died while warm; the pool replaces it",
    (State.LEASED, State.RELEASING): "released by its client, lease expired, or lifetime reached",
    (State.LEASED, State.FAILED): "lost while leased (container gone)",
    (State.RELEASING, State.GONE): "destroyed on the backend",
    (State.RELEASING, State.READY): "reset in place and passed its checks (a recycling pool)",
    (State.FAILED, State.GONE): "remains cleaned up on the backend",
}


@dataclass
class SandboxRecord:
    """What the core knows about one sandbox; reconstructible from the backend
    plus the lease store."""

    sandbox_id: str
    pool: str
    image: str
    limits: Limits
    state: State = State.CREATING
    handle: str = ""
    lease_id: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    failure_reason: str = ""
    # Frozen by a pause (sandboxd.core.pausing): nothing runs in it until resumed.
    paused: bool = False
    # Its lease's network rules, narrower than its pool's; () = the pool's own.
    network: tuple[str, ...] = ()
    # Wall-clock timestamps per state entered (seconds since the epoch).
    entered: dict[State, float] = field(default_factory=dict)
    # Recycling (sandboxd.core.pools.recycle): the sandbox as it came, the
    # leases it served, whose it is now, and why it may not be reused.
    baseline: Baseline | None = None
    uses: int = 0
    recycle_key: str | None = None
    doubt: str = ""
    # Wall-clock moment of the first command run in it (0 = none yet): a
    # rollout's lifecycle reads when its work began.
    first_command_at: float = 0.0

    def move(self, to: State, at: float, reason: str = "") -> None:
        """Takes the edge to ``to`` at wall-clock ``at``; an edge the table lacks is refused."""
        if (self.state, to) not in TRANSITIONS:
            raise FailedPrecondition(
                f"sandbox {self.sandbox_id} cannot go from {self.state.name} to {to.name}"
            )
        self.state = to
        self.entered[to] = at
        if reason:
            self.failure_reason = reason
