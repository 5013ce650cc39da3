"""How many sandboxes a host holds, from the facts its backend reports
(sandboxd.backends.base.HostFacts) and the sandboxes' limits. Pure.

Three bounds, the smallest wins: memory (each sandbox's limit, shared
``overcommit`` ways since limits are ceilings, plus its measured overhead),
threads (the kernel's process and thread limit against each sandbox's pids
limit, likewise shared, plus the engine's threads per sandbox), and the
engine itself (how many containers it serves before its calls slow down).
A reserve of each is left to the host and the engine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sandboxd.backends.base import HostFacts, Limits

HOST_RESERVE = 0.1
"""Share of memory and threads left to the host, the engine and the control plane."""


@dataclass(frozen=True)
class Capacity:
    """Sandboxes a host holds and how fast it starts them; 0 = unknown."""

    sandboxes: int = 0
    starts_per_second: float = 0.0
    bound_by: str = ""
    """Which bound is the smallest: "memory", "threads" or "engine"."""
    per_node: int = 0
    """Sandboxes one node (host) holds; ``sandboxes`` adds nodes up."""
    nodes: int = 1
    detail: str = ""
    """The arithmetic, for pre-flight and logs."""

    def nodes_for(self, asked: int) -> int:
        """Nodes like these that ``asked`` sandboxes need (0 = unknown)."""
        if self.per_node <= 0:
            return 0
        return max(1, math.ceil(asked / self.per_node))


def estimate(facts: HostFacts, limits: Limits, overcommit: float = 1.0) -> Capacity:
    """The sandboxes of ``limits`` the host ``facts`` describe can hold."""
    overcommit = max(overcommit, 1.0)
    bounds: dict[str, int] = {}
    notes: list[str] = []
    if facts.memory_bytes:
        # A host that reserves a share of each limit (a scheduler placing by
        # requests) shares memory exactly that many ways, whatever is assumed.
        shared = 1 / facts.memory_share if facts.memory_share > 0 else overcommit
        each = facts.overhead_memory_bytes + limits.memory_bytes / shared
        if each > 0:
            bounds["memory"] = int(facts.memory_bytes * (1 - HOST_RESERVE) // each)
            notes.append(
                f"memory {facts.memory_bytes >> 20} MiB / ({limits.memory_bytes >> 20} MiB limit"
                f" / {shared:g} + {facts.overhead_memory_bytes >> 20} MiB overhead)"
            )
    if facts.threads_max:
        each_threads = facts.overhead_threads + limits.pids / overcommit
        room = facts.threads_max * (1 - HOST_RESERVE) - facts.threads_in_use
        if each_threads > 0:
            # The sandboxes already there hold their threads in threads_in_use.
            bounds["threads"] = facts.sandboxes_present + max(0, int(room // each_threads))
            notes.append(
                f"threads {int(room)} free / ({limits.pids} pids / {overcommit:g}"
                f" + {facts.overhead_threads} overhead)"
            )
    if facts.engine_max:
        bounds["engine"] = facts.engine_max
        notes.append(f"engine ~{facts.engine_max} containers")
    nodes = max(1, facts.nodes)
    if not bounds:
        if facts.quota_max:
            return Capacity(
                sandboxes=facts.quota_max,
                starts_per_second=facts.engine_starts_per_second * nodes,
                bound_by="quota",
                nodes=nodes,
                detail=facts.quota_detail or f"quota {facts.quota_max} sandboxes",
            )
        return Capacity(starts_per_second=facts.engine_starts_per_second * nodes)
    bound_by = min(bounds, key=lambda k: bounds[k])
    per_node = bounds[bound_by]
    total = per_node * nodes
    detail = ", ".join(notes) + ("" if facts.measured else " (overheads assumed, not measured)")
    if facts.quota_max and facts.quota_max < total:
        # A namespace quota caps the whole cluster, not each node.
        bound_by, total = "quota", facts.quota_max
        detail = facts.quota_detail or f"quota {facts.quota_max} sandboxes"
    return Capacity(
        sandboxes=total,
        starts_per_second=facts.engine_starts_per_second * nodes,
        bound_by=bound_by,
        per_node=per_node,
        nodes=nodes,
        detail=detail,
    )


def refusal(asked: int, capacity: Capacity) -> str:
    """Why ``asked`` sandboxes do not fit, with what would hold them."""
    if capacity.bound_by == "quota":
        return (
            f"{asked} asked, the quotas allow ~{capacity.sandboxes} ({capacity.detail}); "
            "raise the quota or ask for fewer"
        )
    need = capacity.nodes_for(asked)
    if capacity.nodes == 1:
        where, like = "this host holds", "on Kubernetes you need {} nodes like this one"
    else:
        where, like = f"these {capacity.nodes} nodes hold", "you need {} nodes like these"
    return (
        f"{asked} asked, {where} ~{capacity.sandboxes} (bound by {capacity.bound_by}: {capacity.detail}); "
        + like.format(need)
    )
