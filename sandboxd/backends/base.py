"""The backend port: one small async interface per concern.

``Deployment`` is *where* a sandbox runs (create, destroy, list, image check);
``Runtime`` is *what you do inside* one (exec, tar in, tar out). A backend
implements both. Every method takes plain dataclasses and raises only
sandboxd.errors types, so the core never sees engine types.

What a backend may offer beyond that is an optional port, a
``runtime_checkable`` protocol the core checks with ``isinstance``, kept in
a module per concern and re-exported here: ``ledger`` (pools and leases kept
by the backend), ``capacity`` (host facts, tenant quotas, scheduling
pressure, liveness), ``isolation`` (runtimes, egress, the model route, users,
root), ``workspaces`` (in-place writes and reads, staged tars),
``checkpoints`` (live checkpoints) and ``images`` (image store, prefetch).
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from sandboxd.backends.capacity import (
    HostCapacity,
    HostFacts,
    LivenessProbe,
    QuotaHeadroom,
    SchedulingPressure,
    TenantQuotas,
)
from sandboxd.backends.checkpoints import KEEP_VAR, LiveCheckpoints
from sandboxd.backends.images import (
    LABEL_IMAGE_BUILD,
    BuildSpec,
    EngineImage,
    ImageDisk,
    ImagePrefetch,
    ImageStore,
    PoolPullSecrets,
    PullStatus,
    RegistryAuth,
    RemoteImage,
)
from sandboxd.backends.isolation import (
    SANDBOX_UID,
    EgressNarrowing,
    EgressPolicies,
    IsolationRuntimes,
    ModelRoutes,
    RootUser,
    SandboxUsers,
    WritableRoots,
)
from sandboxd.backends.layout import WORKSPACE
from sandboxd.backends.ledger import LeaseMark, Ledger
from sandboxd.backends.workspaces import HostWorkspaces, InPlaceWrites, StagedTars

# The optional ports live in a module per concern (above); every port and
# its types are importable from here.
__all__ = [
    "GVISOR",
    "KEEP_VAR",
    "LABEL_IMAGE",
    "LABEL_IMAGE_BUILD",
    "LABEL_INSTANCE",
    "LABEL_MANAGED",
    "LABEL_POOL",
    "LABEL_SANDBOX",
    "ROOT_USER",
    "RUNC",
    "RUNTIMES",
    "SANDBOX_UID",
    "WORKSPACE",
    "Backend",
    "BackendSandbox",
    "BuildSpec",
    "Deployment",
    "EgressNarrowing",
    "EgressPolicies",
    "EngineImage",
    "ExecEvent",
    "ExecOutcome",
    "ExecResult",
    "ExecSpec",
    "HostCapacity",
    "HostFacts",
    "HostWorkspaces",
    "ImageDisk",
    "ImagePrefetch",
    "ImageStore",
    "InPlaceWrites",
    "IsolationRuntimes",
    "LeaseMark",
    "Ledger",
    "Limits",
    "LiveCheckpoints",
    "LivenessProbe",
    "ModelRoutes",
    "OutputChunk",
    "PoolPullSecrets",
    "PullStatus",
    "QuotaHeadroom",
    "RegistryAuth",
    "RemoteImage",
    "RootUser",
    "Runtime",
    "SandboxSpec",
    "SandboxUsage",
    "SandboxUsers",
    "SchedulingPressure",
    "StagedTars",
    "TenantQuotas",
    "WritableRoots",
]

# Labels every backend puts on what it creates, so a restarted control plane
# can find (and adopt or destroy) everything that belongs to it.
LABEL_MANAGED = "sandboxd.managed"
LABEL_INSTANCE = "sandboxd.instance"
LABEL_POOL = "sandboxd.pool"
LABEL_SANDBOX = "sandboxd.sandbox"
LABEL_IMAGE = "sandboxd.image"
"""The image a sandbox was created from, as its create named it (a template
pool's sandboxes each have their own)."""

RUNC = "runc"
"""The default isolation runtime: a container on the host's kernel."""
GVISOR = "gvisor"
"""gVisor: a user-space kernel between the sandbox and the host's kernel."""
RUNTIMES = (RUNC, GVISOR)
"""Every isolation runtime a pool may name."""


@dataclass(frozen=True)
class Limits:
    """Per-sandbox resource limits, declared once for every role they play.

    A sandbox's or pool's limits (0 = unset: the server default fills it in),
    an acquire's (0 = the pool's value), a tenant's ceiling (``[tenants.NAME.ceiling]``,
    0 = no ceiling beyond the server's bounds) and the server defaults
    (``[limits]``, sandboxd.settings.DEFAULT_LIMITS) are all this one type.
    """

    memory_bytes: int = 0
    """Memory limit in bytes, swap included (cgroup memory.max); an OOM inside is contained."""
    cpu_millis: int = 0
    """CPU limit in millicores (1000 = one core)."""
    pids: int = 0
    """Processes and threads at once (cgroup pids.max)."""
    disk_bytes: int = 0
    """Size of the writable workspace in bytes (kernel-enforced tmpfs size)."""
    max_files: int = 0
    """Files and directories the workspace may hold (tmpfs nr_inodes)."""
    output_bytes: int = 0
    """Default cap on the stdout+stderr bytes captured per exec."""
    lifetime_seconds: int = 0
    """Wall-clock lifetime of a sandbox once leased, in seconds (0 once resolved = unlimited)."""


@dataclass(frozen=True)
class SandboxSpec:
    """What to create: one sandbox of a pool, its limits already resolved by the core."""

    sandbox_id: str
    pool: str
    image: str
    limits: Limits
    env: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    runtime: str = RUNC
    """Isolation runtime (one of RUNTIMES), already checked against the backend's."""
    network: tuple[str, ...] = ()
    """Egress allow-list rules (sandboxd.backends.network.policy); empty = no network at all."""
    model_gateway: bool = False
    """The sandbox reaches the run's model through sandboxd's gateway
    (sandboxd.backends.network.gateway), on its egress link."""
    pull_secrets: tuple[str, ...] = ()
    """Secrets its image is pulled with, besides the backend's own (PoolPullSecrets)."""
    live_snapshots: bool = True
    """gVisor: started so that a live snapshot carries its sessions (the
    keeper and relay of sandboxd.backends.docker.keeper); False: its shells
    run straight on ``runsc exec``, a faster start, and no live snapshot is
    taken of it."""
    writable_root: bool = False
    """Its root filesystem is writable, its writes bounded by disk_bytes and
    max_files apart from the workspace's (a WritableRoots backend only)."""


@dataclass(frozen=True)
class BackendSandbox:
    """A sandbox as the backend sees it (used for adoption after a restart)."""

    sandbox_id: str
    pool: str
    handle: str
    running: bool
    labels: Mapping[str, str]
    paused: bool = False
    """Frozen (LiveCheckpoints.pause); ``running`` is True then."""
    image: str = ""
    """The image its create named; empty when the backend did not record it."""


class ExecOutcome(enum.IntEnum):
    """How an exec ended; every way, the sandbox's loss included, is an outcome rather than an error."""

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
    user: str = ""
    """Empty: the sandbox's own user; ROOT_USER only on a RootUser backend, never with a session."""


ROOT_USER = "root"
"""uid 0 inside the sandbox's own namespaces, with no capabilities beyond the sandbox's."""


@dataclass(frozen=True)
class OutputChunk:
    """A piece of a running exec's output, as it comes: ``stream`` 1 is stdout, 2 stderr."""

    stream: int  # 1 = stdout, 2 = stderr
    data: bytes


@dataclass(frozen=True)
class ExecResult:
    """How an exec ended; always the last event of its stream, and there is exactly one."""

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
    """Where sandboxes run: their creation, destruction and inventory on the engine."""

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

    async def image_exists(self, image: str) -> bool:
        """Whether the backend has ``image`` (or assumes so where it cannot tell); sandboxd never
        pulls, so a pool of a missing image is refused."""
        ...

    async def capacity(self) -> tuple[int, int]:
        """Memory bytes and CPUs the backend has for sandboxes (0 = unknown)."""
        ...

    async def update_limits(self, handle: str, limits: Limits) -> None:
        """Changes memory, CPU and pids limits of a running sandbox."""
        ...

    async def ping(self) -> None:
        """Raises BackendError when the backend cannot be reached."""
        ...

    async def close(self) -> None:
        """Lets go of the engine's connections and sessions; destroys no sandbox (a restart finds them)."""
        ...


class Runtime(Protocol):
    """What is done inside a running sandbox: exec, tar in, tar out, usage."""

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
