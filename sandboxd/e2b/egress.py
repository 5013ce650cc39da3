"""E2B's per-sandbox network options as sandboxd's per-lease narrowing.

E2B lets a sandbox reach everything by default; ``denyOut`` blocks
addresses, ``allowOut`` entries win over denied ones, and
``allow_internet_access=False`` is ``denyOut=["0.0.0.0/0"]``. A sandboxd
sandbox reaches only what its pool's rules allow (deny by default), and an
acquire may narrow those rules to a subset of them. So:

- no network option, or ``allowOut`` without deny-all: the pool's rules,
  unchanged (nothing E2B would block is blocked beyond what the pool
  already does);
- deny-all (``"0.0.0.0/0"`` in ``denyOut``, or no internet access) with
  ``allowOut``: the lease narrowed to those entries, each on the ports its
  pool allows it (E2B's entries allow any port), each required to lie
  within the pool's rules (sandboxd refuses one outside them, naming it);
- deny-all without ``allowOut``: nothing reachable: the lease narrowed to
  no network at all (sandboxd's ``no_network``; a pool without network
  rules has none as it is);
- a partial ``denyOut``, header-injecting ``rules``, an ``egressProxy``,
  ``dnsServers``, ``maskRequestHost``, ``httpsPorts`` or public port
  traffic: refused, naming the field and why (``BadNetwork``).

Callables the SDK accepts for ``allow_out``/``deny_out`` and for a rule's
``transform`` are resolved by the SDK before the request is sent: what
arrives here is always data.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sandboxd.client import AsyncClient
from sandboxd.client.aio import Lease

__all__ = [
    "ALL_TRAFFIC",
    "BadNetwork",
    "Egress",
    "NarrowedClient",
    "egress_of",
    "info_of",
    "lease_rules",
]

ALL_TRAFFIC = "0.0.0.0/0"
"""E2B's all-traffic sentinel (``e2b.ALL_TRAFFIC``)."""

MAX_ENTRIES = 256
"""The most entries an allow or deny list may hold: sandboxd's most rules for a lease."""

_MAX_ENTRY_CHARS = 253
_LABEL = re.compile(r"^[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?$")
_DEFAULT_PORTS = "80,443"
"""What a sandboxd rule without ports allows."""

# The network fields a create or update may carry that change nothing here
# when left at these values, and why any other value is refused.
_INBOUND = {
    "maskRequestHost": (
        ("",),
        "a sandbox's ports are reached through this server's own routes, whose host is not masked",
    ),
    "httpsPorts": (([],), "a sandbox's ports are not served at public URLs, over HTTPS or otherwise"),
    "allowPublicTraffic": (
        (False,),
        "a sandbox's ports are served only to calls carrying its access or traffic token "
        "(allowPublicTraffic=false is what is served)",
    ),
}
_EGRESS_ONLY = {
    "egressProxy": (
        "tunnelling through a SOCKS5 proxy is not served: egress goes through sandboxd's own proxy"
    ),
    "dnsServers": (
        "reaching other DNS servers is not served: sandboxd's resolver answers the names the rules allow "
        "(leave dns_servers out)"
    ),
}
_KNOWN = {"allowOut", "denyOut", "rules", *_INBOUND, *_EGRESS_ONLY}


class BadNetwork(ValueError):
    """A network option that sandboxd cannot honour as E2B means it: the
    message names the field and why (a 400 answer)."""


@dataclass(frozen=True)
class Egress:
    """A create's network options as asked, checked: all traffic denied
    except ``allow`` (E2B's entries, normalised)."""

    allow: tuple[str, ...] = ()
    internet: bool | None = None
    """``allow_internet_access`` as given (None: not given)."""
    deny: tuple[str, ...] = (ALL_TRAFFIC,)


def _quote(text: str) -> str:
    return repr(text if len(text) <= 80 else text[:80] + "...")


def _entry(field: str, value: object) -> str:
    """An ``allowOut``/``denyOut`` entry normalised: an address, a CIDR
    (its network), a host name or ``*.suffix`` in lower case."""
    if not isinstance(value, str):
        raise BadNetwork(f"network.{field}: entries must be strings, got {type(value).__name__}")
    text = value.strip()
    if not text:
        raise BadNetwork(f"network.{field}: an entry is empty")
    if len(text) > _MAX_ENTRY_CHARS + 2:
        raise BadNetwork(
            f"network.{field}: entry {_quote(text)} is longer than {_MAX_ENTRY_CHARS} characters"
        )
    try:
        network = None if "%" in text else ipaddress.ip_network(text, strict=False)
    except ValueError:
        network = None
    if network is not None:
        return str(network) if "/" in text else str(network.network_address)
    if "/" in text and all(c in "0123456789abcdefABCDEF.:/" for c in text):
        raise BadNetwork(f"network.{field}: entry {_quote(text)} is not a valid address or CIDR")
    if text.count(":") > 1:
        raise BadNetwork(f"network.{field}: entry {_quote(text)} is not a valid IPv6 address or CIDR")
    if ":" in text:
        raise BadNetwork(
            f"network.{field}: entry {_quote(text)}: E2B's entries are addresses, CIDRs or host names, "
            "without ports"
        )
    host = text.lower().removesuffix(".")
    name = host.removeprefix("*.")
    labels = name.split(".")
    if not name or len(name) > _MAX_ENTRY_CHARS or not all(_LABEL.match(label) for label in labels):
        raise BadNetwork(
            f"network.{field}: entry {_quote(text)} is not an address, a CIDR, a host name or '*.suffix'"
        )
    if labels[-1].isdigit():
        raise BadNetwork(f"network.{field}: entry {_quote(text)} is not a valid IPv4 address")
    if host != name and "." not in name:
        raise BadNetwork(
            f"network.{field}: entry {_quote(text)}: a '*.' entry needs a name of two labels or more"
        )
    return host


def _entries(network: Mapping[str, Any], field: str) -> tuple[str, ...] | None:
    value = network.get(field)
    if value is None:
        return None
    if not isinstance(value, list):
        raise BadNetwork(f"network.{field} must be a list of strings, got {type(value).__name__}")
    if len(value) > MAX_ENTRIES:
        raise BadNetwork(f"network.{field} has {len(value)} entries, at most {MAX_ENTRIES}")
    return tuple(dict.fromkeys(_entry(field, v) for v in value))


def _check_rules(rules: object) -> None:
    """Per-host rules: accepted where they inject nothing (E2B's ``rules``
    alone allow nothing, so one without a transform changes nothing)."""
    if rules is None:
        return
    if not isinstance(rules, dict):
        raise BadNetwork(f"network.rules must map hosts to lists of rules, got {type(rules).__name__}")
    for host, host_rules in rules.items():
        if not isinstance(host_rules, list):
            raise BadNetwork(f"network.rules[{_quote(str(host))}] must be a list of rules")
        for rule in host_rules:
            if not isinstance(rule, dict):
                raise BadNetwork(f"network.rules[{_quote(str(host))}]: a rule must be an object")
            transform = rule.get("transform")
            if transform in (None, {}) or (isinstance(transform, dict) and not transform.get("headers")):
                continue
            raise BadNetwork(
                f"network.rules[{_quote(str(host))}]: header injection (transform) is not served: "
                "sandboxd's egress proxy forwards requests unchanged"
            )


def egress_of(network: object, internet: object = None) -> Egress | None:
    """A create's (or update's) ``network`` body and ``allow_internet_access``
    as sandboxd can serve them: None where the pool's rules are served
    unchanged, else the deny-all and what stays reachable. ``BadNetwork``
    naming the field for what cannot be served."""
    if internet is not None and not isinstance(internet, bool):
        raise BadNetwork(f"allow_internet_access must be a boolean, got {type(internet).__name__}")
    if network is None:
        network = {}
    if not isinstance(network, dict):
        raise BadNetwork(f"network must be an object, got {type(network).__name__}")
    for name, value in network.items():
        if name not in _KNOWN and value not in (None, [], {}, ""):
            raise BadNetwork(f"network.{name} is not served")
    for name, (fine, why) in _INBOUND.items():
        value = network.get(name)
        if value is not None and value not in fine:
            raise BadNetwork(f"network.{name}={value!r} is not served: {why}")
    for name, why in _EGRESS_ONLY.items():
        if network.get(name) not in (None, [], {}):
            raise BadNetwork(f"network.{name}: {why}")
    _check_rules(network.get("rules"))
    allow = _entries(network, "allowOut") or ()
    deny = _entries(network, "denyOut") or ()
    deny_all = ALL_TRAFFIC in deny or internet is False
    if deny and not deny_all:
        shown = ", ".join(deny[:4]) + (", ..." if len(deny) > 4 else "")
        raise BadNetwork(
            f"network.denyOut: denying some addresses ({shown}) while allowing the rest is not served: "
            "a sandbox reaches only what its sandboxd pool's rules allow, which a lease can narrow but not "
            f"cut holes in; deny all "
            f"(deny_out=[{ALL_TRAFFIC!r}]) and list what stays reachable in allow_out"
        )
    if not deny_all or ALL_TRAFFIC in allow:
        return None
    return Egress(allow=allow, internet=internet, deny=deny or (ALL_TRAFFIC,))


@dataclass(frozen=True)
class _PoolRule:
    name: str = ""
    suffix: bool = False
    network: ipaddress.IPv4Network | ipaddress.IPv6Network | None = None
    ports: str = _DEFAULT_PORTS


def _pool_rule(text: str) -> _PoolRule | None:
    """A pool rule (sandboxd's ``HOST[:PORTS]``) as far as choosing ports
    needs it; None for one this cannot read (sandboxd checks it)."""
    raw = text.strip()
    host, ports = raw, ""
    if raw.startswith("["):
        close = raw.find("]")
        if close < 0:
            return None
        host, rest = raw[1:close], raw[close + 1 :]
        ports = rest[1:] if rest.startswith(":") else ""
    elif raw.count(":") == 1:
        host, ports = raw.split(":")
    host = host.strip().lower().removesuffix(".")
    ports = ports.strip() or _DEFAULT_PORTS
    try:
        return _PoolRule(network=ipaddress.ip_network(host, strict=False), ports=ports)
    except ValueError:
        pass
    if host.startswith("*."):
        return _PoolRule(name=host[1:], suffix=True, ports=ports)
    return _PoolRule(name=host, ports=ports) if host else None


def _covers(rule: _PoolRule, entry: str) -> bool:
    """Whether every host ``entry`` names is one ``rule`` names (ports aside), as sandboxd judges it."""
    try:
        network = ipaddress.ip_network(entry, strict=False)
    except ValueError:
        network = None
    if network is not None:
        return (
            rule.network is not None
            and rule.network.version == network.version
            and network.subnet_of(rule.network)  # type: ignore[arg-type]
        )
    if rule.network is not None:
        return False
    if entry.startswith("*."):
        return rule.suffix and entry[1:].endswith(rule.name)
    return entry.endswith(rule.name) if rule.suffix else entry == rule.name


def _ports(texts: Sequence[str]) -> str:
    return ",".join(dict.fromkeys(p.strip() for t in texts for p in t.split(",") if p.strip()))


def lease_rules(allow: Sequence[str], pool_rules: Sequence[str]) -> tuple[str, ...]:
    """sandboxd rules for E2B ``allow`` entries: each on every port its
    pool's rules allow it (E2B's entries allow any port); one no pool rule
    covers is passed as given, for sandboxd to refuse naming it."""
    pool = [r for r in (_pool_rule(t) for t in pool_rules) if r is not None]
    out: list[str] = []
    for entry in allow:
        ports = _ports([r.ports for r in pool if _covers(r, entry)])
        host = f"[{entry}]" if ":" in entry and ports else entry
        out.append(f"{host}:{ports}" if ports else entry)
    return tuple(dict.fromkeys(out))


def info_of(egress: Egress) -> dict[str, Any]:
    """A sandbox's network as E2B's info answers it (SandboxNetworkConfig)."""
    return {"allowOut": list(egress.allow), "denyOut": list(egress.deny)}


class NarrowedClient(AsyncClient):
    """A tenant's client as one narrowed E2B sandbox holds it: the same
    connection (channel, stubs, token), whose restores (a filesystem
    pause's resume, a fork, a snapshot's create) carry the sandbox's rules
    (``rules``, or none at all with ``no_network``), so that no sandbox
    behind its E2B id, nor a fork of it, runs under its pool's wider ones.
    ``egress`` is what the create (or the latest ``update_network``) asked,
    for the sandbox's info. An update puts a new one on the sandbox rather
    than changing this one, which forks and snapshots taken before it keep."""

    def __init__(
        self, base: AsyncClient, egress: Egress, rules: tuple[str, ...], no_network: bool = False
    ) -> None:
        # Not AsyncClient.__init__: that would open a channel of its own.
        self.__dict__.update(vars(base))
        self.egress = egress
        self.rules = rules
        self.no_network = no_network

    async def restore(
        self,
        snapshot_id: str,
        n: int = 1,
        *,
        pool: str = "",
        labels: Mapping[str, str] | None = None,
        lease_ttl: float = 0.0,
        timeout: float | None = None,
        network: Sequence[str] = (),
        no_network: bool = False,
    ) -> Lease:
        own = not network and not no_network
        return await super().restore(
            snapshot_id,
            n,
            pool=pool,
            labels=labels,
            lease_ttl=lease_ttl,
            timeout=timeout,
            network=self.rules if own else network,
            no_network=self.no_network if own else no_network,
        )
