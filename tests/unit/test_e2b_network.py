"""E2B's create ``network`` and ``allow_internet_access`` mapped onto
sandboxd's per-lease narrowing (sandboxd.e2b.egress), its metrics samples
(sandboxd.e2b.usage), and the routes the front end answers without
sandboxd: refusals naming the field, update_network, what is not served."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from sandboxd.backends.network.narrowing import narrow
from sandboxd.client import AsyncClient
from sandboxd.e2b.egress import ALL_TRAFFIC, MAX_ENTRIES, BadNetwork, Egress, egress_of, lease_rules
from sandboxd.e2b.unserved import UNSERVED
from sandboxd.e2b.usage import KEPT, Samples, sample
from sandboxd.errors import InvalidArgument
from sandboxd.v1 import common_pb2, pools_pb2, sandboxes_pb2
from tests.unit.e2b_app import KEY

pytestmark = pytest.mark.timeout(60)

DENY = [ALL_TRAFFIC]


def test_no_option_and_allow_without_deny_all_keep_the_pools_rules() -> None:
    assert egress_of(None) is None
    assert egress_of({}) is None
    assert egress_of({}, True) is None
    assert egress_of({"allowOut": [], "denyOut": []}) is None
    # E2B allows everything by default: allow_out alone blocks nothing.
    assert egress_of({"allowOut": ["pypi.test"]}) is None
    # Allowing all traffic over a deny-all is E2B's default again.
    assert egress_of({"allowOut": [ALL_TRAFFIC], "denyOut": DENY}) is None
    # Fields left at what changes nothing are accepted.
    assert (
        egress_of({"dnsServers": None, "egressProxy": None, "httpsPorts": [], "maskRequestHost": ""}) is None
    )
    assert egress_of({"rules": {"api.test": [{}, {"transform": {}}, {"transform": {"headers": {}}}]}}) is None
    assert egress_of({"allowPublicTraffic": False}) is None


def test_deny_all_narrows_to_the_allowed_entries_normalised() -> None:
    got = egress_of(
        {"allowOut": ["PyPI.test.", "10.1.2.3", "10.9.0.7/16", "*.corp.test", "pypi.test"], "denyOut": DENY}
    )
    assert got == Egress(allow=("pypi.test", "10.1.2.3", "10.9.0.0/16", "*.corp.test"), deny=(ALL_TRAFFIC,))
    assert egress_of({}, False) == Egress(allow=(), internet=False)
    assert egress_of({"allowOut": ["2001:DB8::1", "2001:db8::/32"]}, False) == Egress(
        allow=("2001:db8::1", "2001:db8::/32"), internet=False
    )
    # Other deny entries beside all traffic add nothing to a deny-all.
    assert egress_of({"denyOut": ["10.0.0.0/8", ALL_TRAFFIC, "::/0"]}) == Egress(
        deny=("10.0.0.0/8", ALL_TRAFFIC, "::/0")
    )


@pytest.mark.parametrize(
    ("network", "internet", "says"),
    [
        ({"denyOut": ["10.0.0.0/8"]}, None, "network.denyOut: denying some addresses (10.0.0.0/8)"),
        ({"denyOut": ["::/0"]}, None, "network.denyOut: denying some"),
        (
            {"allowOut": "pypi.test", "denyOut": DENY},
            None,
            "network.allowOut must be a list of strings, got str",
        ),
        ({"allowOut": {"a": 1}}, None, "network.allowOut must be a list"),
        ({"allowOut": [1]}, None, "entries must be strings, got int"),
        ({"allowOut": [None]}, None, "entries must be strings, got NoneType"),
        ({"allowOut": [""], "denyOut": DENY}, None, "an entry is empty"),
        ({"allowOut": ["10.0.0.0/33"]}, None, "'10.0.0.0/33' is not a valid address or CIDR"),
        ({"allowOut": ["300.1.1.1"]}, None, "not a valid IPv4 address"),
        ({"allowOut": ["2001:db8::/129"]}, None, "not a valid address or CIDR"),
        ({"allowOut": ["fe80::1%eth0"]}, None, "not a valid IPv6"),
        ({"allowOut": ["pypi.test:443"]}, None, "without ports"),
        ({"allowOut": ["http://pypi.test/"]}, None, "without ports"),
        ({"allowOut": ["*"]}, None, "not an address, a CIDR, a host name or '*.suffix'"),
        ({"allowOut": ["*.test"]}, None, "two labels or more"),
        ({"allowOut": ["a b.test"]}, None, "not an address"),
        ({"allowOut": ["x" * 300]}, None, "longer than 253 characters"),
        ({"denyOut": [ALL_TRAFFIC], "allowOut": ["ok.test", "bad..test"]}, None, "'bad..test'"),
        (
            {"rules": {"api.test": [{"transform": {"headers": {"Authorization": "x"}}}]}},
            None,
            "header injection",
        ),
        ({"rules": ["api.test"]}, None, "network.rules must map hosts"),
        ({"rules": {"api.test": "x"}}, None, "must be a list of rules"),
        ({"egressProxy": {"address": "p.test:1080"}}, None, "network.egressProxy: tunnelling"),
        ({"dnsServers": ["1.1.1.1"]}, None, "network.dnsServers"),
        ({"maskRequestHost": "${PORT}-x.test"}, None, "network.maskRequestHost"),
        ({"httpsPorts": [3000]}, None, "network.httpsPorts"),
        ({"allowPublicTraffic": True}, None, "allowPublicTraffic=True is not served"),
        ({"somethingNew": 1}, None, "network.somethingNew is not served"),
        ([], None, "network must be an object, got list"),
        ("x", None, "network must be an object, got str"),
        ({}, "no", "allow_internet_access must be a boolean"),
    ],
)
def test_what_cannot_be_served_is_refused_naming_the_field(network: Any, internet: Any, says: str) -> None:
    with pytest.raises(BadNetwork) as e:
        egress_of(network, internet)
    assert says in str(e.value)


def test_ten_thousand_entries_are_refused_at_once() -> None:
    huge = [f"h{i}.test" for i in range(10_000)]
    started = time.monotonic()
    with pytest.raises(BadNetwork, match=f"10000 entries, at most {MAX_ENTRIES}"):
        egress_of({"allowOut": huge, "denyOut": DENY})
    with pytest.raises(BadNetwork, match="10000 entries"):
        egress_of({"denyOut": [ALL_TRAFFIC] * 10_000})
    assert time.monotonic() - started < 1
    # As many as sandboxd takes, repeated ones once.
    got = egress_of({"allowOut": [f"h{i % 10}.test" for i in range(MAX_ENTRIES)], "denyOut": DENY})
    assert got is not None and len(got.allow) == 10


POOL = ["pypi.test", "secure.test:443", "*.corp.test:22,443", "10.0.0.0/8:5432", "[2001:db8::/32]:8080-8090"]


def test_lease_rules_take_each_entrys_ports_from_the_pool_and_lie_within_it() -> None:
    allow = (
        "pypi.test",
        "secure.test",
        "git.corp.test",
        "*.a.corp.test",
        "10.1.2.3",
        "10.2.0.0/16",
        "2001:db8::7",
    )
    rules = lease_rules(allow, POOL)
    assert rules == (
        "pypi.test:80,443",
        "secure.test:443",
        "git.corp.test:22,443",
        "*.a.corp.test:22,443",
        "10.1.2.3:5432",
        "10.2.0.0/16:5432",
        "[2001:db8::7]:8080-8090",
    )
    # sandboxd's own check accepts every one of them.
    assert narrow(POOL, rules) == rules
    # Covered twice: the ports of both rules.
    assert lease_rules(("x.corp.test",), [*POOL, "x.corp.test:8443"]) == ("x.corp.test:22,443,8443",)


def test_an_entry_outside_the_pool_goes_as_given_for_sandboxd_to_refuse_naming_it() -> None:
    for entry, why in [
        ("evil.test", "rule 'evil.test' lies outside the pool's rules"),
        ("corp.test", "rule 'corp.test' lies outside"),  # a suffix names what is below it only
        ("*.corp.test", "rule '*.corp.test:22,443'"),  # no wider than the pool's: covered, kept
        ("11.0.0.1", "rule '11.0.0.1' lies outside"),
        ("10.0.0.0/7", "rule '10.0.0.0/7' lies outside"),
        ("2001:db9::1", "rule '2001:db9::1' lies outside"),
    ]:
        rules = lease_rules((entry,), POOL)
        if entry == "*.corp.test":
            assert narrow(POOL, rules) == rules
            continue
        assert rules == (entry,)
        with pytest.raises(InvalidArgument, match=why):
            narrow(POOL, rules)
    with pytest.raises(InvalidArgument, match="the pool has no network at all"):
        narrow([], lease_rules(("pypi.test",), []))
    # An unreadable pool rule is skipped, not fatal.
    assert lease_rules(("pypi.test",), ["[broken", "pypi.test:80"]) == ("pypi.test:80",)


def _usage(cpu: float, memory: int = 50 << 20) -> sandboxes_pb2.Usage:
    return sandboxes_pb2.Usage(
        cpu_seconds=cpu,
        memory_bytes=memory,
        memory_peak_bytes=memory,
        disk_bytes=4096,
        disk_limit_bytes=1 << 30,
    )


def test_metrics_samples_and_what_is_kept() -> None:
    t0 = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    limits = common_pb2.Limits(cpu_millis=2000, memory_bytes=512 << 20)
    first = sample(t0 + dt.timedelta(seconds=10), t0, "sb1", _usage(5.0), limits, None)
    m = first.metric
    # 5 CPU seconds over 10 s of two cores: a quarter.
    assert (m["cpuCount"], m["cpuUsedPct"], m["memUsed"], m["memTotal"]) == (2, 25.0, 50 << 20, 512 << 20)
    assert (m["diskUsed"], m["diskTotal"], m["memCache"]) == (4096, 1 << 30, 0)
    assert m["timestamp"] == "2030-01-01T00:00:10Z" and m["timestampUnix"] == int(first.at.timestamp())
    second = sample(t0 + dt.timedelta(seconds=20), t0, "sb1", _usage(25.0), limits, first)
    assert second.metric["cpuUsedPct"] == 100.0  # capped
    # Another sandbox (a resume's) is not measured against the last one's CPU.
    other = sample(t0 + dt.timedelta(seconds=20), t0, "sb2", _usage(1.0), limits, second)
    assert other.metric["cpuUsedPct"] == 2.5
    unlimited = sample(t0 + dt.timedelta(seconds=1), t0, "sb1", _usage(0.5), common_pb2.Limits(), None)
    assert unlimited.metric["cpuCount"] == 1 and unlimited.metric["memTotal"] == 50 << 20
    assert sample(t0, t0, "sb1", _usage(0), limits, None).metric["cpuUsedPct"] == 0.0

    kept = Samples()
    for s in (first, second):
        kept.add("i1", s)
    start, end = int(first.at.timestamp()), int(second.at.timestamp())
    assert kept.between("i1", None, None) == [first.metric, second.metric]
    assert kept.between("i1", start + 1, None) == [second.metric]
    assert kept.between("i1", None, end - 1) == [first.metric]
    assert kept.between("nope", None, None) == []
    for _ in range(KEPT + 5):
        kept.add("i1", second)
    assert len(kept.between("i1", None, None)) == KEPT
    kept.keep_only(["other"])
    assert kept.last("i1") is None


async def test_create_refuses_network_it_cannot_serve_before_calling_sandboxd(
    e2b_http: TestClient[web.Request, web.Application],
) -> None:
    auth = {"X-API-Key": KEY}
    for path in ("/sandboxes", "/v2/sandboxes"):
        for given, says in [
            ({"network": {"denyOut": ["8.8.8.0/24"]}}, "network.denyOut: denying some addresses"),
            ({"network": {"allowOut": ["a:1"], "denyOut": DENY}}, "network.allowOut"),
            ({"network": {"egressProxy": {"address": "p:1"}}}, "network.egressProxy"),
            ({"allow_internet_access": "false"}, "allow_internet_access must be a boolean"),
        ]:
            r = await e2b_http.post(path, json={"templateID": "base", **given}, headers=auth)
            assert r.status == 400 and says in (await r.json())["message"], (path, given)


async def test_routes_not_served_answer_e2b_errors_naming_them(
    e2b_http: TestClient[web.Request, web.Application],
) -> None:
    auth = {"X-API-Key": KEY}
    for method, path, why in UNSERVED:
        concrete = path.format(
            sandbox_id="i1", secret_id="s1", volume_id="v1", template_id="t1", build_id="b1", tag="v"
        )
        r = await e2b_http.request(method, concrete, headers=auth)
        body = await r.json()
        assert r.status == 501 and body["code"] == 501, (method, path)
        assert body["message"] == f"{method} {concrete}: {why}"
    # What is served for a sandbox that is not there says so.
    for method, path in [
        ("PUT", "/sandboxes/inone/network"),
        ("GET", "/sandboxes/inone/metrics"),
        ("POST", "/sandboxes/inone/refreshes"),
    ]:
        r = await e2b_http.request(method, path, json={}, headers=auth)
        assert r.status == 404 and "inone" in (await r.json())["message"], path
    r = await e2b_http.get("/sandboxes/metrics", params={"sandbox_ids": "inone,itwo"}, headers=auth)
    assert (r.status, await r.json()) == (200, {"sandboxes": {}})
    r = await e2b_http.get("/sandboxes/metrics", headers=auth)
    assert r.status == 400 and "sandbox_ids" in (await r.json())["message"]
    r = await e2b_http.get(
        "/sandboxes/metrics", params={"sandbox_ids": ",".join(f"i{n}" for n in range(101))}, headers=auth
    )
    assert r.status == 400


async def test_deny_all_alone_is_no_network_and_restores_carry_the_latest_rules(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sandboxd.e2b.control import narrowing
    from sandboxd.e2b.egress import NarrowedClient

    class Pools:
        async def get_pool(self, name: str) -> Any:
            return pools_pb2.Pool(spec=pools_pb2.PoolSpec(network=["pypi.test", "*.corp.test:443"]))

    for egress in (egress_of({"denyOut": DENY}), egress_of(None, False)):
        assert egress is not None
        # No pool looked up: none at all is what a pool with or without rules gives.
        assert await narrowing(None, "p", egress) == ((), True)  # type: ignore[arg-type]
    allow = egress_of({"allowOut": ["pypi.test"], "denyOut": DENY})
    assert allow is not None
    assert await narrowing(Pools(), "p", allow) == (("pypi.test:80,443",), False)  # type: ignore[arg-type]

    asked: list[dict[str, Any]] = []

    async def restore(self: AsyncClient, snapshot_id: str, n: int = 1, **kw: Any) -> None:
        asked.append({"network": list(kw["network"]), "no_network": kw["no_network"]})

    monkeypatch.setattr(AsyncClient, "restore", restore)
    base = AsyncClient.__new__(AsyncClient)
    none = NarrowedClient(base, Egress(), (), True)
    some = NarrowedClient(base, allow, ("pypi.test:80,443",))
    await none.restore("sn-1")
    await some.restore("sn-1")
    # Asked for explicitly, a restore's own rules win over the sandbox's.
    await none.restore("sn-1", network=["pypi.test"])
    await some.restore("sn-1", no_network=True)
    assert asked == [
        {"network": [], "no_network": True},
        {"network": ["pypi.test:80,443"], "no_network": False},
        {"network": ["pypi.test"], "no_network": False},
        {"network": [], "no_network": True},
    ]
