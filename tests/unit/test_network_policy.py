"""Egress allow-lists, the SNI reader and the DNS responder's answers (no network needed)."""

from __future__ import annotations

import asyncio
import ipaddress
import ssl
import struct

import pytest

from sandboxd.backends.network.dns import answer
from sandboxd.backends.network.policy import EgressPolicy, parse_rule
from sandboxd.backends.network.proxy import Bucket
from sandboxd.backends.network.sni import NotTls, read_client_hello
from sandboxd.errors import InvalidArgument


def test_rules_match_names_suffixes_addresses_and_ports() -> None:
    rules = ["pypi.internal", "*.corp.example:443", "10.0.0.0/8:8000-8100", "[fd00::1]:22"]
    policy = EgressPolicy.parse(rules)
    assert policy.rule_for("PYPI.internal.", 443) is policy.rules[0]
    assert policy.rule_for("pypi.internal", 80) is policy.rules[0]
    assert policy.rule_for("pypi.internal", 8080) is None
    assert policy.rule_for("git.corp.example", 443) is policy.rules[1]
    assert policy.rule_for("a.b.corp.example", 443) is policy.rules[1]
    assert policy.rule_for("corp.example", 443) is None, "a suffix rule is not the name itself"
    assert policy.rule_for("evilcorp.example", 443) is None
    assert policy.rule_for("git.corp.example", 80) is None
    assert policy.rule_for("10.1.2.3", 8050) is policy.rules[2]
    assert policy.rule_for("10.1.2.3", 80) is None
    assert policy.rule_for("[fd00::1]", 22) is policy.rules[3]
    assert policy.rule_for("pypi.internal.evil", 443) is None
    # A name rule never lets an address literal through, nor an address rule a name.
    assert EgressPolicy.parse(["10.0.0.1"]).rule_for("ten.example", 80) is None
    assert policy.names_allowed("x.corp.example") and not policy.names_allowed("10.1.2.3")
    assert policy.address_allowed(ipaddress.ip_address("10.9.9.9"), 8000)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "empty"),
        ("*.com", "two labels"),
        ("exa mple.com", "not a host name"),
        ("pypi.org:0", "1-65535"),
        ("pypi.org:99999", "1-65535"),
        ("pypi.org:443-80", "low before high"),
        ("pypi.org:http", "ports must be"),
        ("[fd00::1", "unclosed"),
        ("*.*.example.com", "two labels"),
    ],
)
def test_bad_rules_are_invalid_argument_naming_the_rule(text: str, words: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        parse_rule(text)
    assert words in str(info.value) and info.value.field == "network"


def test_no_rules_is_no_network() -> None:
    assert not EgressPolicy().enabled and EgressPolicy.parse(["a.example"]).enabled


def test_too_many_rules_refused() -> None:
    with pytest.raises(InvalidArgument, match="at most"):
        EgressPolicy.parse([f"h{i}.example" for i in range(257)])


def _client_hello(server_name: str | None) -> bytes:
    context = ssl.create_default_context()
    context.check_hostname = False
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=server_name)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


async def _read(data: bytes) -> tuple[bytes, str]:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    return await read_client_hello(reader)


async def test_sni_of_a_real_client_hello() -> None:
    hello = _client_hello("Secure.Test")
    raw, name = await _read(hello + b"trailing application bytes")
    assert name == "secure.test" and raw == hello
    assert (await _read(_client_hello(None)))[1] == ""


async def test_client_hello_split_over_records_is_gathered() -> None:
    hello = _client_hello("split.test")
    body = hello[5:]
    half = len(body) // 2
    records = b"".join(
        bytes([22, 3, 1]) + struct.pack("!H", len(part)) + part for part in (body[:half], body[half:])
    )
    assert (await _read(records))[1] == "split.test"


@pytest.mark.parametrize(
    "data", [b"GET / HTTP/1.1\r\n\r\n", b"\x16\x03\x01\x00", b"\x16\x03\x01\x00\x05\x02abcd"]
)
async def test_what_is_not_a_client_hello_raises(data: bytes) -> None:
    with pytest.raises(NotTls):
        await _read(data)


def _query(name: str, qtype: int = 1) -> bytes:
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
    return struct.pack("!HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0) + labels + struct.pack("!HH", qtype, 1)


def test_dns_answers_allowed_names_with_the_proxy_address_only() -> None:
    policy = EgressPolicy.parse(["pypi.test", "*.forge.test"])
    reply, name = answer(_query("git.forge.test"), policy, "169.254.77.1")
    assert name == "git.forge.test"
    assert reply[:2] == b"\x12\x34" and reply[3] & 0x0F == 0
    assert struct.unpack("!H", reply[6:8])[0] == 1 and reply[-4:] == bytes([169, 254, 77, 1])
    reply, _ = answer(_query("pypi.test", qtype=28), policy, "169.254.77.1")
    assert reply[3] & 0x0F == 0 and struct.unpack("!H", reply[6:8])[0] == 0, "no AAAA: the proxy is IPv4"
    reply, _ = answer(_query("evil.test"), policy, "169.254.77.1")
    assert reply[3] & 0x0F == 3 and struct.unpack("!H", reply[6:8])[0] == 0
    assert answer(b"\x00\x01junk", policy, "169.254.77.1") == (b"", "")
    assert answer(b"\x00\x01" + b"\x01\x00\x00\x05" + b"\x00" * 8, policy, "169.254.77.1")[0][3] & 0x0F == 1


async def test_the_bandwidth_bucket_makes_a_sender_wait_for_its_share() -> None:
    clock = [0.0]
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        clock[0] += seconds

    bucket = Bucket(1000, now=lambda: clock[0], sleep=sleep)
    await bucket.take(1000)  # the first second's burst
    assert waits == []
    await bucket.take(500)
    assert waits == [0.5]
    clock[0] += 10.0  # idle time refills one second's worth, not more
    await bucket.take(1500)
    assert waits == [0.5, 0.5]
    unbounded = Bucket(0, now=lambda: clock[0], sleep=sleep)
    await unbounded.take(1 << 30)
    assert waits == [0.5, 0.5]
