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
from typing import Protocol, runtime_checkable

from sandboxd.backends.hostfs import HostWorkspace
from sandboxd.backends.layout import WORKSPACE as WORKSPACE
from sandboxd.backends.network.gateway import ModelGateway

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
    live_snapshots: bool = True
    """gVisor: started so that a live snapshot carries its sessions (the
    keeper and relay of sandboxd.backends.docker.keeper); False: its shells
    run straight on ``runsc exec``, a faster start, and no live snapshot is
    taken of it."""


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
    (sandboxd.core.ledger_state). Writes are idempotent, so retrying one is
    safe."""

    async def load_pool_specs(self) -> dict[str, str]:
        """Pool specs (JSON text) by pool key."""
        ...

    async def save_pool_spec(self, key: str, spec: str) -> None:
        """Stores ``spec`` under pool key ``key``, replacing any there."""
        ...

    async def delete_pool_spec(self, key: str) -> None:
        """Removes the spec under ``key``; a missing one is not an error."""
        ...

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
class IsolationRuntimes(Protocol):
    """Optional for a backend: it can run sandboxes under more than the
    default runtime (RUNC); a backend without it runs RUNC only."""

    async def runtimes(self) -> frozenset[str]:
        """The RUNTIMES the backend can start sandboxes under now. Raises
        BackendError when it cannot tell."""
        ...


@runtime_checkable
class EgressPolicies(Protocol):
    """Optional for a backend: it can enforce a sandbox's network allow-list
    (SandboxSpec.network); a backend without it refuses every policy."""

    def network_refusal(self, runtime: str) -> str | None:
        """Why sandboxes of ``runtime`` cannot have a network policy here; None when they can."""
        ...


@runtime_checkable
class ModelRoutes(Protocol):
    """Optional for a backend with EgressPolicies: it serves the model route
    (SandboxSpec.model_gateway) through the gateway the core hands it, and
    tells each sandbox's egress counts."""

    def use_model_gateway(self, gateway: ModelGateway) -> None:
        """The gateway sandboxes with the model route are served by."""
        ...

    def egress_counts(self) -> dict[str, tuple[int, int]]:
        """(allowed, denied) attempts of each sandbox with egress open, by sandbox id."""
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


SANDBOX_UID = 1000
"""The sandbox user's uid (and gid) as a snapshot records it, whatever host
uid a backend gave that sandbox: a manifest names the sandbox's own user by
this number and root by 0, so it restores onto any sandbox, each with its own."""


@runtime_checkable
class SandboxUsers(Protocol):
    """Optional for a backend: it gives each sandbox a host uid and gid of its
    own (sandboxes then share no per-user kernel limit: inotify instances,
    queued signals, processes). Without it the sandbox user is SANDBOX_UID."""

    def sandbox_user(self, handle: str) -> tuple[int, int]:
        """(uid, gid) the sandbox's user has on the host and inside it."""
        ...


@runtime_checkable
class InPlaceWrites(Protocol):
    """Optional for a backend: it writes small uploads into a sandbox's
    workspace without a process in the sandbox, where it can."""

    async def write_in_place(self, handle: str, files: list[tuple[str, bytes, int]]) -> bool:
        """Writes (path relative to the workspace, content, mode) as the
        sandbox's user, with the result put_tar would give; False, with
        nothing written, where it cannot (then put_tar does it)."""
        ...


@runtime_checkable
class RootUser(Protocol):
    """Optional for a backend: it runs one-shot commands (``ExecSpec.user ==
    ROOT_USER``) and file transfers as uid 0 inside the sandbox's own
    namespaces, with the sandbox's (empty) capability set, read-only root,
    limits and network, so root owns what it creates and nothing more."""

    async def put_tar_as(self, handle: str, dest: str, chunks: AsyncIterator[bytes], user: str) -> None:
        """``put_tar`` run as ``user`` ("" or ROOT_USER)."""
        ...

    def get_tar_as(self, handle: str, base: str, paths: tuple[str, ...], user: str) -> AsyncIterator[bytes]:
        """``get_tar`` run as ``user`` ("" or ROOT_USER)."""
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


KEEP_VAR = "SANDBOXD_KEEP"
"""Environment variable naming, inside a sandbox that can be checkpointed, the
FIFO its keeper reads: each line written there is started as a process of the
sandbox's init tree, which a live snapshot carries (engine execs it does not)."""


@runtime_checkable
class LiveCheckpoints(Protocol):
    """Optional for a backend: it pauses, checkpoints and restores whole
    running sandboxes of some runtimes (Docker with gVisor: memory, the
    processes of the container's init tree, its tmpfs mounts)."""

    def live_refusal(self, runtime: str) -> str:
        """Why sandboxes of ``runtime`` cannot be paused or checkpointed here
        ("" when they can), as a sentence naming the runtime or the engine."""
        ...

    async def pause(self, handle: str) -> None:
        """Freezes every process of the sandbox (idempotent)."""
        ...

    async def resume(self, handle: str) -> None:
        """Thaws a paused sandbox (idempotent)."""
        ...

    async def not_carried(self, handle: str) -> list[str]:
        """The sandbox's processes a checkpoint taken now would not carry
        (started by engine execs of their own, not in a shell its keeper
        started), each as "args (pid N)"; the backend's own plumbing is left
        out."""
        ...

    async def checkpoint(self, handle: str, dest: Path) -> None:
        """Writes the running sandbox's checkpoint image (its files) into the
        new directory ``dest`` on the control plane's host, between commands
        (FailedPrecondition when one runs on too long); the sandbox keeps
        running."""
        ...

    async def restore_checkpoint(self, handle: str, image: Path) -> None:
        """Replaces what runs in the sandbox by the checkpoint image in
        directory ``image``: its processes continue there, its sessions'
        shells among them (each attached to again by its session's next
        command); its engine execs are gone. The sandbox keeps its own
        container (limits, mounts, name)."""
        ...


LABEL_IMAGE_BUILD = "sandboxd.build"
"""Label on an image sandboxd built: the hash of its Dockerfile, context and
build arguments (the image cache may remove such an image; never another)."""


@dataclass(frozen=True)
class RegistryAuth:
    """Credentials for one registry, as a Docker config's ``auths`` entry gives them."""

    server: str
    username: str = ""
    password: str = ""
    identity_token: str = ""


@dataclass(frozen=True)
class EngineImage:
    """An image on the engine: its id, every reference naming it, and its size."""

    image_id: str
    references: tuple[str, ...] = ()
    """Tags (``repo:tag``) and repository digests (``repo@sha256:...``)."""
    size_bytes: int = 0
    """Bytes on disk, shared layers counted in full (what removing it frees at most)."""
    shared_bytes: int = 0
    """Bytes of its layers that other images on the engine also use (removing it never frees those)."""
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PullStatus:
    """How far a pull has come: bytes of its layers fetched of those known so far."""

    bytes_done: int = 0
    bytes_total: int = 0
    """0 = not known yet (the manifest is still being read)."""
    detail: str = ""
    """The engine's latest word on the pull, e.g. "Downloading" or "Pull complete"."""


@dataclass(frozen=True)
class RemoteImage:
    """An image as its registry serves it, known without pulling it."""

    reference: str
    digest: str
    """The manifest's digest (of the linux/amd64 one under an index)."""
    compressed_bytes: int
    """Its layers and config as fetched; unpacked on disk it takes more."""
    layers: tuple[tuple[str, int], ...] = ()
    """(digest, compressed bytes) of each layer blob, in the manifest's order:
    what a pull fetches is those not already on the engine."""


@dataclass(frozen=True)
class ImageDisk:
    """The filesystem holding the engine's images: its size, what is free, where."""

    total_bytes: int
    free_bytes: int
    path: str = ""


@dataclass(frozen=True)
class BuildSpec:
    """An image to build: a context directory with its Dockerfile, the tag to give it."""

    context: Path
    tag: str
    dockerfile: str = "Dockerfile"
    """Path of the Dockerfile inside ``context``."""
    build_args: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)


@runtime_checkable
class ImageStore(Protocol):
    """Optional for a backend: it pulls, builds, lists and removes images on
    its engine and says how much disk they have (the image cache,
    sandboxd.core.images, manages them through it). Every method raises
    sandboxd errors only."""

    def pull_image(self, reference: str, auth: RegistryAuth | None) -> AsyncIterator[PullStatus]:
        """Pulls ``reference`` (``repo:tag`` or ``repo@sha256:...``), yielding
        progress as the engine reports it; returns once the image is on the
        engine. Raises FailedPrecondition when the registry has no such image
        or refuses the credentials, Unavailable when the registry cannot be
        reached, TransientBackendError when the engine fails."""
        ...

    async def inspect_image(self, reference: str) -> EngineImage | None:
        """The image ``reference`` names on the engine, or None when absent."""
        ...

    async def registry_image(self, reference: str, auth: RegistryAuth | None) -> RemoteImage:
        """What the registry serving ``reference`` says of it, without a
        pull. Raises FailedPrecondition (no such image, credentials refused)
        or Unavailable (registry unreachable), as ``pull_image`` does."""
        ...

    async def list_images(self) -> list[EngineImage]:
        """Every image on the engine with its references and size."""
        ...

    async def remove_image(self, reference: str) -> None:
        """Removes the reference ``reference``; the image itself goes with its
        last reference, and never while a container uses it (FailedPrecondition).
        An absent reference is no error."""
        ...

    async def image_disk(self) -> ImageDisk:
        """The filesystem holding the engine's image data."""
        ...

    def build_image(self, spec: BuildSpec) -> AsyncIterator[str]:
        """Builds ``spec`` through the engine, yielding the build's log lines;
        returns once the image is tagged. Raises BuildFailed naming the
        failing step, TransientBackendError when the engine fails."""
        ...


@runtime_checkable
class ImagePrefetch(Protocol):
    """Optional for a backend whose nodes pull images themselves (Kubernetes:
    the kubelets): it pulls an image onto nodes ahead of the sandboxes that
    will need it, so their Pods start without a pull."""

    async def prefetch_image(self, image: str, copies: int) -> int:
        """Starts pulls of ``image`` onto up to ``copies`` nodes that do not
        hold it yet; returns how many it started (0: every node has it, or
        one is pulling it there). Raises BackendError when it cannot."""
        ...
