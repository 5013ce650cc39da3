"""A sandbox's egress allow-list: which host names, addresses and ports it may reach.

Rules are strings: ``HOST[:PORTS]`` where HOST is an exact name
(``pypi.internal``), a suffix (``*.corp.example``: any name below it, not the
name itself), an IPv4/IPv6 address or a CIDR (``10.0.0.0/8``; IPv6 in brackets
when ports follow), and PORTS is ``443``, ``80,443`` or a range
``8000-8100``. Without PORTS a rule allows 80 and 443. Names are compared in
lower case with any trailing dot dropped.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass

from sandboxd.errors import InvalidArgument

MAX_RULES = 256
DEFAULT_PORTS: tuple[tuple[int, int], ...] = ((80, 80), (443, 443))
_LABEL = re.compile(r"^[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?$")
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

NO_EGRESS = "!none"
"""A lease's rules that allow nothing (AcquireRequest.no_network), as the one
entry of its rules wherever they travel (the state store, a Pod's lease
annotation and lease mark): never a rule itself (``parse_rule`` refuses it, so
a client cannot spell it as one), and kept apart from () = the pool's own."""
NO_NETWORK: tuple[str, ...] = (NO_EGRESS,)
"""A lease narrowed to no egress at all."""


def is_no_network(rules: Iterable[str]) -> bool:
    """Whether a lease's ``rules`` are NO_NETWORK (nothing reachable)."""
    return tuple(rules) == NO_NETWORK


def normalize_host(host: str) -> str:
    """A host name as rules compare it; brackets of an IPv6 literal dropped."""
    host = host.strip().lower()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host[:-1] if host.endswith(".") else host


def _is_name(host: str) -> bool:
    if not host or len(host) > 253:
        return False
    return all(_LABEL.match(label) for label in host.split("."))


def as_address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(normalize_host(host))
    except ValueError:
        return None


@dataclass(frozen=True)
class Rule:
    text: str
    """The rule as written, named in denials and pre-flight."""
    name: str = ""
    """Exact host name, or the suffix (with its leading dot) when ``suffix``."""
    suffix: bool = False
    network: IPNetwork | None = None
    ports: tuple[tuple[int, int], ...] = DEFAULT_PORTS

    def allows_port(self, port: int) -> bool:
        return any(lo <= port <= hi for lo, hi in self.ports)

    def allows_name(self, host: str) -> bool:
        if self.network is not None:
            return False
        return host.endswith(self.name) if self.suffix else host == self.name

    def allows_address(self, address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
        return self.network is not None and address in self.network


def _ports(text: str, rule: str) -> tuple[tuple[int, int], ...]:
    spans: list[tuple[int, int]] = []
    for part in text.split(","):
        lo_s, dash, hi_s = part.partition("-")
        if not lo_s.isdigit() or (dash and not hi_s.isdigit()):
            raise InvalidArgument("network", f"rule {rule!r}: ports must be N, N,M or N-M (got {text!r})")
        lo, hi = int(lo_s), int(hi_s) if dash else int(lo_s)
        if not 1 <= lo <= hi <= 65535:
            raise InvalidArgument("network", f"rule {rule!r}: ports must lie in 1-65535, low before high")
        spans.append((lo, hi))
    return tuple(spans)


def parse_rule(text: str) -> Rule:
    """One rule, or INVALID_ARGUMENT naming what is wrong with it."""
    raw = text.strip()
    if not raw:
        raise InvalidArgument("network", "a rule is empty")
    host, ports_text = raw, ""
    if raw.startswith("["):
        close = raw.find("]")
        if close < 0:
            raise InvalidArgument("network", f"rule {raw!r}: unclosed '['")
        host, rest = raw[1:close], raw[close + 1 :]
        if rest and not rest.startswith(":"):
            raise InvalidArgument("network", f"rule {raw!r}: expected ':PORTS' after ']'")
        ports_text = rest[1:]
    elif raw.count(":") == 1:
        host, ports_text = raw.split(":")
    ports = _ports(ports_text, raw) if ports_text else DEFAULT_PORTS
    host = normalize_host(host)
    try:
        network = ipaddress.ip_network(host, strict=False)
    except ValueError:
        network = None
    if network is not None:
        return Rule(text=raw, network=network, ports=ports)
    if host.startswith("*."):
        if not _is_name(host[2:]) or "." not in host[2:]:
            raise InvalidArgument(
                "network", f"rule {raw!r}: a suffix rule needs a name of two labels or more after '*.'"
            )
        return Rule(text=raw, name=host[1:], suffix=True, ports=ports)
    if not _is_name(host):
        raise InvalidArgument(
            "network",
            f"rule {raw!r}: not a host name, '*.suffix', address or CIDR"
            " (names: letters, digits, '-', '_' and dots)",
        )
    return Rule(text=raw, name=host, ports=ports)


@dataclass(frozen=True)
class EgressPolicy:
    """An allow-list; no rule means no network at all (the default)."""

    rules: tuple[Rule, ...] = ()
    lease: bool = False
    """A lease's rules, narrower than its pool's (named so in denials)."""

    @classmethod
    def parse(cls, texts: Iterable[str], *, lease: bool = False) -> EgressPolicy:
        """``texts`` as a policy; with ``lease`` (a lease's narrower rules)
        NO_NETWORK is the lease policy that allows nothing."""
        texts = list(texts)
        if lease and is_no_network(texts):
            return cls((), True)
        rules = tuple(parse_rule(t) for t in texts)
        if len(rules) > MAX_RULES:
            raise InvalidArgument("network", f"policy has {len(rules)} rules, at most {MAX_RULES}")
        return cls(rules, lease)

    @property
    def enabled(self) -> bool:
        return bool(self.rules)

    def describe(self) -> list[str]:
        return [r.text for r in self.rules]

    def rule_for(self, host: str, port: int) -> Rule | None:
        """The first rule letting ``host`` (a name or an address literal) be reached on ``port``."""
        host = normalize_host(host)
        address = as_address(host)
        for rule in self.rules:
            if not rule.allows_port(port):
                continue
            if address is not None and rule.allows_address(address):
                return rule
            if address is None and rule.allows_name(host):
                return rule
        return None

    def names_allowed(self, host: str) -> bool:
        """Whether some rule names ``host`` on any port (what DNS answers)."""
        host = normalize_host(host)
        return as_address(host) is None and any(r.allows_name(host) for r in self.rules)

    def address_allowed(self, address: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int) -> bool:
        """Whether an address rule covers ``address``: what lets a name resolve to a special address."""
        return any(r.allows_port(port) and r.allows_address(address) for r in self.rules)
