"""A lease's network rules narrower than its pool's (AcquireRequest.network,
or none at all: AcquireRequest.no_network, the rules NO_NETWORK).

Checked once, before any sandbox is taken (the subset check is
sandboxd.backends.network.narrowing); applied to the sandboxes before the
lease exists, so its holder never has the pool's wider rules; changed while
the lease runs (SetLeaseNetwork, ``change_narrowed``); put back by a
restarted control plane on the sandboxes of the leases it adopts (the rules
persist with the lease); and undone when a recycled sandbox is reset, so its
next lease starts from the pool's rules (sandboxd.core.pools.recycle).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from sandboxd.backends.base import Backend, EgressNarrowing
from sandboxd.backends.network.narrowing import narrow
from sandboxd.backends.network.policy import NO_NETWORK
from sandboxd.core.leases import Lease
from sandboxd.core.lifecycle import SandboxRecord
from sandboxd.errors import FailedPrecondition, InvalidArgument

if TYPE_CHECKING:
    from sandboxd.core.pools import PoolConfig, WarmPool
    from sandboxd.core.registry import SandboxRegistry

log = logging.getLogger(__name__)


def asked_network(network: Sequence[str], no_network: bool) -> tuple[str, ...]:
    """What a request's ``network`` and ``no_network`` ask for: the rules,
    NO_NETWORK, or () for the pool's own. INVALID_ARGUMENT for both at once."""
    if no_network and network:
        raise InvalidArgument(
            "no_network", "asks for no network at all: leave network empty with it (or drop no_network)"
        )
    return NO_NETWORK if no_network else tuple(network)


async def checked_narrowing(
    backend: Backend, config: PoolConfig, asked: Sequence[str], *, change: bool = False
) -> tuple[str, ...]:
    """The rules an acquire of ``config``'s pool runs under (() = the pool's;
    NO_NETWORK, none at all, is () on a pool without network): INVALID_ARGUMENT
    for a rule outside the pool's, FAILED_PRECONDITION on a backend that cannot
    narrow (or not now: Kubernetes with a chart whose egress proxy cannot
    acknowledge a change of a Pod's rules). With ``change`` (a running lease's
    rules changed, to the pool's own too) the backend is checked on any pool
    with network."""
    rules = narrow(config.network, asked)
    if not rules and not (change and config.network):
        return rules
    if not isinstance(backend, EgressNarrowing):
        raise FailedPrecondition(
            "this backend cannot narrow a pool's network rules per acquire; acquire without network, "
            "or create a pool with the narrower rules"
        )
    refusal = await backend.narrowing_refusal(config.runtime)
    if refusal is not None:
        raise FailedPrecondition(refusal)
    return rules


async def apply_narrowed(
    backend: Backend, pool: WarmPool, records: list[SandboxRecord], rules: tuple[str, ...]
) -> None:
    """Puts ``records`` under ``rules``; FAILED_PRECONDITION (the sandboxes
    given up, never handed out wider) when one cannot be."""
    assert isinstance(backend, EgressNarrowing), "checked_narrowing refuses this backend"
    results = await asyncio.gather(
        *(backend.narrow_egress(r.handle, rules) for r in records), return_exceptions=True
    )
    failed = next((r for r in results if isinstance(r, BaseException)), None)
    if failed is not None:
        for rec in records:
            pool.fail(rec, "could not narrow its network rules")
        raise FailedPrecondition(f"could not narrow the sandboxes' network rules: {failed}")
    for rec in records:
        rec.network = rules


async def change_narrowed(backend: Backend, records: list[SandboxRecord], rules: tuple[str, ...]) -> None:
    """Puts the running sandboxes ``records`` of one lease under ``rules``
    (() = their pool's own), each in force (Kubernetes: acknowledged by every
    egress proxy, held connections cut) when this returns. Raises the first
    failure, after every change has ended; the records' rules are then left as
    they were, and what each sandbox runs under is not known (the caller gives
    them up)."""
    assert isinstance(backend, EgressNarrowing), "checked_narrowing refuses this backend"
    results = await asyncio.gather(
        *(backend.narrow_egress(r.handle, rules) for r in records), return_exceptions=True
    )
    failed = next((r for r in results if isinstance(r, BaseException)), None)
    if failed is not None:
        raise failed
    for rec in records:
        rec.network = rules


async def adopt_narrowed(
    backend: Backend, registry: SandboxRegistry, lease_of: Mapping[str, Lease]
) -> list[str]:
    """The registry's adoption of ``lease_of`` (what it returns is
    destroyed), with the sandboxes of narrowed leases linked again under
    their lease's rules, never their pool's; one that cannot be narrowed
    again leaves its lease and is given up."""
    narrowed = {sid: lease.network for sid, lease in lease_of.items() if lease.network}
    if isinstance(backend, EgressNarrowing):
        backend.expect_narrowed(narrowed)
    try:
        doomed = await registry.adopt(lease_of)
        for sid, rules in narrowed.items():
            rec = registry.records.get(sid)
            lease = lease_of[sid]
            if rec is None or sid not in lease.sandbox_ids:
                continue
            try:
                if not isinstance(backend, EgressNarrowing):
                    raise FailedPrecondition("this backend cannot narrow network rules")
                # The adoption's listing linked it under them already; this also
                # holds for one a listing before it linked under its pool's.
                await backend.narrow_egress(rec.handle, rules)
            except Exception as e:  # given up whatever went wrong: it must not run under wider rules
                log.warning("adopted sandbox %s given up: its lease's network rules: %s", sid, e)
                lease.sandbox_ids.remove(sid)
                registry.fail(rec, f"could not narrow its network rules again: {e}")
                continue
            rec.network = rules
    finally:
        if isinstance(backend, EgressNarrowing):
            backend.expect_narrowed({})
    return doomed
