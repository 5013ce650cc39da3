"""A lease narrowed to no network at all, and a running lease's rules changed
(SetLeaseNetwork): validation, the representation of "none" apart from "the
pool's own" wherever the rules travel, all-or-nothing changes, persistence
across a restart, and the gRPC edge."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from pathlib import Path

import pytest

from sandboxd import errors
from sandboxd.app import build_app
from sandboxd.backends.base import Limits
from sandboxd.backends.fake import FakeBackend
from sandboxd.backends.kubernetes.ledger import decode_mark, encode_mark
from sandboxd.backends.ledger import LeaseMark
from sandboxd.backends.network.narrowing import narrow
from sandboxd.backends.network.policy import (
    MAX_RULES,
    NO_EGRESS,
    NO_NETWORK,
    EgressPolicy,
    is_no_network,
    parse_rule,
)
from sandboxd.backends.network.proxy import EgressProxy
from sandboxd.client import AsyncClient
from sandboxd.core.leases import Lease
from sandboxd.core.ledger_state import LedgerStateStore
from sandboxd.core.narrowing import asked_network
from sandboxd.core.pools import PoolConfig
from sandboxd.core.state import SqliteStateStore
from sandboxd.errors import FailedPrecondition, InvalidArgument, NotFound
from tests.unit.conftest import IMAGE, UNKNOWN_LEASE, Harness, MakeControl, make_settings, wait_for
from tests.unit.test_ledger_state import MemoryLedger

pytestmark = pytest.mark.timeout(30)

POOL_RULES = ["pypi.test", "forge.test:443", "10.0.0.0/8:80"]


class NarrowingFake(FakeBackend):
    """A FakeBackend whose sandboxes have egress rules a lease may narrow;
    ``fail`` names handles whose change fails."""

    def __init__(self) -> None:
        super().__init__()
        self.rules: dict[str, tuple[str, ...]] = {}
        self.fail: set[str] = set()
        self.expected: dict[str, tuple[str, ...]] = {}

    def network_refusal(self, runtime: str) -> str | None:
        return None

    async def narrowing_refusal(self, runtime: str) -> str | None:
        return None

    async def narrow_egress(self, handle: str, rules: tuple[str, ...]) -> None:
        await asyncio.sleep(0)
        if handle in self.fail:
            raise errors.BackendError(f"proxy did not acknowledge {handle}")
        self.rules[handle] = rules

    def expect_narrowed(self, rules: Mapping[str, tuple[str, ...]]) -> None:
        if rules:
            self.expected = dict(rules)


async def _net_pool(h: Harness, name: str = "p", network: list[str] | None = None) -> None:
    await h.control.create_pool(PoolConfig(name, IMAGE, 0, 8, Limits(), network=network or []))


# -- the representation -----------------------------------------------------------


def test_none_is_no_rule_and_apart_from_the_pools_own() -> None:
    with pytest.raises(InvalidArgument):
        parse_rule(NO_EGRESS)
    assert NO_NETWORK != () and is_no_network(NO_NETWORK) and not is_no_network(())
    # A lease's "none" is a policy that allows nothing; a pool's rules never hold it.
    policy = EgressPolicy.parse(NO_NETWORK, lease=True)
    assert policy.lease and not policy.rules and policy.rule_for("pypi.test", 443) is None
    assert not policy.names_allowed("pypi.test")
    with pytest.raises(InvalidArgument):
        EgressPolicy.parse(NO_NETWORK)
    # It rides the lease mark as any rules do, and reads back the same.
    mark = LeaseMark("ls-1", "t/p", 30.0, 100.0, {}, NO_NETWORK)
    assert json.loads(encode_mark(mark))["network"] == [NO_EGRESS]
    decoded = decode_mark(encode_mark(mark))
    assert decoded is not None and decoded.network == NO_NETWORK
    plain = decode_mark(encode_mark(LeaseMark("ls-1", "t/p", 30.0, 100.0)))
    assert plain is not None and plain.network == ()


def test_no_network_with_rules_is_refused_and_alone_is_none() -> None:
    assert asked_network([], True) == NO_NETWORK
    assert asked_network([], False) == ()
    assert asked_network(["pypi.test"], False) == ("pypi.test",)
    with pytest.raises(InvalidArgument) as info:
        asked_network(["pypi.test"], True)
    assert info.value.field == "no_network"


def test_narrowing_to_none_within_a_pool_and_on_one_without_network() -> None:
    assert narrow(POOL_RULES, NO_NETWORK) == NO_NETWORK
    # A pool without network has none already: accepted, nothing to narrow.
    assert narrow([], NO_NETWORK) == ()
    # The marker spelled as a rule, or mixed with rules, is no way in.
    for hostile in ([NO_EGRESS, "pypi.test"], ["pypi.test", NO_EGRESS], [f" {NO_EGRESS} ", "pypi.test"]):
        with pytest.raises(InvalidArgument, match="not a rule"):
            narrow(POOL_RULES, hostile)
    with pytest.raises(InvalidArgument, match="not a host name"):
        narrow(POOL_RULES, ["none!"])


async def test_a_proxy_under_none_refuses_everything_saying_so() -> None:
    proxy = EgressProxy("sb-1", EgressPolicy.parse(POOL_RULES))
    proxy.set_policy(EgressPolicy.parse(NO_NETWORK, lease=True))
    with pytest.raises(Exception, match="no network at all"):
        proxy._allow("pypi.test", 443)


# -- acquire with no_network ----------------------------------------------------------


async def test_an_acquire_with_no_network_runs_under_none(
    make_control: MakeControl,
) -> None:
    backend = NarrowingFake()
    h = await make_control(backend=backend)
    await _net_pool(h, network=POOL_RULES)
    lease, records = await h.control.acquire("p", 1, 0, {}, 30, 5, None, network=NO_NETWORK)
    assert lease.network == NO_NETWORK and records[0].network == NO_NETWORK
    assert backend.rules[records[0].handle] == NO_NETWORK
    # On a pool without network it changes nothing.
    await _net_pool(h, "bare")
    bare, bare_records = await h.control.acquire("bare", 1, 0, {}, 30, 5, None, network=NO_NETWORK)
    assert bare.network == () and bare_records[0].network == ()
    assert bare_records[0].handle not in backend.rules


async def test_no_network_on_a_pool_without_network_is_accepted_as_is(h: Harness) -> None:
    await h.pool()
    # The fake backend has no egress at all: a pool without network accepts it.
    lease, _ = await h.control.acquire("p", 1, 0, {}, 30, 5, None, network=NO_NETWORK)
    assert lease.network == ()


# -- changing a running lease's rules ----------------------------------------------------


async def test_a_running_lease_is_narrowed_cut_off_and_widened_back(make_control: MakeControl) -> None:
    backend = NarrowingFake()
    h = await make_control(backend=backend)
    await _net_pool(h, network=POOL_RULES)
    lease, records = await h.control.acquire("p", 3, 0, {}, 30, 5, None)
    handles = [r.handle for r in records]
    assert lease.network == () and not backend.rules
    done = await h.control.set_network(lease.lease_id, ("pypi.test",))
    assert done is lease and lease.network == ("pypi.test",)
    assert all(backend.rules[hd] == ("pypi.test",) for hd in handles)
    assert all(r.network == ("pypi.test",) for r in records)
    await h.control.set_network(lease.lease_id, NO_NETWORK)
    assert lease.network == NO_NETWORK and all(backend.rules[hd] == NO_NETWORK for hd in handles)
    # Back up to the pool's own: the pool is the ceiling, not the lease's first rules.
    await h.control.set_network(lease.lease_id, ())
    assert lease.network == () and all(backend.rules[hd] == () for hd in handles)
    assert all(r.network == () for r in records)


async def test_a_change_is_validated_before_anything_changes(make_control: MakeControl) -> None:
    backend = NarrowingFake()
    h = await make_control(backend=backend)
    await _net_pool(h, network=POOL_RULES)
    lease, records = await h.control.acquire("p", 1, 0, {}, 30, 5, None, network=("pypi.test",))
    for asked, words in [
        (("evil.test",), "'evil.test' lies outside the pool's rules"),
        (("forge.test:80",), "ports the pool does not allow"),
        (("pypi.test", "bad host!"), "not a host name"),
        (tuple(f"h{i}.pypi.test" for i in range(MAX_RULES + 1)), f"at most {MAX_RULES}"),
        ((NO_EGRESS, "pypi.test"), "not a rule"),
    ]:
        with pytest.raises(InvalidArgument, match=words):
            await h.control.set_network(lease.lease_id, asked)
        assert lease.network == ("pypi.test",) and backend.rules[records[0].handle] == ("pypi.test",)
    # Many rules within the pool's are fine.
    many = ("pypi.test", *(f"10.0.{i}.0/24:80" for i in range(MAX_RULES - 1)))
    await h.control.set_network(lease.lease_id, many)
    assert lease.network == many
    with pytest.raises(NotFound, match=UNKNOWN_LEASE):
        await h.control.set_network(UNKNOWN_LEASE, ())
    with pytest.raises(InvalidArgument):
        await h.control.set_network("not-a-lease", ())
    # An ended lease is not found.
    await h.control.release(lease.lease_id, [])
    with pytest.raises(NotFound):
        await h.control.set_network(lease.lease_id, NO_NETWORK)


async def test_a_pool_without_network_takes_none_as_is_and_refuses_rules(make_control: MakeControl) -> None:
    h = await make_control(backend=NarrowingFake())
    await _net_pool(h)
    lease, _ = await h.control.acquire("p", 1, 0, {}, 30, 5, None)
    assert (await h.control.set_network(lease.lease_id, NO_NETWORK)).network == ()
    with pytest.raises(InvalidArgument, match="no network at all"):
        await h.control.set_network(lease.lease_id, ("pypi.test",))


async def test_a_backend_that_cannot_narrow_refuses_a_change_of_a_network_pools_lease(
    make_control: MakeControl,
) -> None:
    class Egress(FakeBackend):
        def network_refusal(self, runtime: str) -> str | None:
            return None

    h = await make_control(backend=Egress())
    await _net_pool(h, network=POOL_RULES)
    lease, _ = await h.control.acquire("p", 1, 0, {}, 30, 5, None)
    for asked in [("pypi.test",), NO_NETWORK, ()]:
        with pytest.raises(FailedPrecondition, match="cannot narrow"):
            await h.control.set_network(lease.lease_id, asked)


async def test_a_change_failing_on_one_sandbox_ends_the_lease_and_gives_them_up(
    make_control: MakeControl,
) -> None:
    backend = NarrowingFake()
    h = await make_control(backend=backend)
    await _net_pool(h, network=POOL_RULES)
    lease, records = await h.control.acquire("p", 3, 0, {}, 30, 5, None)
    backend.fail.add(records[1].handle)
    with pytest.raises(FailedPrecondition, match="lease ended and its sandboxes were given up"):
        await h.control.set_network(lease.lease_id, NO_NETWORK)
    with pytest.raises(NotFound):
        h.control.get_lease(lease.lease_id)
    await wait_for(lambda: all(r.sandbox_id not in h.control.registry.records for r in records), what="gone")
    assert not await h.control.store.load_leases()


async def test_concurrent_changes_run_one_at_a_time_and_the_last_holds(make_control: MakeControl) -> None:
    backend = NarrowingFake()
    h = await make_control(backend=backend)
    await _net_pool(h, network=POOL_RULES)
    lease, records = await h.control.acquire("p", 2, 0, {}, 30, 5, None)
    asks = [("pypi.test",), NO_NETWORK, (), ("forge.test:443",), NO_NETWORK]
    await asyncio.gather(*(h.control.set_network(lease.lease_id, a) for a in asks))
    # Each handle's rules agree with the lease's: no change interleaved with another.
    assert all(backend.rules[r.handle] == lease.network for r in records)
    assert all(r.network == lease.network for r in records)
    assert not h.control.leasing._changing


async def test_the_latest_rules_are_persisted_and_put_back_after_a_restart(
    make_control: MakeControl, tmp_path: Path
) -> None:
    backend = NarrowingFake()
    db = tmp_path / "state.db"
    h = await make_control(backend=backend, store_path=db)
    await _net_pool(h, network=POOL_RULES)
    lease, records = await h.control.acquire("p", 1, 0, {}, 60, 5, None, network=("pypi.test",))
    await h.control.set_network(lease.lease_id, NO_NETWORK)
    persisted = await h.control.store.load_leases()
    assert [row[-1] for row in persisted] == [[NO_EGRESS]]
    await h.crash()
    backend.rules.clear()
    again = await make_control(backend=backend, store_path=db)
    adopted = again.control.get_lease(lease.lease_id)
    assert adopted.network == NO_NETWORK
    assert backend.expected == {records[0].sandbox_id: NO_NETWORK}
    assert backend.rules[records[0].handle] == NO_NETWORK
    assert again.control.registry.records[records[0].sandbox_id].network == NO_NETWORK


async def test_a_ledger_rewrites_a_lease_whose_rules_changed() -> None:
    ledger = MemoryLedger()
    store = LedgerStateStore(ledger, slack=0.5, write_behind=False)
    lease = Lease("ls-1", "p", ["a"], 30.0, 1000.0, 1000.0, {})
    await store.save_lease(lease, ["pod-a"])
    writes = ledger.writes
    await store.save_lease(lease, ["pod-a"])
    assert ledger.writes == writes
    lease.network = NO_NETWORK
    await store.save_lease(lease, ["pod-a"])
    assert ledger.writes == writes + 1 and ledger.marks["pod-a"].network == NO_NETWORK
    (row,) = await store.load_leases()
    assert tuple(row[-1]) == NO_NETWORK
    # Read back as written: no rewrite of what the ledger already holds.
    await store.save_lease(lease, ["pod-a"])
    assert ledger.writes == writes + 1


async def test_the_sqlite_store_keeps_none_apart_from_the_pools_own() -> None:
    store = SqliteStateStore(None)
    await store.open()
    try:
        await store.save_lease(Lease("ls-1", "p", ["a"], 30.0, 1000.0, 1000.0, {}, network=NO_NETWORK))
        await store.save_lease(Lease("ls-2", "p", ["b"], 30.0, 1000.0, 1000.0, {}))
        rows = {row[0]: row[-1] for row in await store.load_leases()}
        assert rows == {"ls-1": [NO_EGRESS], "ls-2": []}
    finally:
        await store.close()


# -- the gRPC edge ------------------------------------------------------------------


async def test_the_api_serves_no_network_and_set_lease_network() -> None:
    backend = NarrowingFake()
    app = build_app(make_settings(), backend=backend, persist=False)
    await app.start()
    try:
        async with AsyncClient(app.address) as client:
            await client.create_pool("p", IMAGE, min_ready=0, max_size=4, network=POOL_RULES)
            with pytest.raises(errors.InvalidArgument, match="no_network"):
                await client.lease("p", timeout=5, network=["pypi.test"], no_network=True)
            lease = await client.lease("p", timeout=5, no_network=True)
            assert lease.no_network and lease.network == []
            info = await client.get_sandbox(lease[0].id)
            assert info.no_network and list(info.network) == []
            got = await client.set_lease_network(lease.id, ["pypi.test"])
            assert not got.no_network and list(got.network) == ["pypi.test"]
            await lease.set_network(no_network=True)
            assert lease.no_network and lease.network == []
            with pytest.raises(errors.InvalidArgument, match="outside the pool's rules"):
                await lease.set_network(["evil.test"])
            with pytest.raises(errors.InvalidArgument, match="no_network"):
                await client.set_lease_network(lease.id, ["pypi.test"], no_network=True)
            await lease.set_network()
            assert not lease.no_network and lease.network == []
            assert list((await client.get_sandbox(lease[0].id)).network) == []
            await lease.release()
            with pytest.raises(errors.NotFound):
                await client.set_lease_network(lease.id, no_network=True)
    finally:
        await app.stop(grace=0.5)
