"""The Kubernetes egress proxy's view of sandbox Pods (egress_pods), fed
event by event as its watch would be: a Pod's rules are its lease's where
the lease narrowed them, a change is put on the Pod's live proxy the moment
the event arrives (its connections cut), and never falls back to the
pool's wider rules; which proxy Pods a change of rules waits for
(narrowing.awaited_proxies); and a lease's rules in its record on the Pod."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sandboxd.backends.base import LABEL_SANDBOX, LeaseMark
from sandboxd.backends.kubernetes.egress import ANNOTATION_LEASE_NETWORK, ANNOTATION_NETWORK
from sandboxd.backends.kubernetes.egress_pods import NO_RULES, PodPolicies
from sandboxd.backends.kubernetes.egress_proxy import SharedEgress
from sandboxd.backends.kubernetes.ledger import decode_mark, encode_mark
from sandboxd.backends.kubernetes.narrowing import awaited_proxies
from sandboxd.backends.network.policy import EgressPolicy

pytestmark = pytest.mark.timeout(10)

POOL = ["pypi.test", "forge.test"]


def _pod(annotations: dict[str, str], ip: str = "10.0.0.7", rv: str = "1") -> dict[str, Any]:
    return {
        "metadata": {
            "name": "sb-1",
            "uid": "uid-1",
            "resourceVersion": rv,
            "labels": {LABEL_SANDBOX: "sb-1"},
            "annotations": annotations,
        },
        "status": {"phase": "Running", "podIP": ip},
    }


async def test_a_pods_rules_are_its_leases_from_the_event_that_brings_them() -> None:
    policies = PodPolicies(None, "ns")  # type: ignore[arg-type]  # fed by hand: no client
    egress = SharedEgress(policies, dns_answer="10.96.0.53")
    pool = {ANNOTATION_NETWORK: json.dumps(POOL)}
    policies.cache._apply({"type": "ADDED", "object": _pod(pool)})
    found = policies.lookup("10.0.0.7")
    assert found is not None and found.policy == EgressPolicy.parse(POOL)
    proxy = egress.proxy_of(found)
    assert proxy.policy.rule_for("forge.test", 80) is not None
    narrowed = {**pool, ANNOTATION_LEASE_NETWORK: json.dumps(["pypi.test"])}
    policies.cache._apply({"type": "MODIFIED", "object": _pod(narrowed, rv="2")})
    # On the live proxy at once, not at its next connection.
    assert proxy.policy == EgressPolicy.parse(["pypi.test"], lease=True)
    assert proxy.policy.rule_for("forge.test", 80) is None
    found = policies.lookup("10.0.0.7")
    assert found is not None and egress.proxy_of(found) is proxy
    # Unreadable lease rules: refused, never the pool's wider ones.
    broken = {**pool, ANNOTATION_LEASE_NETWORK: "[not json"}
    policies.cache._apply({"type": "MODIFIED", "object": _pod(broken, rv="3")})
    assert policies.lookup("10.0.0.7") is None and proxy.policy == NO_RULES
    # Back to the pool's once the lease's are removed (a recycled sandbox's reset).
    policies.cache._apply({"type": "MODIFIED", "object": _pod(pool, rv="4")})
    assert proxy.policy == EgressPolicy.parse(POOL)
    policies.cache._apply({"type": "DELETED", "object": _pod(pool, rv="5")})
    assert policies.lookup("10.0.0.7") is None
    await egress.close()


def test_a_change_waits_for_the_proxy_pods_that_may_run_a_process() -> None:
    def pod(uid: str, phase: str, node: str = "") -> dict[str, Any]:
        return {
            "metadata": {"uid": uid, "name": f"proxy-{uid}"},
            "spec": {"nodeName": node},
            "status": {"phase": phase},
        }

    listed = {
        "items": [
            pod("a", "Running", "n1"),
            pod("b", "Pending", "n1"),  # bound: its process may be starting now
            pod("c", "Pending"),  # unbound: its process starts later, under the new rules
            pod("d", "Failed", "n1"),
            pod("e", "Running"),  # said Running by hand (the tests' stand-in)
        ]
    }
    assert awaited_proxies(listed) == {"a": "proxy-a", "b": "proxy-b", "e": "proxy-e"}


def test_a_narrowed_leases_record_carries_its_rules_and_an_other_reads_as_before() -> None:
    mark = LeaseMark("ls-1", "t/p", 60.0, 1e9, {"run": "r"}, ("pypi.test",))
    assert decode_mark(encode_mark(mark)) == mark
    plain = LeaseMark("ls-2", "t/p", 60.0, 1e9, {})
    assert "network" not in encode_mark(plain) and decode_mark(encode_mark(plain)) == plain
    assert decode_mark('{"id":"x","pool":"p","ttl":1,"expires":2,"network":"pypi.test"}') is None
