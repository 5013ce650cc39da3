"""The backend port: one small async interface per concern.

``Deployment`` is *where* a sandbox runs (create, destroy, list, image check);
``Runtime`` is *what you do inside* one (exec, tar in, tar out). A backend
implements both. Every method takes plain dataclasses and raises only
sandboxd.errors types, so the core never sees engine types.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from sandboxd.backends.hostfs import HostWorkspace

# Labels every backend puts on what it creates, so a restarted control plane
# can find (and adopt or destroy) everything that belongs to it.
LABEL_MANAGED = "sandboxd.managed"
LABEL_INSTANCE = "sandboxd.instance"
LABEL_POOL = "sandboxd.pool"
LABEL_SANDBOX = "sandboxd.sandbox"

WORKSPACE = "/workspace"


@dataclass(frozen=True)
class Limits:
    """Per-sandbox resource limits; 0 means unlimited/unset at this level."""

    memory_bytes: int = 0
    cpu_millis: int = 0
    pids: int = 0
    disk_bytes: int = 0
    max_files: int = 0
    output_bytes: int = 0
    lifetime_seconds: int = 0


@dataclass(frozen=True)
class SandboxSpec:
    sandbox_id: str
    pool: str
    image: str
    limits: Limits
    env: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class BackendSandbox:
    """A sandbox as the backend sees it (used for adoption after a restart)."""

    sandbox_id: str
    pool: str
    handle: str
    running: bool
    labels: Mapping[str, str]


class ExecOutcome(enum.IntEnum):
    # Values match sandboxd.v1.ExecOutcome.
    EXITED = 1
    TIMED_OUT = 2
    KILLED = 3
    OUTPUT_TRUNCATED = 4
    SANDBOX_LOST = 5
    OOM_KILLED = 6
    PIDS_EXHAUSTED = 7
    DISK_FULL = 8
    FILE_LIMIT = 9


@dataclass(frozen=True)
class ExecSpec:
    """A validated exec request. Exactly one of argv/shell is set."""

    argv: tuple[str, ...] = ()
    shell: str = ""
    cwd: str = WORKSPACE
    env: Mapping[str, str] = field(default_factory=dict)
    timeout: float = 60.0
    stdin: bytes = b""
    output_limit: int = 1 << 20
    session: str = ""


@dataclass(frozen=True)
class OutputChunk:
    stream: int  # 1 = stdout, 2 = stderr
    data: bytes


@dataclass(frozen=True)
class ExecResult:
    outcome: ExecOutcome
    exit_code: int
    duration: float
    signal: int = 0
    output_truncated: bool = False
    detail: str = ""
    sandbox_gone: bool = False
    """The backend knows the sandbox itself is dead (not just one stream cut)."""


ExecEvent = OutputChunk | ExecResult


@dataclass(frozen=True)
class SandboxUsage:
    """What a sandbox uses now; zeros where the backend cannot tell."""

    memory_bytes: int = 0
    memory_peak_bytes: int = 0
    pids: int = 0
    disk_bytes: int = 0
    disk_total_bytes: int = 0
    files: int = 0
    files_total: int = 0
    cpu_seconds: float = 0.0


class Deployment(Protocol):
    async def create(self, spec: SandboxSpec) -> str:
        """Creates, starts and health-checks a sandbox; returns its handle.
        Raises TransientBackendError / PermanentBackendError. Leaves nothing
        behind when it fails or is cancelled."""
        ...

    async def destroy(self, handle: str) -> None:
        """Destroys a sandbox; idempotent (a missing one is not an error)."""
        ...

    async def list(self) -> list[BackendSandbox]:
        """Everything this control-plane instance owns on the backend."""
        ...

    async def image_exists(self, image: str) -> bool: ...

    async def capacity(self) -> tuple[int, int]:
        """Memory bytes and CPUs the backend has for sandboxes (0 = unknown)."""
        ...

    async def update_limits(self, handle: str, limits: Limits) -> None:
        """Changes memory, CPU and pids limits of a running sandbox."""
        ...

    async def ping(self) -> None:
        """Raises BackendError when the backend cannot be reached."""
        ...

    async def close(self) -> None: ...


class Runtime(Protocol):
    def exec(self, handle: str, spec: ExecSpec) -> AsyncIterator[ExecEvent]:
        """Runs a command; yields output chunks as they come and an
        ExecResult last. Never raises for what the command does (timeouts,
        kills, lost sandboxes are outcomes)."""
        ...

    async def put_tar(self, handle: str, dest: str, chunks: AsyncIterator[bytes]) -> None:
        """Extracts a tar stream under ``dest`` (absolute, inside the workspace).
        Raises ResourceExhausted when the workspace is full, InvalidArgument
        for a corrupt archive."""
        ...

    async def usage(self, handle: str) -> SandboxUsage:
        """Current resource use; raises SandboxLost when the sandbox is gone."""
        ...

    def get_tar(self, handle: str, base: str, paths: tuple[str, ...]) -> AsyncIterator[bytes]:
        """Streams a tar of ``paths`` (relative to ``base``). Raises NotFound
        naming the first missing path."""
        ...


class Backend(Deployment, Runtime, Protocol):
    """What the core needs from an engine."""


@dataclass(frozen=True)
class LeaseMark:
    """A lease as a Ledger backend records it on each of its sandboxes."""

    lease_id: str
    pool: str
    ttl: float
    expires_wall: float
    """Wall-clock seconds; an upper bound of the lease's real expiry."""
    labels: Mapping[str, str] = field(default_factory=dict)


@runtime_checkable
class Ledger(Protocol):
    """Optional for a backend: it keeps the control plane's durable state
    itself (pool specs, and each leased sandbox's lease on the sandbox), so
    any replica that reaches the backend can take over from another
    (sandboxd.core.ledger_store). Writes are idempotent, so retrying one is
    safe."""

    async def load_pool_specs(self) -> dict[str, str]:
        """Pool specs (JSON text) by pool key."""
        ...

    async def save_pool_spec(self, key: str, spec: str) -> None: ...

    async def delete_pool_spec(self, key: str) -> None: ...

    async def mark_leased(self, handle: str, mark: LeaseMark) -> None:
        """Records ``mark`` on the sandbox. Raises SandboxLost when it is gone."""
        ...

    async def lease_marks(self) -> list[tuple[str, str, LeaseMark]]:
        """(sandbox id, handle, lease) of each of this instance's sandboxes
        that carries a lease."""
        ...


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

    async def quota_headroom(self, tenant: str) -> QuotaHeadroom: ...


@runtime_checkable
class LivenessProbe(Protocol):
    """Optional for a backend: a cheap check of many sandboxes at once, used
    to replace warm sandboxes that died (one engine call per sweep)."""

    async def alive(self, handles: list[str]) -> set[str]:
        """The subset of ``handles`` whose sandboxes are running. Raises
        BackendError when it cannot tell (the sweep is then skipped)."""
        ...


@runtime_checkable
class HostWorkspaces(Protocol):
    """Optional for a backend: the control plane runs on the sandboxes' host
    and may read their workspaces in place (sandboxd.backends.hostfs), so a
    snapshot needs no listing command and no tar through the engine."""

    async def host_workspace(self, handle: str) -> HostWorkspace | None:
        """The sandbox's workspace, opened (the caller closes it); None when
        this host cannot see it (read it through the sandbox instead)."""
        ...


@runtime_checkable
class StagedTars(Protocol):
    """Optional for a backend: it hands a tar file on the control plane's host
    to a sandbox without streaming it (Docker: a hard link in the sandbox's
    read-only inbox mount), so one archive restored into n sandboxes is read n
    times from the page cache instead of pushed n times through the engine."""

    def staging_dir(self) -> Path | None:
        """Where archives to hand over must be written (the inboxes'
        filesystem, so a link is free); None when this backend cannot."""
        ...

    async def stage_tar(self, handle: str, path: Path) -> str | None:
        """Makes the tar at ``path`` (inside staging_dir) readable in the
        sandbox and returns its path there, for the caller to extract in a
        shell of its choice (the session a restore sets up: no second shell);
        None when this sandbox has no inbox (stream it instead)."""
        ...

    async def unstage_tar(self, handle: str, staged: str) -> None:
        """Withdraws what stage_tar handed over (idempotent)."""
        ...
