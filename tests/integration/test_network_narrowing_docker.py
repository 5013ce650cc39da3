"""A lease's network rules narrower than its pool's, on real containers.

The upstream namespace of the egress tests serves two hosts a pool allows:
``pypi.test`` (HTTP) and ``secure.test`` (HTTPS). A lease narrowed to
``pypi.test`` reaches it and is refused the other (403 naming the lease's
rules, NXDOMAIN), while a lease of the same pool that asked for nothing
reaches both; the narrowing holds across a control-plane restart, and a
recycled sandbox's next lease starts from the pool's rules. A lease with
no_network reaches neither (while one of the same pool without it reaches
both), and a running lease's rules change at once (SetLeaseNetwork): a
connection held open from before is cut, and widened back to the pool's
rules it reaches both again; a restart keeps the latest rules.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import docker
import pytest

from sandboxd.app import App, build_app
from sandboxd.backends.network import netns
from sandboxd.client import AsyncClient
from sandboxd.errors import InvalidArgument
from sandboxd.settings import Settings
from tests.integration.conftest import make_settings, poll, running_app
from tests.integration.test_network_egress_docker import Upstream, upstream  # noqa: F401

pytestmark = [
    pytest.mark.docker,
    pytest.mark.timeout(240),
    pytest.mark.skipif(os.geteuid() != 0 or bool(netns.missing_tools()), reason="needs root and iproute2"),
]

POOL = ["pypi.test", "secure.test:443"]
NARROW = ["pypi.test"]

# What a sandbox sees of each host: an HTTP fetch through the proxy, a CONNECT
# (its answer's first line and the denial's reason) and a name lookup.
PROBE = """
import json, socket, urllib.request
out = {}
try:
    out["http"] = urllib.request.urlopen("http://pypi.test/simple/tinypkg/", timeout=10).status
except Exception as e:
    out["http"] = str(e)
s = socket.create_connection(("169.254.77.1", 3128), timeout=10)
s.sendall(b"CONNECT secure.test:443 HTTP/1.1\\r\\nHost: secure.test:443\\r\\n\\r\\n")
head = s.recv(4096).decode(errors="replace")
out["connect"] = head.split("\\r\\n")[0]
out["reason"] = head.split("\\r\\n\\r\\n", 1)[-1].strip()
for name in ("pypi.test", "secure.test"):
    try:
        out[name] = socket.gethostbyname(name)
    except OSError:
        out[name] = "NXDOMAIN"
print(json.dumps(out))
"""


def _settings(tmp_path: Path, up: Upstream) -> Settings:
    hosts = {"pypi.test": up.address, "secure.test": up.address}
    return make_settings(tmp_path, **{"backend.egress_hosts": hosts})


@pytest.fixture
async def served(
    upstream: Upstream,  # noqa: F811
    engine: docker.DockerClient,
    tmp_path: Path,
) -> AsyncIterator[tuple[App, AsyncClient]]:
    """A started sandboxd whose sandboxes' egress reaches the upstream namespace's hosts; its client."""
    async with running_app(_settings(tmp_path, upstream), engine) as app, AsyncClient(app.address) as client:
        yield app, client


async def _probe(client: AsyncClient, sandbox_id: str) -> dict[str, object]:
    result = await client.exec(sandbox_id, ["python3", "-c", PROBE], timeout=60)
    assert result.exit_code == 0, result.text
    return dict(json.loads(result.text))


def _narrowed(seen: dict[str, object]) -> None:
    assert seen["http"] == 200, seen
    assert seen["connect"] == "HTTP/1.1 403 Forbidden", seen
    assert "no network rule allows secure.test:443 (allowed: pypi.test; the lease's rules)" in str(
        seen["reason"]
    ), seen
    assert seen["pypi.test"] == netns.EGRESS_ADDRESS and seen["secure.test"] == "NXDOMAIN", seen


def _none(seen: dict[str, object]) -> None:
    assert "403" in str(seen["http"]), seen
    assert seen["connect"] == "HTTP/1.1 403 Forbidden", seen
    assert "no network rule allows secure.test:443 (the lease's rules: no network at all)" in str(
        seen["reason"]
    ), seen
    assert seen["pypi.test"] == seen["secure.test"] == "NXDOMAIN", seen


def _wide(seen: dict[str, object]) -> None:
    assert seen["http"] == 200, seen
    assert seen["connect"] == "HTTP/1.1 200 Connection established", seen
    assert seen["pypi.test"] == seen["secure.test"] == netns.EGRESS_ADDRESS, seen


async def test_a_narrowed_lease_reaches_only_its_rules_and_its_pools_other_leases_both(
    served: tuple[App, AsyncClient], image: str
) -> None:
    app, client = served
    before = set(netns.leftover())
    await client.create_pool("net", image, min_ready=2, max_size=3, network=POOL)
    await client.create_pool("closed", image, max_size=1)
    with pytest.raises(InvalidArgument, match=r"rule 'evil.test' lies outside .*pypi.test, secure"):
        await client.lease("net", network=["pypi.test", "evil.test"], timeout=30)
    with pytest.raises(InvalidArgument, match="ports the pool does not allow"):
        await client.lease("net", network=["secure.test:80"], timeout=30)
    with pytest.raises(InvalidArgument, match="the pool has no network at all"):
        await client.lease("closed", network=NARROW, timeout=30)
    warm = app.control.pools["net"]
    await poll(lambda: warm.ready == 2, timeout=90, what="two warm sandboxes, pool rules")
    async with (
        client.acquire("net", network=NARROW, timeout=60) as narrow,
        client.acquire("net", timeout=60) as wide,
    ):
        _narrowed(await _probe(client, narrow.id))
        _wide(await _probe(client, wide.id))
        assert list((await client.get_sandbox(narrow.id)).network) == NARROW
        assert list((await client.get_sandbox(wide.id)).network) == []
        counts = app.control.backend.egress_counts()  # type: ignore[attr-defined]
        # Counted per sandbox: the refused CONNECT and lookup on the narrowed one; the
        # wide one's tunnel, which the probe left without a TLS hello, counts once.
        assert counts[narrow.id][1] == 2 and counts[wide.id][1] == 1, counts
    await client.delete_pool("net", force=True)
    await client.delete_pool("closed", force=True)
    await poll(lambda: not set(netns.leftover()) - before, what="the egress namespaces to go")


# A connection through the proxy held open (a CONNECT tunnel waiting for its
# TLS hello): says "open" in /tmp/held once it is, then how it ended.
HOLD = """
import socket, time
s = socket.create_connection(("169.254.77.1", 3128), timeout=10)
s.sendall(b"CONNECT secure.test:443 HTTP/1.1\\r\\nHost: secure.test:443\\r\\n\\r\\n")
head = s.recv(4096)
assert head.startswith(b"HTTP/1.1 200"), head
open("/tmp/held", "w").write("open")
s.settimeout(120)
began = time.monotonic()
try:
    rest = s.recv(4096)
    print("cut" if rest == b"" else f"data {rest!r}", round(time.monotonic() - began, 3))
except OSError as e:
    print("cut", e)
"""


async def test_a_lease_with_no_network_reaches_nothing_its_pool_allows(
    served: tuple[App, AsyncClient], image: str
) -> None:
    app, client = served
    await client.create_pool("net", image, min_ready=2, max_size=3, network=POOL)
    await client.create_pool("closed", image, max_size=1)
    with pytest.raises(InvalidArgument, match="no_network"):
        await client.lease("net", network=NARROW, no_network=True, timeout=30)
    warm = app.control.pools["net"]
    await poll(lambda: warm.ready == 2, timeout=90, what="two warm sandboxes, pool rules")
    async with (
        client.acquire("net", no_network=True, timeout=60) as cut,
        client.acquire("net", timeout=60) as wide,
        client.acquire("closed", no_network=True, timeout=60) as closed,
    ):
        _none(await _probe(client, cut.id))
        # The same probe from a lease of the same pool gets through: the block is the lease's.
        _wide(await _probe(client, wide.id))
        info = await client.get_sandbox(cut.id)
        assert info.no_network and list(info.network) == []
        assert not (await client.get_sandbox(wide.id)).no_network
        # A pool without network has none already: accepted, nothing changes.
        assert not (await client.get_sandbox(closed.id)).no_network
    await client.delete_pool("net", force=True)
    await client.delete_pool("closed", force=True)


async def test_a_running_leases_rules_change_at_once_cutting_what_was_open(
    served: tuple[App, AsyncClient], image: str
) -> None:
    _, client = served
    await client.create_pool("net", image, max_size=2, network=POOL)
    lease = await client.lease("net", lease_ttl=600, timeout=60)
    try:
        sid = lease[0].id
        _wide(await _probe(client, sid))
        held = asyncio.create_task(client.exec(sid, ["python3", "-c", HOLD], timeout=150))

        async def is_open() -> bool:
            return (await client.exec(sid, "cat /tmp/held 2>/dev/null")).text == "open"

        deadline = time.monotonic() + 30
        while not await is_open():
            assert time.monotonic() < deadline and not held.done(), "the held connection never opened"
        began = time.monotonic()
        await lease.set_network(no_network=True)
        assert lease.no_network and lease.network == []
        # Cut when the change answered (the tunnel's own wait for its hello is 30 s).
        done = await asyncio.wait_for(held, 10)
        assert done.text.startswith("cut"), done.text
        assert time.monotonic() - began < 10
        _none(await _probe(client, sid))
        await lease.set_network(NARROW)
        _narrowed(await _probe(client, sid))
        with pytest.raises(InvalidArgument, match="'evil.test' lies outside"):
            await lease.set_network(["evil.test"])
        _narrowed(await _probe(client, sid))
        # Widened back up to the pool's own rules: both reached again.
        await lease.set_network()
        _wide(await _probe(client, sid))
        assert list((await client.get_sandbox(sid)).network) == []
    finally:
        await lease.release()
    await client.delete_pool("net", force=True)


async def test_a_recycled_sandboxs_next_lease_starts_from_the_pools_rules(
    served: tuple[App, AsyncClient], image: str
) -> None:
    app, client = served
    await client.create_pool("rc", image, min_ready=1, max_size=1, network=POOL, recycle="same-tenant")
    warm = app.control.pools["rc"]
    async with client.acquire("rc", network=NARROW, timeout=60) as sb:
        first = sb.id
        _narrowed(await _probe(client, sb.id))
    await poll(lambda: warm.recycled_total == 1 and warm.ready == 1, timeout=60, what="the reset sandbox")
    async with client.acquire("rc", timeout=60) as sb:
        assert sb.id == first, "the pool holds one sandbox: the same one, reset"
        _wide(await _probe(client, sb.id))
    await poll(lambda: warm.recycled_total == 2 and warm.ready == 1, timeout=60, what="reset again")
    async with client.acquire("rc", network=NARROW, timeout=60) as sb:
        assert sb.id == first
        _narrowed(await _probe(client, sb.id))
    await client.delete_pool("rc", force=True)


async def test_a_restarted_control_plane_narrows_its_adopted_leases_again(
    upstream: Upstream,  # noqa: F811
    image: str,
    engine: docker.DockerClient,
    tmp_path: Path,
) -> None:
    settings = _settings(tmp_path, upstream)
    before = set(netns.leftover())
    first = build_app(settings)
    await first.start()
    try:
        async with AsyncClient(first.address) as client:
            await client.create_pool("net", image, max_size=3, network=POOL)
            lease = await client.lease("net", lease_ttl=600, timeout=60, network=NARROW)
            assert list(lease.network) == NARROW
            wide = await client.lease("net", lease_ttl=600, timeout=60)
            # Changed while running, twice: the latest rules are what a restart keeps.
            changed = await client.lease("net", lease_ttl=600, timeout=60, network=NARROW)
            await changed.set_network(())
            await changed.set_network(no_network=True)
            kept, other, cut = lease.sandboxes[0], wide.sandboxes[0], changed.sandboxes[0]
            _narrowed(await _probe(client, kept.id))
            _none(await _probe(client, cut.id))
    finally:
        await first.stop(grace=1)
    async with running_app(settings, engine) as app, AsyncClient(app.address) as client:
        # Linked again under the lease's rules, not the pool's the container was made with.
        _narrowed(await _probe(client, kept.id))
        _wide(await _probe(client, other.id))
        _none(await _probe(client, cut.id))
        assert list((await client.get_sandbox(kept.id)).network) == NARROW
        assert (await client.get_sandbox(cut.id)).no_network
        # Linked again though it allowed nothing: widened back, it reaches its pool's hosts.
        await client.set_lease_network(changed.id)
        _wide(await _probe(client, cut.id))
        await client.release(lease.id)
        await client.release(wide.id)
        await client.release(changed.id)
        await client.delete_pool("net", force=True)
        await poll(lambda: not set(netns.leftover()) - before, what="the egress namespaces to go")


async def test_a_fork_into_a_narrowed_lease_keeps_its_rules(
    served: tuple[App, AsyncClient], image: str
) -> None:
    _, client = served
    await client.create_pool("net", image, max_size=4, network=POOL)
    async with client.acquire("net", network=NARROW, timeout=60) as sb:
        assert (await sb.exec("echo kept > /workspace/note")).ok
        snap = await sb.snapshot()
    forked = await client.restore(snap.id, 2, lease_ttl=600, timeout=60, network=NARROW)
    try:
        assert forked.network == NARROW
        for child in forked:
            assert (await client.exec(child.id, "cat /workspace/note")).text == "kept\n"
            _narrowed(await _probe(client, child.id))
    finally:
        await forked.release()
    with pytest.raises(InvalidArgument, match="'evil.test' lies outside"):
        await client.restore(snap.id, 1, timeout=60, network=["evil.test"])
    plain = await client.restore(snap.id, 1, lease_ttl=600, timeout=60)
    try:
        _wide(await _probe(client, plain[0].id))
    finally:
        await plain.release()
    await client.delete_pool("net", force=True)
