"""The unchanged ``e2b`` SDK's per-sandbox network options and metrics
against sandboxd's E2B API, on real containers.

A pool allows the upstream namespace's two hosts (``pypi.test`` over HTTP,
``secure.test`` over HTTPS, as in the narrowing tests). A sandbox created
with ``allow_out=["pypi.test"]`` over a deny-all reaches that host and not
the other, which a sandbox of the same pool without network options
reaches; it keeps its rules through a filesystem pause and resume (a fresh
sandbox restored under them), in a fork and in a create from its snapshot, where a create from a
snapshot may narrow as a create from a template does. No internet access leaves a
sandbox nothing to reach, on a pool without network and on one with rules
(its lease narrowed to no network at all). update_network replaces a
running sandbox's rules as E2B says (deny-all: nothing; deny-all with
allow_out: those hosts; neither: the pool's own), and a resume after it
carries the latest; an entry outside the pool's rules comes back as the
SDK's exception with sandboxd's message.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

import docker
import httpx
import pytest

from sandboxd.backends.network import netns
from sandboxd.client import AsyncClient
from sandboxd.e2b import E2bSettings, make_app
from sandboxd.e2b.templates import Template
from tests.integration.conftest import make_settings, poll, running_app
from tests.integration.e2b_server import point_sdk
from tests.integration.test_network_egress_docker import Upstream, upstream  # noqa: F401
from tests.served import served

e2b = pytest.importorskip("e2b")

pytestmark = [
    pytest.mark.docker,
    pytest.mark.timeout(300),
    pytest.mark.skipif(os.geteuid() != 0 or bool(netns.missing_tools()), reason="needs root and iproute2"),
]

KEY = "e2b_" + "6e" * 20
POOL = ["pypi.test", "secure.test:443"]

# What a sandbox reaches of each host: an HTTP fetch of pypi.test, a CONNECT
# to secure.test through the egress proxy, and both names' lookups.
PROBE = """
import json, socket, urllib.request
out = {}
try:
    out["http"] = urllib.request.urlopen("http://pypi.test/simple/tinypkg/", timeout=10).status
except Exception as e:
    out["http"] = str(e)
try:
    s = socket.create_connection(("169.254.77.1", 3128), timeout=10)
    s.sendall(b"CONNECT secure.test:443 HTTP/1.1\\r\\nHost: secure.test:443\\r\\n\\r\\n")
    head = s.recv(4096).decode(errors="replace")
    out["connect"] = head.split("\\r\\n")[0]
    out["reason"] = head.split("\\r\\n\\r\\n", 1)[-1].strip()
except OSError as e:
    out["connect"] = str(e)
for name in ("pypi.test", "secure.test"):
    try:
        out[name] = socket.gethostbyname(name)
    except OSError:
        out[name] = "NXDOMAIN"
print(json.dumps(out))
"""


@pytest.fixture
async def e2b_api(
    upstream: Upstream,  # noqa: F811
    engine: docker.DockerClient,
    image: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[AsyncClient]:
    """sandboxd whose sandboxes' egress reaches the upstream's hosts, with
    the pools ``net`` (those hosts) and ``closed`` (no network), served to
    the SDK as the templates of those names; its client."""
    hosts = {"pypi.test": upstream.address, "secure.test": upstream.address}
    settings = make_settings(tmp_path, **{"backend.egress_hosts": hosts})
    before = set(netns.leftover())
    async with running_app(settings, engine) as app, AsyncClient(app.address) as client:
        await client.create_pool("net", image, max_size=10, network=POOL)
        await client.create_pool("closed", image, max_size=2)
        templates = {"net": Template("net"), "closed": Template("closed")}
        e2b_app = make_app(client, E2bSettings(templates=templates, api_keys=frozenset({KEY})))
        async with served(e2b_app, handler_cancellation=True) as url:
            point_sdk(monkeypatch, url, KEY)
            yield client
        await client.delete_pool("net", force=True)
        await client.delete_pool("closed", force=True)
    await poll(lambda: not set(netns.leftover()) - before, what="the egress namespaces to go")


async def _probe(sbx: object) -> dict[str, object]:
    result = await sbx.commands.run(f"python3 -c '{PROBE}'", timeout=90)  # type: ignore[attr-defined]
    return dict(json.loads(result.stdout))


def _only_pypi(seen: dict[str, object]) -> None:
    assert seen["http"] == 200, seen
    assert seen["connect"] == "HTTP/1.1 403 Forbidden", seen
    assert "no network rule allows secure.test:443 (allowed: pypi.test:80,443; the lease's rules)" in str(
        seen["reason"]
    ), seen
    assert seen["pypi.test"] == netns.EGRESS_ADDRESS and seen["secure.test"] == "NXDOMAIN", seen


def _both(seen: dict[str, object]) -> None:
    assert seen["http"] == 200, seen
    assert seen["connect"] == "HTTP/1.1 200 Connection established", seen
    assert seen["pypi.test"] == seen["secure.test"] == netns.EGRESS_ADDRESS, seen


def _nothing(seen: dict[str, object]) -> None:
    assert seen["http"] != 200 and not str(seen["connect"]).startswith("HTTP/1.1 200"), seen
    assert seen["pypi.test"] == seen["secure.test"] == "NXDOMAIN", seen


def _only_secure(seen: dict[str, object]) -> None:
    assert "403" in str(seen["http"]), seen
    assert seen["connect"] == "HTTP/1.1 200 Connection established", seen
    assert seen["pypi.test"] == "NXDOMAIN" and seen["secure.test"] == netns.EGRESS_ADDRESS, seen


async def test_sdk_network_options_narrow_the_sandbox_and_it_keeps_them(e2b_api: AsyncClient) -> None:
    from e2b import ALL_TRAFFIC, AsyncSandbox

    narrow = await AsyncSandbox.create(
        "net", timeout=180, network={"allow_out": ["pypi.test"], "deny_out": [ALL_TRAFFIC]}
    )
    wide = await AsyncSandbox.create("net", timeout=180)
    forks: list[AsyncSandbox] = []
    try:
        _only_pypi(await _probe(narrow))
        _both(await _probe(wide))
        info = await narrow.get_info()
        assert info.network is not None
        assert (info.network.get("allow_out"), info.network.get("deny_out")) == (["pypi.test"], [ALL_TRAFFIC])
        assert (await wide.get_info()).network is None
        leases = {s.lease_id: s for s in await e2b_api.list_sandboxes("net") if s.lease_id}
        assert sorted(list(s.network) for s in leases.values()) == [[], ["pypi.test:80,443"]]

        # A filesystem pause lets the sandbox go; the resume's fresh one runs under the same rules.
        assert await narrow.pause() is True
        resumed = await AsyncSandbox.connect(narrow.sandbox_id)
        _only_pypi(await _probe(resumed))
        results = await resumed.fork(count=1, timeout=120)
        forks = [f for f in results if isinstance(f, AsyncSandbox)]
        assert len(forks) == 1, results
        _only_pypi(await _probe(forks[0]))
        # A snapshot of it restores under its rules too.
        snap = await resumed.create_snapshot()
        try:
            forks.append(await AsyncSandbox.create(snap.snapshot_id, timeout=120))
            _only_pypi(await _probe(forks[-1]))
        finally:
            await AsyncSandbox.delete_snapshot(snap.snapshot_id)
        # A create from a snapshot takes network options as a create from a
        # template does; without them it runs under what its source ran under.
        snap = await wide.create_snapshot()
        try:
            only = {"allow_out": ["secure.test"], "deny_out": [ALL_TRAFFIC]}
            forks.append(await AsyncSandbox.create(snap.snapshot_id, timeout=120, network=only))
            _only_secure(await _probe(forks[-1]))
            offline = await AsyncSandbox.create(snap.snapshot_id, timeout=120, allow_internet_access=False)
            forks.append(offline)
            _nothing(await _probe(forks[-1]))
            forks.append(await AsyncSandbox.create(snap.snapshot_id, timeout=120))
            _both(await _probe(forks[-1]))
        finally:
            await AsyncSandbox.delete_snapshot(snap.snapshot_id)
    finally:
        for sbx in (narrow, wide, *forks):
            await sbx.kill()


async def test_no_internet_access_reaches_nothing_or_is_refused_saying_why(e2b_api: AsyncClient) -> None:
    from e2b import ALL_TRAFFIC, AsyncSandbox, SandboxException

    offline = await AsyncSandbox.create("closed", timeout=120, allow_internet_access=False)
    try:
        _nothing(await _probe(offline))
        assert (await offline.get_info()).allow_internet_access is False
    finally:
        await offline.kill()
    # A pool with rules: its lease narrowed to no network at all, where a
    # sandbox of the same pool without the option reaches both hosts.
    cut = await AsyncSandbox.create("net", timeout=120, allow_internet_access=False)
    denied = await AsyncSandbox.create("net", timeout=120, network={"deny_out": [ALL_TRAFFIC]})
    wide = await AsyncSandbox.create("net", timeout=120)
    try:
        for sbx in (cut, denied):
            seen = await _probe(sbx)
            _nothing(seen)
            assert "no network at all" in str(seen["reason"]), seen
        _both(await _probe(wide))
        assert (await cut.get_info()).allow_internet_access is False
        leases = [s for s in await e2b_api.list_sandboxes("net") if s.lease_id]
        assert sorted(s.no_network for s in leases) == [False, True, True]
    finally:
        for sbx in (cut, denied, wide):
            await sbx.kill()
    with pytest.raises(SandboxException, match="network.denyOut: denying some addresses"):
        await AsyncSandbox.create("net", timeout=60, network={"deny_out": ["198.18.0.0/15"]})
    assert [s for s in await e2b_api.list_sandboxes() if s.lease_id] == []


async def test_update_network_replaces_the_rules_and_an_entry_outside_the_pool_is_refused(
    e2b_api: AsyncClient,
) -> None:
    from e2b import ALL_TRAFFIC, AsyncSandbox, SandboxException

    with pytest.raises(SandboxException) as e:
        await AsyncSandbox.create(
            "net", timeout=60, network={"allow_out": ["pypi.test", "evil.test"], "deny_out": [ALL_TRAFFIC]}
        )
    assert "400: network: rule 'evil.test' lies outside the pool's rules (pypi.test, secure.test:443)" in str(
        e.value
    )
    sbx = await AsyncSandbox.create(
        "net", timeout=180, network={"allow_out": ["pypi.test"], "deny_out": [ALL_TRAFFIC]}
    )
    try:
        _only_pypi(await _probe(sbx))
        # Deny-all alone: nothing at all from the moment the update answers.
        await sbx.update_network({"deny_out": [ALL_TRAFFIC]})
        _nothing(await _probe(sbx))
        (lease,) = [s for s in await e2b_api.list_sandboxes("net") if s.lease_id]
        assert lease.no_network and list(lease.network) == []
        # The whole config replaced: one host allowed, not the one before.
        await sbx.update_network({"allow_out": ["secure.test"], "deny_out": [ALL_TRAFFIC]})
        _only_secure(await _probe(sbx))
        info = await sbx.get_info()
        assert info.network is not None and info.network.get("allow_out") == ["secure.test"]
        # A resume after a filesystem pause carries the latest rules.
        assert await sbx.pause() is True
        sbx = await AsyncSandbox.connect(sbx.sandbox_id)
        _only_secure(await _probe(sbx))
        with pytest.raises(SandboxException) as e:
            await sbx.update_network({"allow_out": ["evil.test"], "deny_out": [ALL_TRAFFIC]})
        assert "400: update_network: network: rule 'evil.test' lies outside the pool's rules" in str(e.value)
        _only_secure(await _probe(sbx))
        with pytest.raises(SandboxException, match="network.denyOut: denying some addresses"):
            await sbx.update_network({"deny_out": ["198.18.0.0/15"]})
        # No deny-all: the pool's own rules again.
        await sbx.update_network({})
        _both(await _probe(sbx))
        assert (await sbx.get_info()).network is None
    finally:
        await sbx.kill()


async def test_get_metrics_samples_the_sandbox_and_keeps_earlier_samples(e2b_api: AsyncClient) -> None:
    from e2b import AsyncSandbox

    sbx = await AsyncSandbox.create("net", timeout=120)
    try:
        await sbx.commands.run("python3 -c 'x = bytearray(64 << 20); sum(range(3_000_000))'")
        await sbx.files.write("/workspace/blob", b"x" * (1 << 20))
        first = await sbx.get_metrics()
        assert len(first) == 1
        m = first[0]
        assert m.cpu_count >= 1 and 0.0 <= m.cpu_used_pct <= 100.0
        assert 0 < m.mem_used <= m.mem_total
        assert (1 << 20) <= m.disk_used <= m.disk_total
        assert abs((dt.datetime.now(dt.UTC) - m.timestamp).total_seconds()) < 30
        second = await sbx.get_metrics()
        assert len(second) == 2 and second[0].timestamp == m.timestamp
        assert second[1].timestamp >= m.timestamp
        # Only what lies within start..end, and nothing sampled for a past window.
        past = await sbx.get_metrics(end=m.timestamp - dt.timedelta(seconds=60))
        assert past == []
        # The keep-alive the SDK's CLI sends: the sandbox's end only grows.
        end_before = (await sbx.get_info()).end_at
        async with httpx.AsyncClient(base_url=os.environ["E2B_API_URL"], headers={"X-API-Key": KEY}) as http:
            r = await http.post(f"/sandboxes/{sbx.sandbox_id}/refreshes", json={"duration": 600})
            assert r.status_code == 204, r.text
            r = await http.post(f"/sandboxes/{sbx.sandbox_id}/refreshes", json={"duration": 5})
            assert r.status_code == 204, r.text
        assert (await sbx.get_info()).end_at - end_before >= dt.timedelta(seconds=400)
    finally:
        await sbx.kill()
