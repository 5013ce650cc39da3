"""Leases: who holds which sandboxes, until when.

A lease expires unless heartbeated; the reaper releases what expired leases
held. Recently released lease ids are remembered so a retried Release is a
no-op instead of a NOT_FOUND.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict
from dataclasses import dataclass, field

from sandboxd.errors import NotFound

_TOMBSTONES = 50_000


@dataclass
class Lease:
    lease_id: str
    pool: str
    sandbox_ids: list[str]
    ttl: float
    expires_at: float
    """Monotonic seconds."""
    expires_wall: float
    """The same moment as wall-clock seconds (persisted; shown to users)."""
    labels: dict[str, str] = field(default_factory=dict)
    hard_deadline: float = 0.0
    """Monotonic moment past which heartbeats cannot extend (sandbox lifetime); 0 = none."""


def new_lease_id() -> str:
    return "ls-" + secrets.token_hex(12)


class LeaseTable:
    def __init__(self) -> None:
        self._leases: dict[str, Lease] = {}
        self._released: OrderedDict[str, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._leases)

    def add(self, lease: Lease) -> None:
        self._leases[lease.lease_id] = lease

    def get(self, lease_id: str) -> Lease:
        lease = self._leases.get(lease_id)
        if lease is None:
            raise NotFound(f"lease {lease_id!r} not found (expired, released or never issued)")
        return lease

    def find(self, lease_id: str) -> Lease | None:
        return self._leases.get(lease_id)

    def was_released(self, lease_id: str) -> bool:
        return lease_id in self._released

    def extend(self, lease: Lease, ttl: float, now: float, wall_now: float) -> None:
        expires = now + ttl
        if lease.hard_deadline:
            expires = min(expires, lease.hard_deadline)
        lease.ttl = ttl
        lease.expires_wall = wall_now + (expires - now)
        lease.expires_at = expires

    def drop_sandbox(self, lease: Lease, sandbox_id: str) -> None:
        if sandbox_id in lease.sandbox_ids:
            lease.sandbox_ids.remove(sandbox_id)
        if not lease.sandbox_ids:
            self.remove(lease.lease_id)

    def remove(self, lease_id: str) -> None:
        if self._leases.pop(lease_id, None) is not None:
            self._released[lease_id] = None
            while len(self._released) > _TOMBSTONES:
                self._released.popitem(last=False)

    def expired(self, now: float) -> list[Lease]:
        return [lease for lease in self._leases.values() if lease.expires_at <= now]

    def all(self) -> list[Lease]:
        return list(self._leases.values())
