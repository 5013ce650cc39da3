"""Narrowing a pool's allow-list for one lease: which rules lie within which.

An acquire may ask for fewer network rules than its pool allows (a task that
needs only the package index, not the forge). Every rule it asks for must
lie within the pool's: a name covered by a pool name or suffix, a suffix
within a pool suffix, an address or CIDR within a pool CIDR of the same
family, on ports the pool allows that host on. A rule never gains through
narrowing what its pool does not give, so the check is on the rules alone,
before any sandbox is touched.
"""

from __future__ import annotations

from collections.abc import Sequence

from sandboxd.backends.network.policy import (
    MAX_RULES,
    NO_EGRESS,
    NO_NETWORK,
    EgressPolicy,
    Rule,
    is_no_network,
    parse_rule,
)
from sandboxd.errors import InvalidArgument

# What a message quotes of a hostile rule or a long pool list.
_QUOTE_CHARS = 80
_LISTED_RULES = 8
# Longer than any rule can be (a 253-character name and a port list).
_MAX_RULE_CHARS = 512


def _quote(text: str) -> str:
    return repr(text if len(text) <= _QUOTE_CHARS else text[:_QUOTE_CHARS] + "...")


def _pool_list(rules: Sequence[str]) -> str:
    shown = ", ".join(rules[:_LISTED_RULES])
    more = len(rules) - _LISTED_RULES
    return shown + (f" and {more} more" if more > 0 else "")


def _covers(outer: Rule, inner: Rule) -> bool:
    """Whether every host ``inner`` names is one ``outer`` names (ports aside)."""
    if inner.network is not None:
        return (
            outer.network is not None
            and outer.network.version == inner.network.version
            and inner.network.subnet_of(outer.network)  # type: ignore[arg-type]
        )
    if outer.network is not None:
        return False
    if inner.suffix:
        # Only a suffix covers every name below a suffix; an exact name covers one.
        return outer.suffix and inner.name.endswith(outer.name)
    return outer.allows_name(inner.name)


def _ports_within(inner: Rule, covering: list[Rule]) -> bool:
    """Whether each of ``inner``'s ports is allowed by one of ``covering``."""
    for lo, hi in inner.ports:
        port = lo
        while port <= hi:
            # The furthest a span of a covering rule that holds ``port`` reaches.
            reach = max(
                (
                    span_hi
                    for rule in covering
                    for span_lo, span_hi in rule.ports
                    if span_lo <= port <= span_hi
                ),
                default=None,
            )
            if reach is None:
                return False
            port = reach + 1
    return True


def narrow(pool_rules: Sequence[str], asked: Sequence[str]) -> tuple[str, ...]:
    """The rules a lease runs under: ``asked`` (stripped), each checked to lie
    within ``pool_rules``; () when nothing is asked (the pool's own rules).
    NO_NETWORK asked is NO_NETWORK on a pool with rules, () on one without
    (it has no network already). INVALID_ARGUMENT naming the offending rule
    and what the pool allows."""
    if not asked:
        return ()
    if is_no_network(asked):
        return NO_NETWORK if pool_rules else ()
    if not pool_rules:
        raise InvalidArgument(
            "network",
            f"rule {_quote(asked[0])}: the pool has no network at all, so an acquire can narrow nothing "
            "(leave network empty, or acquire from a pool with network rules)",
        )
    if len(asked) > MAX_RULES:
        raise InvalidArgument("network", f"{len(asked)} rules asked for, at most {MAX_RULES}")
    pool = EgressPolicy.parse(pool_rules).rules
    out: list[str] = []
    for text in asked:
        if text.strip() == NO_EGRESS:
            raise InvalidArgument(
                "network", f"{NO_EGRESS!r} is not a rule (ask for no network with no_network, alone)"
            )
        if len(text) > _MAX_RULE_CHARS:
            raise InvalidArgument(
                "network", f"rule {_quote(text)} is longer than {_MAX_RULE_CHARS} characters"
            )
        try:
            rule = parse_rule(text)
        except InvalidArgument as e:
            raise InvalidArgument("network", f"{str(e).removeprefix('network: ')}") from e
        covering = [outer for outer in pool if _covers(outer, rule)]
        if not covering:
            raise InvalidArgument(
                "network",
                f"rule {_quote(rule.text)} lies outside the pool's rules ({_pool_list(list(pool_rules))}); "
                "an acquire can only narrow them",
            )
        if not _ports_within(rule, covering):
            ports = ",".join(f"{lo}-{hi}" if lo != hi else str(lo) for r in covering for lo, hi in r.ports)
            raise InvalidArgument(
                "network",
                f"rule {_quote(rule.text)} asks for ports the pool does not allow that host "
                f"(its rules allow {ports}; pool rules: {_pool_list(list(pool_rules))})",
            )
        out.append(rule.text)
    return tuple(out)
