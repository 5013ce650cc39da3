"""Leases: who holds which sandboxes, until when.

A lease expires unless heartbeated; the reaper releases what expired leases
held. The table also counts what each tenant holds under its leases (the
figure quota admission reads, in O(1) per lease change). Recently released
lease ids are remembered so a retried Release is a no-op instead of a
NOT_FOUND.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field

from sandboxd.core.bookkeeping import Tombstones
from sandboxd.core.quotas import Usage
from sandboxd.core.tenancy import split_pool_key
from sandboxd.errors import NotFound

_TOMBSTONES = 50_000


@dataclass
class Lease:
    """A client's hold on sandboxes of one pool, until it expires."""

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
    request_id: str = ""
    """The client's id for the Acquire that granted it ("" = none); not persisted."""
    requested_at: float = 0.0
    """Wall-clock moment its Acquire was asked for (0 = adopted); not persisted."""
    image_pulled: bool = False
    """Its Acquire found the image absent and waited for the pull; not persisted."""
    network: tuple[str, ...] = ()
    """Network rules narrower than the pool's its sandboxes run under (AcquireRequest.network);
    () = the pool's own. Persisted: a restarted control plane narrows them again."""


def new_lease_id() -> str:
    """A fresh lease id (``ls-`` and 24 hex digits)."""
    return "ls-" + secrets.token_hex(12)


class LeaseTable:
    """The leases in force, what each tenant holds under them, and the ids of
    leases released recently."""

    def __init__(self) -> None:
        self._leases: dict[str, Lease] = {}
        self._released: Tombstones[None] = Tombstones(_TOMBSTONES)
        # Per tenant: memory limit of each sandbox held under a lease.
        self._held: dict[str, dict[str, int]] = {}
        # (tenant, request id) -> lease id, for leases granted with one.
        self._by_request: dict[tuple[str, str], str] = {}

    def __len__(self) -> int:
        return len(self._leases)

    def add(self, lease: Lease, memory_bytes: Mapping[str, int]) -> None:
        """Records ``lease``; ``memory_bytes`` gives each of its sandboxes' memory limit."""
        self._leases[lease.lease_id] = lease
        if lease.request_id:
            self._by_request[split_pool_key(lease.pool)[0], lease.request_id] = lease.lease_id
        held = self._held.setdefault(split_pool_key(lease.pool)[0], {})
        for sid in lease.sandbox_ids:
            held[sid] = memory_bytes.get(sid, 0)

    def get(self, lease_id: str) -> Lease:
        """The lease (NOT_FOUND if it is not in force)."""
        lease = self._leases.get(lease_id)
        if lease is None:
            raise NotFound(f"lease {lease_id!r} not found (expired, released or never issued)")
        return lease

    def find(self, lease_id: str) -> Lease | None:
        """The lease, or None if it is not in force."""
        return self._leases.get(lease_id)

    def find_request(self, tenant: str, request_id: str) -> Lease | None:
        """The lease in force that ``tenant``'s Acquire with ``request_id`` was granted, if any."""
        lease_id = self._by_request.get((tenant, request_id))
        return None if lease_id is None else self._leases.get(lease_id)

    def was_released(self, lease_id: str) -> bool:
        """Whether the lease ended recently."""
        return lease_id in self._released

    def held(self, tenant: str) -> Usage:
        """What ``tenant`` holds under its leases."""
        held = self._held.get(tenant, {})
        return Usage(sandboxes=len(held), memory_bytes=sum(held.values()))

    def extend(self, lease: Lease, ttl: float, now: float, wall_now: float) -> None:
        """Moves the expiry to ``ttl`` from now, never past the lease's hard deadline."""
        expires = now + ttl
        if lease.hard_deadline:
            expires = min(expires, lease.hard_deadline)
        lease.ttl = ttl
        lease.expires_wall = wall_now + (expires - now)
        lease.expires_at = expires

    def drop_sandbox(self, lease: Lease, sandbox_id: str) -> None:
        """Takes one sandbox out of the lease; a lease left empty ends."""
        if sandbox_id in lease.sandbox_ids:
            lease.sandbox_ids.remove(sandbox_id)
            self._unhold(lease, sandbox_id)
        if not lease.sandbox_ids:
            self.remove(lease.lease_id)

    def remove(self, lease_id: str) -> None:
        """Ends the lease (remembered as released)."""
        lease = self._leases.pop(lease_id, None)
        if lease is not None:
            if lease.request_id:
                self._by_request.pop((split_pool_key(lease.pool)[0], lease.request_id), None)
            for sid in lease.sandbox_ids:
                self._unhold(lease, sid)
            self._released.add(lease_id, None)

    def _unhold(self, lease: Lease, sandbox_id: str) -> None:
        tenant = split_pool_key(lease.pool)[0]
        held = self._held.get(tenant)
        if held is not None:
            held.pop(sandbox_id, None)
            if not held:
                del self._held[tenant]

    def expired(self, now: float) -> list[Lease]:
        """Leases whose expiry is at or before ``now``."""
        return [lease for lease in self._leases.values() if lease.expires_at <= now]

    def all(self) -> list[Lease]:
        """Every lease in force."""
        return list(self._leases.values())
