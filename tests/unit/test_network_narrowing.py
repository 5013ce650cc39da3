"""A lease's network rules narrower than its pool's: the subset check (hostile
input included), and a proxy put under narrower rules mid-way (no network
beyond this host's loopback needed)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import pytest

from sandboxd.backends.base import EgressNarrowing, Limits
from sandboxd.backends.docker import DockerBackend
from sandboxd.backends.fake import FakeBackend
from sandboxd.backends.kubernetes import KubernetesBackend
from sandboxd.backends.network.narrowing import narrow
from sandboxd.backends.network.policy import MAX_RULES, EgressPolicy
from sandboxd.backends.network.proxy import EgressProxy
from sandboxd.core.narrowing import checked_narrowing
from sandboxd.core.pools import PoolConfig
from sandboxd.errors import FailedPrecondition, InvalidArgument

POOL = [
    "pypi.test",
    "*.corp.example:443",
    "10.0.0.0/8:8000-8100",
    "[fd00::/64]:22",
    "forge.test:80",
    "forge.test:443,9418",
    "*.corp.internal",
]


@pytest.mark.parametrize(
    "asked",
    [
        ["pypi.test"],
        ["pypi.test:80"],
        ["PyPI.Test.:443"],
        ["*.corp.example:443"],
        ["*.git.corp.example:443"],
        ["git.corp.example:443"],
        ["a.b.corp.example:443"],
        ["10.1.2.3:8000"],
        ["10.1.0.0/16:8050-8100"],
        ["10.0.0.0/8:8000-8100"],
        ["[fd00::1]:22"],
        ["[fd00::/96]:22"],
        # Ports allowed by two pool rules for one host together.
        ["forge.test:80,443,9418"],
        ["forge.test"],
        ["x.corp.internal", "*.y.corp.internal:80"],
        ["pypi.test", "pypi.test:443", "pypi.test:80"],
        POOL,
    ],
)
def test_rules_within_the_pools_are_the_leases(asked: list[str]) -> None:
    assert narrow(POOL, asked) == tuple(a.strip() for a in asked)


@pytest.mark.parametrize(
    ("asked", "words"),
    [
        (["evil.test"], "'evil.test' lies outside the pool's rules"),
        (["pypi.test.evil"], "outside"),
        (["xpypi.test"], "outside"),
        (["*.test"], "a suffix rule needs"),
        (["*.x.test"], "outside"),
        (["*.com"], "a suffix rule needs"),
        # A suffix below an exact name is not within it, nor the suffix of a name.
        (["*.pypi.test"], "outside"),
        (["corp.example:443"], "outside"),
        (["*.example:443"], "a suffix rule needs"),
        (["*.other.example:443"], "outside"),
        (["evilcorp.example:443"], "outside"),
        (["x.evilcorp.example:443"], "outside"),
        (["pypi.test:8080"], "ports the pool does not allow"),
        (["pypi.test:1-65535"], "ports the pool does not allow"),
        (["git.corp.example"], "ports the pool does not allow"),
        (["forge.test:80-443"], "ports the pool does not allow"),
        (["10.0.0.0/7:8000"], "outside"),
        (["11.0.0.1:8000"], "outside"),
        (["10.1.2.3:8101"], "ports the pool does not allow"),
        (["0.0.0.0/0:8000"], "outside"),
        # An IPv4 address written as IPv6 is not within an IPv4 CIDR.
        (["[::ffff:10.0.0.1]:8000"], "outside"),
        (["[fd00:0:0:1::1]:22"], "outside"),
        (["[::/0]:22"], "outside"),
        # A name is not within an address rule, nor an address within a name rule.
        (["ten.corp.internal:8000"], "ports the pool does not allow"),
        (["127.0.0.1"], "outside"),
        (["pypi.test", "evil.test"], "'evil.test'"),
        (["*"], "not a host name"),
        (["*.*.corp.example:443"], "a suffix rule needs a name"),
        (["pypi.test:0"], "1-65535"),
        (["pypi.test:65536"], "1-65535"),
        (["pypi.test:443-80"], "low before high"),
        (["pypi.test:x"], "ports must be"),
        ([""], "empty"),
        (["  "], "empty"),
        (["[fd00::1"], "unclosed"),
        (["pypi test"], "not a host name"),
        (["x" * 100_000], "longer than 512"),
    ],
)
def test_rules_outside_the_pools_or_malformed_are_refused(asked: list[str], words: str) -> None:
    with pytest.raises(InvalidArgument, match="network") as caught:
        narrow(POOL, asked)
    assert words in str(caught.value)
    assert len(str(caught.value)) < 1000, "a hostile rule is quoted, not echoed whole"


def test_a_refusal_names_the_pools_rules() -> None:
    with pytest.raises(InvalidArgument) as caught:
        narrow(["pypi.test", "*.corp.example:443"], ["evil.test"])
    assert "pypi.test, *.corp.example:443" in str(caught.value)
    many = [f"h{i}.test" for i in range(40)]
    with pytest.raises(InvalidArgument) as caught:
        narrow(many, ["evil.test"])
    assert "and 32 more" in str(caught.value)


def test_nothing_asked_is_the_pools_rules_and_a_pool_without_network_narrows_nothing() -> None:
    assert narrow(POOL, []) == ()
    assert narrow([], []) == ()
    with pytest.raises(InvalidArgument, match="'pypi.test': the pool has no network at all"):
        narrow([], ["pypi.test"])


def test_huge_lists_are_refused_and_the_largest_allowed_is_quick() -> None:
    with pytest.raises(InvalidArgument, match=f"at most {MAX_RULES}"):
        narrow(POOL, ["pypi.test"] * (MAX_RULES + 1))
    pool = [f"*.d{i}.test:1-65535" for i in range(MAX_RULES)]
    asked = [f"x.d{i}.test:{1 + i}-{60000 + i}" for i in range(MAX_RULES)]
    assert len(narrow(pool, asked)) == MAX_RULES


@contextlib.asynccontextmanager
async def _upstream() -> AsyncIterator[tuple[int, asyncio.Event]]:
    """A server on loopback that reads a request and never answers it (a held connection)."""
    seen = asyncio.Event()

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        seen.set()
        await reader.read()
        writer.close()

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    try:
        yield int(server.sockets[0].getsockname()[1]), seen
    finally:
        server.close()
        await server.wait_closed()


async def _get(port: int, url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {url} HTTP/1.1\r\nHost: {url.split('/')[2]}\r\n\r\n".encode())
    await writer.drain()
    return reader, writer


async def test_a_proxy_put_under_narrower_rules_cuts_what_was_open_and_refuses_the_rest() -> None:
    async with _upstream() as (up, up_seen), _upstream() as (other, other_seen):
        pool = [f"127.0.0.1:{up}", f"127.0.0.1:{other}"]
        proxy = EgressProxy("sbx-narrow", EgressPolicy.parse(pool))
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        await proxy.start(listener)
        try:
            reader, writer = await _get(port, f"http://127.0.0.1:{other}/")
            await asyncio.wait_for(other_seen.wait(), 5)
            # Held open under the pool's rules, then the lease narrows them.
            proxy.set_policy(EgressPolicy.parse(narrow(pool, [f"127.0.0.1:{up}"]), lease=True))
            assert await asyncio.wait_for(reader.read(), 5) == b""
            writer.close()
            reader, writer = await _get(port, f"http://127.0.0.1:{other}/")
            head = (await asyncio.wait_for(reader.read(), 5)).decode()
            writer.close()
            assert head.startswith("HTTP/1.1 403 Forbidden"), head
            assert f"no network rule allows 127.0.0.1:{other}" in head
            assert f"(allowed: 127.0.0.1:{up}; the lease's rules)" in head
            reader, writer = await _get(port, f"http://127.0.0.1:{up}/")
            await asyncio.wait_for(up_seen.wait(), 5)
            writer.close()
            # Back to the pool's own (a recycled sandbox's reset).
            proxy.set_policy(EgressPolicy.parse(pool))
            other_seen.clear()
            reader, writer = await _get(port, f"http://127.0.0.1:{other}/")
            await asyncio.wait_for(other_seen.wait(), 5)
            writer.close()
            assert proxy.stats.denied == 1 and proxy.stats.allowed >= 3
        finally:
            await proxy.close()


async def test_backends_that_cannot_narrow_refuse_it_and_docker_and_kubernetes_can() -> None:
    config = PoolConfig("t/p", "img", 0, 1, Limits(), network=["pypi.test", "forge.test"])
    with pytest.raises(FailedPrecondition, match="cannot narrow"):
        await checked_narrowing(FakeBackend(), config, ["pypi.test"])
    # Checked before the backend: a rule outside the pool's is the caller's to fix.
    with pytest.raises(InvalidArgument, match="outside"):
        await checked_narrowing(FakeBackend(), config, ["evil.test"])
    assert await checked_narrowing(FakeBackend(), config, []) == ()
    # On Kubernetes only where the chart's proxy acknowledges each change of
    # a Pod's rules (narrowing_refusal; tests/kube/test_network_narrowing.py).
    assert issubclass(KubernetesBackend, EgressNarrowing)
    assert issubclass(DockerBackend, EgressNarrowing)
