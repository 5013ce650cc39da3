"""What bounds how many sandboxes a backend holds, and how it tells: the optional
ports for host facts, tenant quotas the backend enforces itself, sandboxes
waiting to be placed, and a cheap liveness check of many sandboxes at once.

Re-exported by sandboxd.backends.base, where the port is described."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class QuotaHeadroom:
    """What the backend's own quotas still allow a tenant; None = no limit there."""

    pods: int | None = None
    memory_bytes: int | None = None


@runtime_checkable
class TenantQuotas(Protocol):
    """Optional for a backend: it enforces each tenant's quota itself as
    well (a backstop under sandboxd's admission, which counts leases) and
    reports what its quotas leave (pre-flight)."""

    async def set_tenant_quota(self, tenant: str, pods: int, memory_bytes: int) -> None:
        """Sandboxes (warm ones included) and their total memory limit the
        tenant may have on the backend; 0 = no limit on that resource."""
        ...

    async def quota_headroom(self, tenant: str) -> QuotaHeadroom:
        """What the backend's quotas (the tenant's and any namespace-wide one) still leave the tenant."""
        ...


@dataclass(frozen=True)
class HostFacts:
    """What limits how many sandboxes one host (or node) holds; 0 = unknown."""

    memory_bytes: int = 0
    cpus: int = 0
    threads_max: int = 0
    """Processes and threads the kernel allows at once (threads-max, pid_max)."""
    threads_in_use: int = 0
    sandboxes_present: int = 0
    """This control plane's sandboxes on the host now, whose threads ``threads_in_use`` counts."""
    overhead_memory_bytes: int = 0
    """Memory one sandbox costs beyond what runs inside (engine shim, init), measured or assumed."""
    overhead_threads: int = 0
    """Threads one sandbox costs beyond its own processes (engine shim, init, shells)."""
    measured: bool = False
    """Whether the overheads were measured on live sandboxes (else defaults)."""
    engine_max: int = 0
    """Sandboxes the engine itself handles before its calls slow down (0 = no known limit)."""
    engine_starts_per_second: float = 0.0
    """Starts per second the engine sustains (0 = unknown)."""
    nodes: int = 1
    """Hosts the figures add up over (Kubernetes: schedulable nodes)."""
    memory_share: float = 0.0
    """Share of a sandbox's memory limit its host reserves for it (Kubernetes:
    the Pod's request, ``memory_request_ratio`` of the limit); 0 = the host
    reserves nothing, and the server's ``memory_overcommit`` applies."""
    quota_max: int = 0
    """Sandboxes the backend's quotas allow in all (Kubernetes: the namespace's
    ResourceQuotas on pods and memory), whatever the nodes hold; 0 = none."""
    quota_detail: str = ""
    """Which quota gives ``quota_max``, for pre-flight and logs."""


@runtime_checkable
class HostCapacity(Protocol):
    """Optional for a backend: it reports the facts that bound how many
    sandboxes its host (or its nodes) hold (sandboxd.core.capacity turns
    them into a ceiling)."""

    async def host_facts(self) -> HostFacts:
        """The facts as of now; a figure the backend cannot tell stays 0 (unknown)."""
        ...


@runtime_checkable
class SchedulingPressure(Protocol):
    """Optional for a backend whose sandboxes wait to be placed (Kubernetes:
    Pods the scheduler could not fit yet): while some do, more creates only
    queue up behind them, so the reconciler starts none and says why."""

    def unschedulable(self) -> tuple[int, str]:
        """(sandboxes of this control plane waiting for a place now, the
        placer's reason for the oldest, e.g. "0/3 nodes are available: 3
        Insufficient memory."); (0, "") when none. Cheap: read from a cache,
        no call to the cluster."""
        ...


@runtime_checkable
class LivenessProbe(Protocol):
    """Optional for a backend: a cheap check of many sandboxes at once, used
    to replace warm sandboxes that died (one engine call per sweep)."""

    async def alive(self, handles: list[str]) -> set[str]:
        """The subset of ``handles`` whose sandboxes are running. Raises
        BackendError when it cannot tell (the sweep is then skipped)."""
        ...
