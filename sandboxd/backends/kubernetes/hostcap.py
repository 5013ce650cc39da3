"""What bounds how many sandbox Pods the cluster holds, as HostFacts for
sandboxd.core.capacity (which multiplies the per-node figures by ``nodes``
and caps the result by ``quota_max``). Pure: pods.py lists the nodes and the
quotas and hands them here.

Per node (over the schedulable, Ready nodes sandbox Pods may land on, as
Pods.capacity picks them):

- ``memory_bytes`` and ``cpus``: the *mean* allocatable. The core multiplies
  them by ``nodes``, so mean x nodes is the cluster's allocatable total: what
  the scheduler can actually place. The smallest node would let one small
  node that also takes sandboxes (a system node that tolerates them) drag the
  ceiling of a large mixed cluster down to its size; the mean over-promises by
  at most the bin-packing loss (under one sandbox per node), and what does not
  fit waits Pending, which SchedulingPressure (PodCache.unschedulable) turns
  into backpressure.
- ``engine_max``: the mean allocatable ``pods`` (the kubelet's max-pods).
- ``threads_max``: 0 (unknown). A Node reports no process limit (the kubelet's
  podPidsLimit and the node's pid_max are not in the Node object).
- overheads: assumed (``measured`` is False): a Pod costs its node the
  containerd shim and the pause container beside what runs in its container.

Allocatable is not reduced by other workloads' requests (the control plane may
not read other namespaces' Pods); what they take shows as Pending Pods.

Quotas: the namespace's ResourceQuotas that bind sandbox Pods (unscoped, or
scoped only NotTerminating / NotBestEffort; a tenant's PriorityClass-scoped
quota is per tenant, reported by quota_headroom instead). Each is read as
what it leaves *this control plane*: hard - (used - what its own Pods use),
since the ceiling counts its own sandboxes.

- ``pods`` / ``count/pods`` give ``quota_max`` (the least of them). It is at
  least 1, since 0 means "no quota" in HostFacts: a quota others have filled
  leaves a ceiling of 1 and says so in ``quota_detail``.
- ``limits.memory`` / ``requests.memory`` / ``memory`` (and the cpu keys)
  cannot become a sandbox count here (HostFacts carries no per-sandbox
  limits), so they lower the per-node figures instead: memory_bytes = min(mean
  allocatable, room / nodes), so memory_bytes x nodes never exceeds the quota;
  the core's memory bound then applies its host reserve and the Pod overhead
  on top, erring low.

Without nodes to go by (no permission to list them, or none schedulable now),
the quotas alone: memory and cpus are the quota's room on ``nodes`` = 1,
``engine_max`` 0.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sandboxd.backends.base import HostFacts
from sandboxd.backends.kubernetes.podspec import parse_quantity

POD_OVERHEAD_BYTES = 12 << 20
"""What a Pod costs its node beyond its container: a containerd shim
(~10 MiB) and the pause container (~1 MiB). Assumed, not measured."""
POD_OVERHEAD_THREADS = 12
"""Threads of the same: the shim's (~10) and the pause process."""

_POD_KEYS = ("pods", "count/pods")
_MEMORY_KEYS = ("limits.memory", "requests.memory", "memory")
_CPU_KEYS = ("limits.cpu", "requests.cpu", "cpu")
# Quota scopes every sandbox Pod falls in (they set requests and no
# activeDeadlineSeconds), so such a quota counts them like an unscoped one.
_SCOPES_OF_SANDBOXES = frozenset({"NotTerminating", "NotBestEffort"})


@dataclass(frozen=True)
class OwnUse:
    """What this control plane's own Pods count in the namespace's quotas."""

    pods: int = 0
    memory_limit: int = 0
    memory_request: int = 0
    cpu_limit_millis: int = 0
    cpu_request_millis: int = 0

    def of(self, key: str) -> float:
        """The amount quota key ``key`` counts for these Pods."""
        if key in _POD_KEYS:
            return self.pods
        if key == "limits.memory":
            return self.memory_limit
        if key in ("requests.memory", "memory"):
            return self.memory_request
        if key == "limits.cpu":
            return self.cpu_limit_millis / 1000
        if key in ("requests.cpu", "cpu"):
            return self.cpu_request_millis / 1000
        return 0.0


def _quantity(value: Any) -> float:
    try:
        return parse_quantity(str(value))
    except ValueError:
        return 0.0


def _mib(n: float) -> str:
    return f"{int(n) >> 20} MiB"


def binds_sandboxes(quota: Mapping[str, Any]) -> bool:
    """Whether ResourceQuota ``quota`` counts every sandbox Pod of the namespace."""
    spec = quota.get("spec") or {}
    scopes = set(spec.get("scopes") or [])
    for expr in (spec.get("scopeSelector") or {}).get("matchExpressions") or []:
        if expr.get("operator") != "Exists":
            return False
        scopes.add(str(expr.get("scopeName", "")))
    return scopes <= _SCOPES_OF_SANDBOXES


@dataclass(frozen=True)
class QuotaRoom:
    """The least room the binding quotas leave this control plane, per kind; None = no quota on it."""

    pods: int | None = None
    memory_bytes: int | None = None
    cpus: float | None = None
    pods_why: str = ""
    memory_why: str = ""
    cpus_why: str = ""


def quota_room(quotas: Iterable[Mapping[str, Any]], mine: OwnUse) -> QuotaRoom:
    """The room ResourceQuotas ``quotas`` (list items) leave this control
    plane, whose own Pods use ``mine``: hard - (used - mine) for each key."""
    best: dict[str, tuple[float, str]] = {}
    for quota in quotas:
        if not binds_sandboxes(quota):
            continue
        name = str((quota.get("metadata") or {}).get("name", ""))
        status = quota.get("status") or {}
        hard = status.get("hard") or (quota.get("spec") or {}).get("hard") or {}
        used = status.get("used") or {}
        for kind, keys in (("pods", _POD_KEYS), ("memory", _MEMORY_KEYS), ("cpus", _CPU_KEYS)):
            for key in keys:
                if key not in hard:
                    continue
                limit = _quantity(hard[key])
                others = max(0.0, _quantity(used.get(key, 0)) - mine.of(key))
                room = max(0.0, limit - others)
                if kind not in best or room < best[kind][0]:
                    shown = _mib if kind == "memory" else (lambda n: f"{n:g}")
                    why = f"ResourceQuota {name}: {key} {shown(limit)} ({shown(others)} used by others)"
                    best[kind] = room, why
    pods, memory, cpus = best.get("pods"), best.get("memory"), best.get("cpus")
    return QuotaRoom(
        pods=None if pods is None else int(pods[0]),
        memory_bytes=None if memory is None else int(memory[0]),
        cpus=None if cpus is None else cpus[0],
        pods_why=pods[1] if pods else "",
        memory_why=memory[1] if memory else "",
        cpus_why=cpus[1] if cpus else "",
    )


def host_facts(
    nodes: Sequence[Mapping[str, Any]] | None,
    quotas: Iterable[Mapping[str, Any]],
    mine: OwnUse,
    memory_request_ratio: float = 1.0,
) -> HostFacts:
    """The facts of the cluster: ``nodes`` are the schedulable, Ready nodes
    sandbox Pods may land on (None = this account may not list nodes),
    ``quotas`` the namespace's ResourceQuotas, ``mine`` what this control
    plane's Pods use of them; the scheduler reserves ``memory_request_ratio``
    of each sandbox's memory limit (its request)."""
    room = quota_room(quotas, mine)
    notes: list[str] = []
    quota_max = 0
    if room.pods is not None:
        quota_max = max(1, room.pods)
        left = "none left: at most 1" if room.pods <= 0 else f"{room.pods} sandboxes"
        notes.append(f"{room.pods_why} -> {left}")
    count = len(nodes or ())
    if count:
        alloc = [(n.get("status") or {}).get("allocatable") or {} for n in nodes or ()]
        memory = int(sum(_quantity(a.get("memory", 0)) for a in alloc) / count)
        cpus = int(sum(_quantity(a.get("cpu", 0)) for a in alloc) / count)
        pods = int(sum(_quantity(a.get("pods", 0)) for a in alloc) / count)
    else:
        memory, cpus, pods, count = 0, 0, 0, 1
    if room.memory_bytes is not None and (not memory or room.memory_bytes < memory * count):
        memory = room.memory_bytes // count
        per = f" per node x {count}" if nodes else ""
        notes.append(f"{room.memory_why} -> memory {_mib(memory)}{per}")
    if room.cpus is not None and (not cpus or room.cpus < cpus * count):
        cpus = int(room.cpus / count)
        per = f" per node x {count}" if nodes else ""
        notes.append(f"{room.cpus_why} -> {cpus} cpus{per}")
    return HostFacts(
        memory_bytes=memory,
        cpus=cpus,
        threads_max=0,
        overhead_memory_bytes=POD_OVERHEAD_BYTES,
        overhead_threads=POD_OVERHEAD_THREADS,
        measured=False,
        engine_max=pods,
        nodes=count,
        memory_share=memory_request_ratio,
        quota_max=quota_max,
        quota_detail="; ".join(notes),
    )
