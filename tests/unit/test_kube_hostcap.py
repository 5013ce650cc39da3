"""The Kubernetes backend's capacity facts and scheduling pressure, from API
objects alone (no cluster): node allocatable and ResourceQuotas into
HostFacts (hostcap.py), and the watch cache's count of unschedulable Pods."""

from __future__ import annotations

from typing import Any

from sandboxd.backends.base import Limits
from sandboxd.backends.kubernetes.cache import PodCache, summarize
from sandboxd.backends.kubernetes.hostcap import (
    POD_OVERHEAD_BYTES,
    OwnUse,
    binds_sandboxes,
    host_facts,
    quota_room,
)
from sandboxd.core import capacity

GiB = 1 << 30
MiB = 1 << 20


def node(memory: str, cpu: str = "8", pods: str = "110") -> dict[str, Any]:
    return {"status": {"allocatable": {"memory": memory, "cpu": cpu, "pods": pods}}}


def quota(
    hard: dict[str, str], used: dict[str, str] | None = None, name: str = "q", **spec: Any
) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"hard": hard, **spec},
        "status": {"hard": hard, "used": used or {}},
    }


def test_nodes_give_the_mean_allocatable_per_node() -> None:
    facts = host_facts([node("16Gi", "8", "110"), node("48Gi", "3900m", "250")], [], OwnUse())
    assert facts.nodes == 2
    assert facts.memory_bytes == 32 * GiB  # mean: x nodes = the cluster's total
    assert facts.cpus == 5  # (8 + 3.9) / 2, whole cores
    assert facts.engine_max == 180  # mean max-pods
    assert facts.threads_max == 0  # nodes report no process limit
    assert facts.overhead_memory_bytes == POD_OVERHEAD_BYTES and not facts.measured
    assert facts.quota_max == 0 and facts.quota_detail == ""


def test_the_estimate_adds_nodes_up_and_is_bound_by_max_pods() -> None:
    facts = host_facts([node("256Gi", "64", "100")] * 3, [], OwnUse())
    est = capacity.estimate(facts, Limits(memory_bytes=64 * MiB, pids=256), overcommit=1.0)
    assert (est.bound_by, est.per_node, est.nodes, est.sandboxes) == ("engine", 100, 3, 300)
    assert est.nodes_for(960) == 10


def test_a_pods_quota_leaves_what_others_do_not_use() -> None:
    quotas = [quota({"pods": "10"}, {"pods": "7"})]
    # 7 used, 4 of them ours: others hold 3, this control plane may have 7.
    facts = host_facts([node("256Gi")], quotas, OwnUse(pods=4))
    assert facts.quota_max == 7
    assert "ResourceQuota q: pods 10 (3 used by others)" in facts.quota_detail
    est = capacity.estimate(facts, Limits(memory_bytes=64 * MiB))
    assert (est.bound_by, est.sandboxes) == ("quota", 7)
    # The least of several wins; count/pods counts too.
    two = [quota({"pods": "10"}), quota({"count/pods": "5"}, name="small")]
    assert host_facts([node("1Gi")], two, OwnUse()).quota_max == 5


def test_a_quota_others_filled_still_reads_as_a_quota() -> None:
    facts = host_facts([node("8Gi")], [quota({"pods": "3"}, {"pods": "3"})], OwnUse())
    assert facts.quota_max == 1  # 0 would mean "no quota"
    assert "none left" in facts.quota_detail


def test_a_memory_quota_lowers_the_per_node_memory() -> None:
    quotas = [quota({"limits.memory": "8Gi"}, {"limits.memory": "3Gi"})]
    facts = host_facts([node("16Gi")] * 4, quotas, OwnUse(pods=2, memory_limit=1 * GiB))
    # Others use 2 GiB of 8: 6 GiB over 4 nodes.
    assert facts.memory_bytes == 6 * GiB // 4
    assert facts.memory_bytes * facts.nodes == 6 * GiB
    assert facts.quota_max == 0  # no pods quota: memory bounds it through the memory figure
    assert "limits.memory 8192 MiB (2048 MiB used by others)" in facts.quota_detail
    # A quota larger than the nodes changes nothing.
    roomy = host_facts([node("16Gi")] * 4, [quota({"requests.memory": "1Ti"})], OwnUse())
    assert roomy.memory_bytes == 16 * GiB and roomy.quota_detail == ""


def test_own_use_is_counted_by_the_key_the_quota_names() -> None:
    mine = OwnUse(memory_limit=4 * GiB, memory_request=1 * GiB, cpu_limit_millis=2000, cpu_request_millis=500)
    room = quota_room(
        [quota({"requests.memory": "8Gi", "limits.cpu": "4"}, {"requests.memory": "2Gi", "limits.cpu": "3"})],
        mine,
    )
    assert room.memory_bytes == 7 * GiB  # others: 2 - 1 GiB requested
    assert room.cpus == 3.0  # others: 3 - 2 cores of limits
    assert room.pods is None


def test_without_nodes_the_quota_alone() -> None:
    quotas = [quota({"pods": "20", "limits.memory": "10Gi", "limits.cpu": "6"})]
    for nodes in (None, []):
        facts = host_facts(nodes, quotas, OwnUse())
        assert (facts.nodes, facts.memory_bytes, facts.cpus, facts.engine_max) == (1, 10 * GiB, 6, 0)
        assert facts.quota_max == 20
    nothing = host_facts(None, [], OwnUse())
    assert (nothing.memory_bytes, nothing.quota_max, nothing.engine_max) == (0, 0, 0)
    assert capacity.estimate(nothing, Limits(memory_bytes=GiB)).sandboxes == 0  # unknown: no ceiling


def test_only_quotas_that_count_sandbox_pods_bind() -> None:
    tenant = {"scopeSelector": {"matchExpressions": [{"scopeName": "PriorityClass", "operator": "In"}]}}
    assert not binds_sandboxes(quota({"pods": "1"}, **tenant))
    assert not binds_sandboxes(quota({"pods": "1"}, scopes=["BestEffort"]))
    assert binds_sandboxes(quota({"pods": "1"}, scopes=["NotTerminating"]))
    assert binds_sandboxes(quota({"pods": "1"}))
    facts = host_facts([node("8Gi")], [quota({"pods": "1"}, **tenant)], OwnUse())
    assert facts.quota_max == 0


# -- the watch cache: resources and unschedulable Pods --------------------------


def pod(
    name: str, created: str, *, unschedulable: str | None = None, phase: str = "Pending"
) -> dict[str, Any]:
    conditions = []
    if unschedulable is not None:
        conditions.append(
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": unschedulable}
        )
    return {
        "metadata": {"name": name, "uid": name, "creationTimestamp": created, "resourceVersion": "1"},
        "spec": {
            "containers": [
                {"resources": {"limits": {"memory": "1Gi", "cpu": "500m"}, "requests": {"memory": "256Mi"}}},
                {"resources": {"limits": {"memory": "64Mi"}}},
            ]
        },
        "status": {"phase": phase, "conditions": conditions},
    }


def test_summary_keeps_resources_and_the_schedulers_message() -> None:
    info = summarize(
        pod("a", "2024-01-01T00:00:00Z", unschedulable="0/4 nodes are available: 4 Insufficient memory.")
    )
    assert info.unschedulable and info.waiting_for_node
    assert info.schedule_message == "0/4 nodes are available: 4 Insufficient memory."
    assert info.problem.startswith("Unschedulable: 0/4 nodes")
    assert (info.memory_limit, info.memory_request) == (GiB + 64 * MiB, 256 * MiB + 64 * MiB)
    assert (info.cpu_limit_millis, info.cpu_request_millis) == (500, 500)  # request defaults to the limit
    assert info.created == "2024-01-01T00:00:00Z" and info.counted_by_quota
    placed = summarize(pod("b", "2024-01-01T00:00:00Z"))
    assert not placed.unschedulable and not placed.waiting_for_node


def test_the_cache_counts_unschedulable_pods_and_names_the_oldest() -> None:
    cache = PodCache(None, "ns", "sel")  # type: ignore[arg-type]  # fed by hand: no client
    assert cache.unschedulable() == (0, "")
    cache._apply({"type": "ADDED", "object": pod("new", "2024-01-01T00:00:09Z", unschedulable="newer")})
    cache._apply({"type": "ADDED", "object": pod("old", "2024-01-01T00:00:01Z", unschedulable="oldest")})
    cache._apply({"type": "ADDED", "object": pod("ok", "2024-01-01T00:00:00Z", phase="Running")})
    assert cache.unschedulable() == (2, "oldest")
    # Placed at last: no longer counted.
    cache._apply({"type": "MODIFIED", "object": pod("old", "2024-01-01T00:00:01Z")})
    assert cache.unschedulable() == (1, "newer")
    # Being deleted counts as gone; deleted is gone.
    deleting = pod("new", "2024-01-01T00:00:09Z", unschedulable="newer")
    deleting["metadata"]["deletionTimestamp"] = "2024-01-01T00:01:00Z"
    cache._apply({"type": "MODIFIED", "object": deleting})
    assert cache.unschedulable() == (0, "")
    cache._apply({"type": "ADDED", "object": pod("x", "2024-01-01T00:02:00Z", unschedulable="m")})
    assert cache.unschedulable() == (1, "m")
    cache._apply({"type": "DELETED", "object": pod("x", "2024-01-01T00:02:00Z", unschedulable="m")})
    assert cache.unschedulable() == (0, "")
