"""Typed settings, grouped by concern. Read from a TOML file, CLI flags and
the few environment variables every tool of their kind honours (DOCKER_HOST)
at the entry point only (sandboxd.cli); everything else receives a Settings."""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from sandboxd.backend_settings import (
    BackendSettings,
    DockerBackendSettings,
    FakeBackendSettings,
    KubernetesBackendSettings,
)
from sandboxd.backends.base import Limits
from sandboxd.backends.uids import UidRange
from sandboxd.cost_settings import CostSettings
from sandboxd.errors import InvalidArgument
from sandboxd.fleet_settings import FleetSettings
from sandboxd.model_gateway_settings import ModelGatewaySettings

__all__ = [
    "BackendSettings",
    "DockerBackendSettings",
    "FakeBackendSettings",
    "KubernetesBackendSettings",
]


@dataclass
class ServerSettings:
    """The ``[server]`` section: where gRPC listens, TLS, message size, shutdown grace, auth."""

    host: str = "127.0.0.1"
    """Address the gRPC server binds to."""
    port: int = 50051
    """gRPC port; 0 picks a free one (tests)."""
    grace_seconds: float = 10.0
    """How long in-flight RPCs may finish on shutdown."""
    max_message_bytes: int = 64 << 20
    """Largest gRPC message accepted or sent."""
    tls_cert_file: str = ""
    """PEM certificate chain of the server; with tls_key_file, the port speaks TLS only."""
    tls_key_file: str = ""
    """PEM private key of the server certificate."""
    tls_client_ca_file: str = ""
    """PEM CA bundle; when set, clients must present a certificate it signed (mutual TLS)."""
    require_auth: bool | None = None
    """Require a tenant token on every call; None = required when a tenant has
    a token or the server listens beyond loopback."""


@dataclass
class LeaseSettings:
    """The ``[leases]`` section: lease TTLs and how often expired leases and orphans are swept."""

    default_ttl_seconds: float = 60.0
    """TTL of a lease whose acquire did not ask for one."""
    max_ttl_seconds: float = 24 * 3600.0
    """Largest TTL a client may ask for."""
    reap_interval_seconds: float = 0.5
    """How often expired leases are looked for."""
    orphan_sweep_seconds: float = 30.0
    """How often the backend is checked for sandboxes no pool knows (0 = never)."""


@dataclass
class PoolSettings:
    """The ``[pools]`` section: server-wide bounds and pacing of sandbox creation and scaling."""

    max_starting: int = 8
    """Sandboxes a pool may have in CREATING at once to begin with; the engine's
    start window grows past it while creates stay fast, up to ``max_starting_limit``,
    and halves when they slow (bounds start-up storms)."""
    max_starting_limit: int = 64
    """The most starts in flight the window may grow to across pools (0 = never past ``max_starting``)."""
    create_timeout_seconds: float = 60.0
    """A create slower than this counts as failed and is cleaned up."""
    max_acquire_wait_seconds: float = 600.0
    """Longest an Acquire waits when neither it nor its deadline says less."""
    max_pool_size: int = 10_000
    """Upper bound on any pool's max_size."""
    max_total_sandboxes: int = 0
    """Sandboxes in any state across all pools (host or cluster capacity); 0 = no limit.
    When full, waiting acquirers reclaim other pools' warm sandboxes."""
    max_total_starting: int = 0
    """Sandboxes starting at once across all pools (shared fairly); 0 = no limit."""
    max_create_rate: float = 0.0
    """Backend create attempts per second across all pools (pacing); 0 = unpaced."""
    create_attempts: int = 4
    """Attempts per sandbox on transient backend failures (exponential backoff, jitter)."""
    scale_down_delay_seconds: float = 30.0
    """How long demand must stay lower before warm sandboxes above it are
    destroyed (hysteresis); a pool's idle_seconds overrides it."""
    rate_headroom: float = 1.5
    """Warm sandboxes kept for unannounced traffic: acquire rate x start-up latency x this."""
    rate_window_seconds: float = 30.0
    """Smoothing window of the acquire rate."""
    announcement_ttl_seconds: float = 120.0
    """How long after its due time announced demand counts when SetDemand gives no TTL."""
    refill_defer_seconds: float = 2.0
    """Longest a create that only tops up a warm buffer (no acquirer waits for
    it) waits for restores in flight to finish extracting: on a small host,
    starting containers would take their CPU; 0 = never wait."""
    reconcile_interval_seconds: float = 0.5
    """Longest time between two scaling passes."""
    liveness_interval_seconds: float = 5.0
    """Seconds between checks that warm sandboxes still run; 0 = never."""
    engine_slow_seconds: float = 10.0
    """An engine call slower than this (or than 4x the usual) halves the start
    window; calls that time out (create_timeout_seconds) mark the engine degraded."""
    memory_overcommit: float = 4.0
    """How many ways a sandbox's memory and pids limits are assumed shared when
    the host's capacity is estimated (limits are ceilings, not reservations);
    the estimate is the ceiling while max_total_sandboxes is 0."""


# The ``[limits]`` section: what a pool that does not set a limit gets. The
# fields (and what each means) are those of Limits; a section that names only
# some keeps these values for the rest (_build starts from the default).
DEFAULT_LIMITS = Limits(
    memory_bytes=512 << 20,
    cpu_millis=1000,
    pids=256,
    disk_bytes=256 << 20,
    max_files=20_000,
    output_bytes=1 << 20,
    lifetime_seconds=0,
)


@dataclass
class ExecSettings:
    """The ``[exec]`` section: default and largest exec timeouts, and caps on output, stdin and files."""

    default_timeout_seconds: float = 60.0
    """Timeout of an exec that does not set one."""
    max_timeout_seconds: float = 6 * 3600.0
    max_output_bytes: int = 32 << 20
    """Largest output cap a request may ask for."""
    max_stdin_bytes: int = 16 << 20
    max_read_bytes: int = 48 << 20
    """Largest ReadFiles answer."""
    max_upload_bytes: int = 1 << 30
    """Largest UploadDirectory tar stream."""


@dataclass
class TenantSettings:
    """One tenant: its bearer token and quotas (0 = unlimited)."""

    token: str = ""
    """Bearer token the tenant sends as ``authorization: Bearer <token>``."""
    max_sandboxes: int = 0
    """Sandboxes the tenant may hold leased at once."""
    max_memory_bytes: int = 0
    """Total memory limit of the tenant's leased sandboxes."""
    creates_per_minute: int = 0
    """Fresh sandboxes the tenant may lease per minute (every lease consumes one)."""
    ceiling: Limits = field(default_factory=Limits)
    """Largest limits the tenant's pools and acquires may set; 0 = no ceiling
    beyond the server's bounds."""
    requests_per_second: float = 0.0
    """Calls per second the tenant may make (bursts up to twice that)."""


@dataclass
class S3StoreSettings:
    """An S3-compatible object store for snapshot blobs (path-style requests,
    Signature V4)."""

    endpoint: str = ""
    """Base URL, e.g. http://minio.internal:9000; empty = use the local store."""
    bucket: str = "sandboxd-snapshots"
    access_key: str = ""
    secret_key: str = ""
    region: str = "us-east-1"
    prefix: str = ""
    """Prepended to every key, so several servers can share a bucket."""
    concurrency: int = 32
    """Requests in flight at once."""


@dataclass
class SnapshotSettings:
    """The ``[snapshots]`` section: where blobs are stored, TTLs, per-tenant quotas, GC."""

    blob_dir: Path | None = None
    """Local blob directory; None = state_dir/blobs. Unused with [snapshots.s3]."""
    s3: S3StoreSettings = field(default_factory=S3StoreSettings)
    default_ttl_seconds: float = 7 * 24 * 3600.0
    """Lifetime of a snapshot that did not ask for one."""
    max_ttl_seconds: float = 365 * 24 * 3600.0
    quota_bytes: int = 50 << 30
    """Stored bytes (distinct blobs) each tenant's snapshots may hold; 0 = unlimited."""
    tenant_quota_bytes: dict[str, int] = field(default_factory=dict)
    """Per-tenant overrides of quota_bytes."""
    gc_interval_seconds: float = 300.0
    """How often expired snapshots and unreferenced blobs are removed."""
    exec_timeout_seconds: float = 300.0
    """Timeout of the listing, state and restore commands run inside sandboxes."""
    inotify_watches_per_sandbox: int = 0
    """Directories of one sandbox's workspace the control plane watches to
    know what changed between snapshots (0: an eighth of
    inotify_watches_total); a workspace with more is walked whole at each
    snapshot instead, exactly as before."""
    inotify_watches_total: int = 0
    """Such watches over every sandbox (0: half of the host's
    fs.inotify.max_user_watches, which root shares with the engine and the
    system); past it, further sandboxes are walked."""
    inotify_instances: int = 0
    """inotify instances the control plane holds (0: a quarter of the host's
    fs.inotify.max_user_instances). While sandboxes are fewer, each has one of
    its own, so an event flood that overflows one sandbox's queue sends only
    that sandbox's snapshots to walks."""


@dataclass
class TelemetrySettings:
    """The ``[telemetry]`` section: the Prometheus endpoint and OTLP export (both off by default)."""

    metrics_host: str = "127.0.0.1"
    """Address of the Prometheus scrape endpoint."""
    metrics_port: int = 0
    """Port of the Prometheus scrape endpoint (GET /metrics); 0 = off."""
    otlp_endpoint: str = ""
    """OTLP/gRPC collector for metrics and traces (e.g. http://collector:4317);
    empty = off. Needs the ``otlp`` extra."""
    otlp_interval_seconds: float = 15.0
    """How often metrics are pushed over OTLP."""
    service_name: str = "sandboxd"
    """service.name of the exported telemetry."""


@dataclass
class ImageSettings:
    """The ``[images]`` section: pulls from registries and the image cache's disk budget."""

    cache_bytes: int = 0
    """Bytes the images sandboxd pulled or built may take on the engine's
    disk; past it, unused ones are removed least recently used first. 0 =
    ``cache_share`` of the filesystem holding the engine's images."""
    cache_share: float = 0.5
    """Share of the engine's image filesystem the cache may take when
    ``cache_bytes`` is 0."""
    max_concurrent_pulls: int = 3
    """Pulls (and builds) the engine runs at once; more wait their turn."""
    docker_config: str = ""
    """Directory of the Docker config (config.json, its ``auths``) giving
    registry credentials; empty = $DOCKER_CONFIG, else ~/.docker."""
    unavailable_retry_seconds: float = 5.0
    """Retry hint of an UNAVAILABLE answer when a registry cannot be reached."""
    evict_interval_seconds: float = 30.0
    """How often the cache checks its budget beyond the checks after each pull."""
    unpack_ratio: float = 2.0
    """Disk an image's layers take unpacked per byte the registry serves
    them in (gzip of a typical image: about 2; 1 for incompressible
    content): before a pull the cache makes room for the layers it lacks
    times this."""
    dockerfile_frontend: str = ""
    """Image of a BuildKit Dockerfile frontend for builds whose Dockerfile
    names none (no ``# syntax=`` line), found on the engine or a registry it
    reaches: e.g. the one ``python -m sandboxd.images.dockerfile_frontend``
    builds (syntax 1.4: heredocs, ``COPY --link``). Empty = the engine's
    built-in frontend."""


@dataclass
class PoolPreset:
    """A pool created at start-up if the store does not already hold it."""

    name: str
    image: str
    min_ready: int = 0
    max_size: int = 64
    runtime: str = "runc"
    """Isolation runtime: runc or gvisor (sandboxd.backends.base.RUNTIMES)."""


@dataclass
class Settings:
    """Everything a server is built from, as load_settings reads it: each TOML section is its field."""

    instance_id: str = "default"
    """Names this control plane's sandboxes on the backend; two servers on one
    engine need different ids."""
    state_dir: Path = field(default_factory=lambda: Path.home() / ".local/state/sandboxd")
    """Where pools and leases persist (SQLite) across restarts."""
    server: ServerSettings = field(default_factory=ServerSettings)
    leases: LeaseSettings = field(default_factory=LeaseSettings)
    pools: PoolSettings = field(default_factory=PoolSettings)
    limits: Limits = DEFAULT_LIMITS
    """Defaults for pools that do not set a limit (DEFAULT_LIMITS)."""
    exec: ExecSettings = field(default_factory=ExecSettings)
    backend: BackendSettings = field(default_factory=DockerBackendSettings)
    presets: list[PoolPreset] = field(default_factory=list)
    tenants: dict[str, TenantSettings] = field(default_factory=dict)
    """Tenants by name. When any has a token, every call must authenticate;
    with none, all calls act as the tenant "default"."""
    snapshots: SnapshotSettings = field(default_factory=SnapshotSettings)
    telemetry: TelemetrySettings = field(default_factory=TelemetrySettings)
    images: ImageSettings = field(default_factory=ImageSettings)
    cost: CostSettings = field(default_factory=CostSettings)
    """Prices of the rollout figures' dollars (sandboxd.cost_settings)."""
    fleet: FleetSettings = field(default_factory=FleetSettings)
    """The sandboxes the rollout runs share, by weight (sandboxd.fleet_settings)."""
    model_gateway: ModelGatewaySettings = field(default_factory=ModelGatewaySettings)
    """How the gateway reaches pools' model endpoints (sandboxd.model_gateway_settings)."""


def load_settings(
    path: Path | None = None,
    overrides: dict[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Settings from a TOML file (sections named like the fields above) plus
    dotted overrides such as {"server.port": 0}, then ``environ`` (the process
    environment, passed by the entry point; None = none) for what both left
    unset: DOCKER_HOST is the Docker engine's address."""
    data: dict[str, Any] = {}
    if path is not None:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    for dotted, value in (overrides or {}).items():
        node = data
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    settings = _build_settings(data)
    _apply_environment(settings, environ or {})
    return settings


def _apply_environment(settings: Settings, environ: Mapping[str, str]) -> None:
    backend = settings.backend
    if not isinstance(backend, DockerBackendSettings):
        return
    field_name = "backend.base_url"
    if backend.base_url is None and environ.get("DOCKER_HOST"):
        # Every Docker tool talks to the engine DOCKER_HOST names; so does a
        # server started beside them, unless its settings say otherwise.
        backend.base_url, field_name = environ["DOCKER_HOST"], "DOCKER_HOST"
    if backend.base_url:
        url = urlparse(backend.base_url)
        local = url.scheme == "unix" and url.path
        remote = url.scheme in ("tcp", "http") and url.hostname
        if not (local or remote):
            raise InvalidArgument(
                field_name,
                f"unsupported Docker engine address {backend.base_url!r} "
                "(use unix:///path/to/docker.sock or tcp://host:port)",
            )


def _build_settings(data: dict[str, Any]) -> Settings:
    data = dict(data)
    backend_data = dict(data.pop("backend", {}))
    kind = backend_data.get("kind", "docker")
    backend: BackendSettings
    if kind == "docker":
        backend = _build(DockerBackendSettings, backend_data, "backend")
    elif kind == "fake":
        backend = _build(FakeBackendSettings, backend_data, "backend")
    elif kind == "kubernetes":
        backend = _build(KubernetesBackendSettings, backend_data, "backend")
    else:
        raise InvalidArgument("backend.kind", f"unknown backend {kind!r} (docker, kubernetes or fake)")
    presets = [_build(PoolPreset, p, "presets") for p in data.pop("presets", [])]
    tenants = {
        name: _build(TenantSettings, t, f"tenants.{name}")
        for name, t in dict(data.pop("tenants", {})).items()
    }
    settings: Settings = _build(Settings, data, "")
    if isinstance(backend, DockerBackendSettings | KubernetesBackendSettings):
        problem = UidRange(backend.uid_base, backend.uid_count).problem()
        if problem:
            raise InvalidArgument(
                "backend.uid_base",
                f"sandbox uids {backend.uid_base}+{backend.uid_count} cannot be used: {problem}",
            )
    if isinstance(backend, KubernetesBackendSettings) and backend.prepulls_per_node < 1:
        raise InvalidArgument("backend.prepulls_per_node", f"must be >= 1, got {backend.prepulls_per_node}")
    settings.backend = backend
    settings.presets = presets
    settings.tenants = tenants
    settings.state_dir = Path(settings.state_dir).expanduser()
    return settings


def _build(cls: type[Any], data: dict[str, Any], prefix: str, base: Any = None) -> Any:
    known = {f.name: f for f in fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}.{key}" if prefix else key
        if key not in known:
            raise InvalidArgument(name, "unknown setting")
        f = known[key]
        default = f.default_factory() if f.default_factory is not MISSING else f.default
        if isinstance(value, dict) and is_dataclass(default) and not isinstance(default, type):
            kwargs[key] = _build(type(default), value, name, default)
        else:
            kwargs[key] = value
    # A nested section overrides its default field by field: [limits] keeps
    # DEFAULT_LIMITS for the keys it does not name.
    return replace(base, **kwargs) if base is not None else cls(**kwargs)
