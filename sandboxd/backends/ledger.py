"""Durable state a backend can keep itself: pool specs, and each leased sandbox's lease
recorded on the sandbox, so any replica that reaches the backend can take over
(the optional ``Ledger`` port; sandboxd.core.ledger_state uses it).

Re-exported by sandboxd.backends.base, where the port is described."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class LeaseMark:
    """A lease as a Ledger backend records it on each of its sandboxes."""

    lease_id: str
    pool: str
    ttl: float
    expires_wall: float
    """Wall-clock seconds; an upper bound of the lease's real expiry."""
    labels: Mapping[str, str] = field(default_factory=dict)
    network: tuple[str, ...] = ()
    """The lease's network rules narrower than its pool's (() = the pool's):
    a replica that adopts the lease puts its sandboxes under them again."""


@runtime_checkable
class Ledger(Protocol):
    """Optional for a backend: it keeps the control plane's durable state
    itself (pool specs, and each leased sandbox's lease on the sandbox), so
    any replica that reaches the backend can take over from another
    (sandboxd.core.ledger_state). Writes are idempotent, so retrying one is
    safe."""

    async def load_pool_specs(self) -> dict[str, str]:
        """Pool specs (JSON text) by pool key."""
        ...

    async def save_pool_spec(self, key: str, spec: str) -> None:
        """Stores ``spec`` under pool key ``key``, replacing any there."""
        ...

    async def delete_pool_spec(self, key: str) -> None:
        """Removes the spec under ``key``; a missing one is not an error."""
        ...

    async def mark_leased(self, handle: str, mark: LeaseMark) -> None:
        """Records ``mark`` on the sandbox. Raises SandboxLost when it is gone."""
        ...

    async def lease_marks(self) -> list[tuple[str, str, LeaseMark]]:
        """(sandbox id, handle, lease) of each of this instance's sandboxes
        that carries a lease."""
        ...
