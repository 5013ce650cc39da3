"""The core's side of the metered model route: lease keys, who may use them, and what was recorded.

A lease's key is ``sbxk.<lease id>.<sandbox id>.<mac>``, the mac an HMAC
under a secret of this process, so a key is checked without a table of keys
and cannot be forged or bent to another lease or sandbox. Whether it may be
used is read from the lease table at each call: the moment a lease ends
(released, expired, its sandbox lost, its pool deleted) its keys are refused,
whatever path ended it. A call is served only on the listener of the
sandbox the key names (the gateway knows which sandbox's namespace, or on
Kubernetes which Pod, a call came from), so one lease's key cannot put
tokens on another's trajectory.

The ledger keeps each (lease, sandbox)'s calls until the rollout queue takes
them onto the trajectory of that sandbox (sandboxd.core.rollouts.service),
for a bounded time and number after the lease ends, since a generator
releases before it submits.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from sandboxd.backends.network.gateway import Grant, KeyRefused, ModelGateway
from sandboxd.backends.network.meter import ModelCall
from sandboxd.clock import Clock
from sandboxd.core.leases import LeaseTable
from sandboxd.core.tenancy import split_pool_key
from sandboxd.model_gateway_settings import ModelGatewaySettings

log = logging.getLogger(__name__)

KEY_PREFIX = "sbxk"
RETENTION_SECONDS = 3600.0
"""How long calls of an ended lease wait for the rollout queue to take them."""
MAX_CALLS_PER_SANDBOX = 10_000
"""Calls kept per (lease, sandbox); older ones are dropped first, and counted."""
MAX_ENTRIES = 100_000
"""(lease, sandbox) pairs with calls kept at once; the least recently used go first."""


class ModelKeys:
    """Makes and reads lease keys (HMAC-SHA256 under a secret of this process)."""

    def __init__(self, secret: bytes | None = None) -> None:
        self._secret = secret or secrets.token_bytes(32)

    def _mac(self, lease_id: str, sandbox_id: str) -> str:
        message = f"{lease_id}\0{sandbox_id}".encode()
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()[:40]

    def key_for(self, lease_id: str, sandbox_id: str) -> str:
        """The key that sandbox ``sandbox_id`` uses under lease ``lease_id``."""
        return f"{KEY_PREFIX}.{lease_id}.{sandbox_id}.{self._mac(lease_id, sandbox_id)}"

    def read(self, key: str) -> tuple[str, str]:
        """(lease id, sandbox id) of a genuine key; KeyRefused (401) otherwise."""
        parts = key.split(".")
        if len(parts) != 4 or parts[0] != KEY_PREFIX:
            raise KeyRefused(
                401, "not a sandboxd lease key: use the OPENAI_API_KEY sandboxd set for the command"
            )
        _, lease_id, sandbox_id, mac = parts
        if not hmac.compare_digest(mac, self._mac(lease_id, sandbox_id)):
            raise KeyRefused(401, "not a key sandboxd issued (or one issued before the server restarted)")
        return lease_id, sandbox_id


@dataclass
class _Entry:
    tenant: str
    calls: list[ModelCall] = field(default_factory=list)
    touched: float = 0.0
    dropped: int = 0


class ModelLedger:
    """Recorded calls by (lease, sandbox), until taken onto a trajectory."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._entries: OrderedDict[tuple[str, str], _Entry] = OrderedDict()
        self.recorded = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0

    def record(self, tenant: str, call: ModelCall) -> None:
        """Keeps one call of ``tenant``'s lease."""
        key = (call.lease_id, call.sandbox_id)
        entry = self._entries.pop(key, None) or _Entry(tenant)
        entry.calls.append(call)
        if len(entry.calls) > MAX_CALLS_PER_SANDBOX:
            del entry.calls[0]
            entry.dropped += 1
        entry.touched = self._clock.monotonic()
        self._entries[key] = entry
        self.recorded += 1
        self.prompt_tokens += call.prompt_tokens
        self.completion_tokens += call.completion_tokens
        self._expire()

    def _expire(self) -> None:
        horizon = self._clock.monotonic() - RETENTION_SECONDS
        while self._entries:
            key, entry = next(iter(self._entries.items()))
            if entry.touched > horizon and len(self._entries) <= MAX_ENTRIES:
                break
            del self._entries[key]
            log.info("model calls of lease %s, sandbox %s dropped untaken", *key)

    def take(self, tenant: str, sandbox_id: str, lease_ids: Iterable[str] | None) -> list[ModelCall]:
        """Removes and returns ``tenant``'s calls made in ``sandbox_id`` under
        ``lease_ids`` (None: under any of its leases), in the order they began."""
        self._expire()
        wanted = None if lease_ids is None else set(lease_ids)
        taken: list[ModelCall] = []
        for key in [k for k in self._entries if k[1] == sandbox_id]:
            entry = self._entries[key]
            if entry.tenant == tenant and (wanted is None or key[0] in wanted):
                taken += entry.calls
                del self._entries[key]
        return sorted(taken, key=lambda c: c.started_at)

    def pending(self, tenant: str, sandbox_id: str) -> int:
        """Calls kept for ``tenant``'s sandbox, not yet taken."""
        return sum(
            len(e.calls) for (_, sid), e in self._entries.items() if sid == sandbox_id and e.tenant == tenant
        )


class ModelRoute:
    """Answers the gateway: which keys may be used where, and where their calls go."""

    def __init__(
        self,
        leases: LeaseTable,
        endpoint_of: Callable[[str], str],
        ledger: ModelLedger,
        keys: ModelKeys | None = None,
        gateway: ModelGatewaySettings | None = None,
    ) -> None:
        settings = gateway or ModelGatewaySettings()
        self._leases = leases
        self._endpoint_of = endpoint_of
        self.ledger = ledger
        self.keys = keys or ModelKeys()
        self._upstream_key = settings.api_key
        # Lease id -> tenant, for calls that finish after their lease ended.
        self._tenants: OrderedDict[str, str] = OrderedDict()
        self.gateway = ModelGateway(
            self.authorize,
            self.record,
            timeout=settings.timeout_seconds,
            max_calls=settings.max_calls_per_sandbox,
        )

    def key_for(self, lease_id: str, pool_key: str, sandbox_id: str) -> str:
        """The key a command in ``sandbox_id`` gets under the lease (of pool ``pool_key``)."""
        self._tenants[lease_id] = split_pool_key(pool_key)[0]
        self._tenants.move_to_end(lease_id)
        while len(self._tenants) > MAX_ENTRIES:
            self._tenants.popitem(last=False)
        return self.keys.key_for(lease_id, sandbox_id)

    def authorize(self, listener_sandbox: str, key: str) -> Grant:
        """The grant for ``key`` used from ``listener_sandbox``; KeyRefused (401 or 403) otherwise."""
        lease_id, sandbox_id = self.keys.read(key)
        lease = self._leases.find(lease_id)
        if lease is None or sandbox_id not in lease.sandbox_ids:
            raise KeyRefused(
                401,
                f"lease {lease_id} has ended (released, expired or its sandbox lost): "
                "a lease's key works only while the lease is in force",
            )
        if sandbox_id != listener_sandbox:
            raise KeyRefused(
                403,
                f"this key is sandbox {sandbox_id}'s (lease {lease_id}), not this sandbox's: "
                "calls are recorded on the trajectory of the sandbox they come from",
            )
        endpoint = self._endpoint_of(lease.pool)
        if not endpoint:
            raise KeyRefused(403, "this sandbox's pool names no model endpoint (spec.model_endpoint)")
        return Grant(lease_id, sandbox_id, endpoint, self._upstream_key)

    def record(self, call: ModelCall) -> None:
        """Keeps a finished call for its trajectory, under its lease's tenant
        (the lease may have ended while the call ran)."""
        lease = self._leases.find(call.lease_id)
        tenant = split_pool_key(lease.pool)[0] if lease is not None else self._tenants.get(call.lease_id, "")
        self.ledger.record(tenant, call)
