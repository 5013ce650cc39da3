"""Typed settings, grouped by concern. Read from a TOML file and/or CLI flags
at the entry point only (sandboxd.cli); everything else receives a Settings."""

from __future__ import annotations

import tomllib
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Literal

from sandboxd.errors import InvalidArgument


@dataclass
class ServerSettings:
    host: str = "127.0.0.1"
    """Address the gRPC server binds to."""
    port: int = 50051
    """gRPC port; 0 picks a free one (tests)."""
    grace_seconds: float = 10.0
    """How long in-flight RPCs may finish on shutdown."""
    max_message_bytes: int = 64 << 20
    """Largest gRPC message accepted or sent."""
    require_auth: bool | None = None
    """Require a tenant token on every call; None = required when a tenant has
    a token or the server listens beyond loopback."""


@dataclass
class LeaseSettings:
    default_ttl_seconds: float = 60.0
    """TTL of a lease whose acquire did not ask for one."""
    max_ttl_seconds: float = 24 * 3600.0
    """Largest TTL a client may ask for."""
    reap_interval_seconds: float = 0.5
    """How often expired leases are looked for."""


@dataclass
class PoolSettings:
    max_starting: int = 8
    """Sandboxes a pool may have in CREATING at once (bounds start-up storms)."""
    create_timeout_seconds: float = 60.0
    """A create slower than this counts as failed and is cleaned up."""
    max_acquire_wait_seconds: float = 600.0
    """Longest an Acquire waits when neither it nor its deadline says less."""
    max_pool_size: int = 10_000
    """Upper bound on any pool's max_size."""


@dataclass
class LimitSettings:
    """Defaults for pools that do not set a limit."""

    memory_bytes: int = 512 << 20
    cpu_millis: int = 1000
    pids: int = 256
    disk_bytes: int = 256 << 20
    max_files: int = 20_000
    output_bytes: int = 1 << 20
    lifetime_seconds: int = 0


@dataclass
class ExecSettings:
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
class DockerBackendSettings:
    kind: Literal["docker"] = "docker"
    base_url: str | None = None
    """Engine address (unix:// or tcp://); None = the local socket."""
    user: str = "1000:1000"
    """uid:gid commands run as inside sandboxes."""
    threads: int = 16
    """Threads for blocking engine calls."""
    runtime: str | None = None
    """OCI runtime name (e.g. runsc for gVisor); None = the engine default."""


@dataclass
class FakeBackendSettings:
    kind: Literal["fake"] = "fake"
    start_delay_seconds: float = 0.0
    """Simulated create latency."""


BackendSettings = DockerBackendSettings | FakeBackendSettings


@dataclass
class LimitCeiling:
    """Largest limits a tenant may ask for; 0 = no ceiling beyond the server's bounds."""

    memory_bytes: int = 0
    cpu_millis: int = 0
    pids: int = 0
    disk_bytes: int = 0
    max_files: int = 0
    output_bytes: int = 0
    lifetime_seconds: int = 0


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
    ceiling: LimitCeiling = field(default_factory=LimitCeiling)
    """Largest limits the tenant's pools and acquires may set."""


@dataclass
class PoolPreset:
    """A pool created at start-up if the store does not already hold it."""

    name: str
    image: str
    min_ready: int = 0
    max_size: int = 64


@dataclass
class Settings:
    instance_id: str = "default"
    """Names this control plane's sandboxes on the backend; two servers on one
    engine need different ids."""
    state_dir: Path = field(default_factory=lambda: Path.home() / ".local/state/sandboxd")
    """Where pools and leases persist (SQLite) across restarts."""
    server: ServerSettings = field(default_factory=ServerSettings)
    leases: LeaseSettings = field(default_factory=LeaseSettings)
    pools: PoolSettings = field(default_factory=PoolSettings)
    limits: LimitSettings = field(default_factory=LimitSettings)
    exec: ExecSettings = field(default_factory=ExecSettings)
    backend: BackendSettings = field(default_factory=DockerBackendSettings)
    presets: list[PoolPreset] = field(default_factory=list)
    tenants: dict[str, TenantSettings] = field(default_factory=dict)
    """Tenants by name. When any has a token, every call must authenticate;
    with none, all calls act as the tenant "default"."""


def load_settings(path: Path | None = None, overrides: dict[str, Any] | None = None) -> Settings:
    """Settings from a TOML file (sections named like the fields above) plus
    dotted overrides such as {"server.port": 0}."""
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
    return _build_settings(data)


def _build_settings(data: dict[str, Any]) -> Settings:
    data = dict(data)
    backend_data = dict(data.pop("backend", {}))
    kind = backend_data.get("kind", "docker")
    backend: BackendSettings
    if kind == "docker":
        backend = _build(DockerBackendSettings, backend_data, "backend")
    elif kind == "fake":
        backend = _build(FakeBackendSettings, backend_data, "backend")
    else:
        raise InvalidArgument("backend.kind", f"unknown backend {kind!r} (docker or fake)")
    presets = [_build(PoolPreset, p, "presets") for p in data.pop("presets", [])]
    tenants = {
        name: _build(TenantSettings, t, f"tenants.{name}")
        for name, t in dict(data.pop("tenants", {})).items()
    }
    settings: Settings = _build(Settings, data, "")
    settings.backend = backend
    settings.presets = presets
    settings.tenants = tenants
    settings.state_dir = Path(settings.state_dir).expanduser()
    return settings


def _build(cls: type[Any], data: dict[str, Any], prefix: str) -> Any:
    known = {f.name: f for f in fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}.{key}" if prefix else key
        if key not in known:
            raise InvalidArgument(name, "unknown setting")
        f = known[key]
        default = f.default_factory() if f.default_factory is not MISSING else f.default
        if isinstance(value, dict) and is_dataclass(default):
            kwargs[key] = _build(type(default), value, name)
        else:
            kwargs[key] = value
    return cls(**kwargs)
