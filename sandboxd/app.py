"""The one place that builds a sandboxd server from Settings."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import grpc
import grpc.aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from sandboxd.api.abandoning import Abandoned
from sandboxd.api.auth import Authenticator, AuthInterceptor
from sandboxd.api.demand import DemandServicer
from sandboxd.api.errors import ErrorInterceptor
from sandboxd.api.execs import ExecServicer
from sandboxd.api.files import FileServicer
from sandboxd.api.pools import PoolServicer
from sandboxd.api.preflight import PreflightServicer
from sandboxd.api.rollouts import RolloutServicer
from sandboxd.api.sandboxes import SandboxServicer
from sandboxd.api.snapshots import SnapshotServicer
from sandboxd.api.tracing import TracingInterceptor
from sandboxd.backends.base import Backend, Ledger
from sandboxd.backends.uids import UidRange
from sandboxd.clock import Clock, SystemClock
from sandboxd.core.control import ControlPlane
from sandboxd.core.images import ImageCache
from sandboxd.core.ledger_state import LedgerStateStore
from sandboxd.core.rollouts.fleet import Fleet
from sandboxd.core.rollouts.fleet_meters import register_fleet_gauges
from sandboxd.core.rollouts.meters import register_rollout_gauges
from sandboxd.core.rollouts.service import RolloutManager
from sandboxd.core.rollouts.store import RolloutStore
from sandboxd.core.snapshots import SnapshotCatalog, SnapshotManager
from sandboxd.core.snapshots.meters import register_journal_meters
from sandboxd.core.state import SqliteStateStore, StateStore
from sandboxd.settings import DockerBackendSettings, FakeBackendSettings, KubernetesBackendSettings, Settings
from sandboxd.stores.base import BlobStore
from sandboxd.stores.local import LocalBlobStore
from sandboxd.stores.s3 import S3BlobStore, S3Config
from sandboxd.telemetry import Telemetry
from sandboxd.v1 import (
    demand_pb2,
    demand_pb2_grpc,
    exec_pb2,
    exec_pb2_grpc,
    files_pb2,
    files_pb2_grpc,
    pools_pb2,
    pools_pb2_grpc,
    preflight_pb2,
    preflight_pb2_grpc,
    rollouts_pb2,
    rollouts_pb2_grpc,
    sandboxes_pb2,
    sandboxes_pb2_grpc,
    snapshots_pb2,
    snapshots_pb2_grpc,
)

log = logging.getLogger(__name__)

ENGINE_SERVICE = "sandboxd.engine"
"""Health service that is NOT_SERVING while the engine is degraded (its calls
time out); the server itself still answers, with typed refusals."""
SERVICE_NAMES = [
    pools_pb2.DESCRIPTOR.services_by_name["PoolService"].full_name,
    sandboxes_pb2.DESCRIPTOR.services_by_name["SandboxService"].full_name,
    exec_pb2.DESCRIPTOR.services_by_name["ExecService"].full_name,
    files_pb2.DESCRIPTOR.services_by_name["FileService"].full_name,
    preflight_pb2.DESCRIPTOR.services_by_name["PreflightService"].full_name,
    snapshots_pb2.DESCRIPTOR.services_by_name["SnapshotService"].full_name,
    demand_pb2.DESCRIPTOR.services_by_name["DemandService"].full_name,
    rollouts_pb2.DESCRIPTOR.services_by_name["RolloutService"].full_name,
]


def _inbox_dir(settings: Settings, cfg: DockerBackendSettings) -> Path | None:
    if cfg.inbox_dir is not None:
        return Path(cfg.inbox_dir).expanduser().resolve() if cfg.inbox_dir else None
    if cfg.base_url and not cfg.base_url.startswith("unix://"):
        return None  # the engine's host is not this one: a bind source would not exist there
    return (settings.state_dir / "inbox").resolve()


def make_backend(settings: Settings) -> Backend:
    """The backend [backend] selects (Docker, Kubernetes or fake); only its own module is imported."""
    cfg = settings.backend
    if isinstance(cfg, DockerBackendSettings):
        from sandboxd.backends.docker import DockerBackend, DockerOptions

        return DockerBackend(
            DockerOptions(
                instance=settings.instance_id,
                base_url=cfg.base_url,
                user=cfg.user,
                uids=UidRange(cfg.uid_base, cfg.uid_count),
                threads=cfg.threads,
                runtime=cfg.runtime,
                gvisor_runtime=cfg.gvisor_runtime,
                inbox_dir=_inbox_dir(settings, cfg),
                host_workspaces=cfg.host_workspaces,
                session_pipes=cfg.session_pipes,
                egress_hosts=dict(cfg.egress_hosts),
                egress_max_connections=cfg.egress_max_connections,
                egress_bytes_per_second=cfg.egress_bytes_per_second,
            )
        )
    if isinstance(cfg, FakeBackendSettings):
        from sandboxd.backends.fake import FakeBackend

        return FakeBackend(start_delay=cfg.start_delay_seconds)
    if isinstance(cfg, KubernetesBackendSettings):
        from sandboxd.backends.kubernetes import KubernetesBackend, KubernetesOptions, PodOptions
        from sandboxd.backends.kubernetes.egress import EgressProxyRef
        from sandboxd.backends.kubernetes.model_gateway import GatewayOptions

        return KubernetesBackend(
            KubernetesOptions(
                instance=settings.instance_id,
                namespace=cfg.namespace,
                kubeconfig=cfg.kubeconfig,
                context=cfg.context,
                threads=cfg.threads,
                pod=PodOptions(
                    namespace=cfg.namespace,
                    instance=settings.instance_id,
                    uid=cfg.uid,
                    gid=cfg.uid,
                    uids=UidRange(cfg.uid_base, cfg.uid_count),
                    command=tuple(cfg.command),
                    runtime_class=cfg.runtime_class,
                    gvisor_runtime_class=cfg.gvisor_runtime_class,
                    node_selector=dict(cfg.node_selector),
                    tolerations=tuple(cfg.tolerations),
                    priority_class=cfg.priority_class,
                    image_pull_policy=cfg.image_pull_policy,
                    image_pull_secrets=tuple(cfg.image_pull_secrets),
                    cpu_request_ratio=cfg.cpu_request_ratio,
                    memory_request_ratio=cfg.memory_request_ratio,
                    workspace=cfg.workspace,
                    workspace_storage_class=cfg.workspace_storage_class,
                ),
                ready_timeout=cfg.ready_timeout_seconds,
                network_policy=cfg.network_policy,
                allowed_images=tuple(cfg.allowed_images),
                check_node_images=cfg.check_node_images,
                exec_health_check=cfg.exec_health_check,
                tenant_quotas=cfg.tenant_quotas,
                prefer_image_nodes=cfg.prefer_image_nodes,
                prepulls_per_node=cfg.prepulls_per_node,
                egress_proxy=(
                    EgressProxyRef(cfg.egress_proxy_service, cfg.egress_proxy_namespace or cfg.namespace)
                    if cfg.egress_proxy_service
                    else None
                ),
                model_gateway=(
                    GatewayOptions(
                        cfg.model_gateway_listen,
                        cfg.model_gateway_service,
                        cfg.model_gateway_namespace or cfg.namespace,
                        cfg.model_gateway_address,
                    )
                    if cfg.model_gateway_listen
                    else None
                ),
                pool_specs_in_cluster=cfg.state == "cluster",
            )
        )
    raise TypeError(f"unknown backend settings {cfg!r}")


def make_state_store(settings: Settings, backend: Backend, persist: bool) -> StateStore:
    """Pools and leases in the API server for a Kubernetes backend (several
    replicas, each with its own disk, must see the same leases); in SQLite
    under ``state_dir`` otherwise (one replica per engine)."""
    cfg = settings.backend
    cluster = isinstance(cfg, KubernetesBackendSettings) and cfg.state == "cluster"
    if cluster and persist and isinstance(backend, Ledger) and isinstance(cfg, KubernetesBackendSettings):
        return LedgerStateStore(backend, slack=cfg.lease_record_slack)
    return SqliteStateStore(settings.state_dir / f"{settings.instance_id}.sqlite3" if persist else None)


LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")


def server_credentials(settings: Settings) -> grpc.ServerCredentials | None:
    """TLS credentials (mutual TLS with a client CA), or None for plaintext; ValueError for half a pair."""
    s = settings.server
    if not s.tls_cert_file and not s.tls_key_file:
        if s.tls_client_ca_file:
            raise ValueError("server.tls_client_ca_file needs server.tls_cert_file and server.tls_key_file")
        return None
    if not (s.tls_cert_file and s.tls_key_file):
        raise ValueError("set both server.tls_cert_file and server.tls_key_file")
    pair = (Path(s.tls_key_file).read_bytes(), Path(s.tls_cert_file).read_bytes())
    client_ca = Path(s.tls_client_ca_file).read_bytes() if s.tls_client_ca_file else None
    return grpc.ssl_server_credentials(
        [pair], root_certificates=client_ca, require_client_auth=client_ca is not None
    )


def make_authenticator(settings: Settings) -> Authenticator:
    """Tenant tokens and call rates; unless set, auth is required off loopback or once any token exists.
    ValueError when auth is required but no tenant has a token."""
    tokens = {t.token: name for name, t in settings.tenants.items() if t.token}
    required = settings.server.require_auth
    if required is None:
        # Secure by default: anything reachable from other hosts needs tokens.
        required = bool(tokens) or settings.server.host not in LOOPBACK_HOSTS
    if required and not tokens:
        raise ValueError(
            f"authentication is required (server.host={settings.server.host!r} is not loopback) "
            "but no tenant "
            "has a token: add [tenants.<name>] token=... or set server.require_auth = false"
        )
    rates = {name: t.requests_per_second for name, t in settings.tenants.items() if t.requests_per_second}
    return Authenticator(tokens, required, rates)


@dataclass
class App:
    """A built server and what it runs; ``start`` and ``stop`` bring them up and down in order."""

    settings: Settings
    server: grpc.aio.Server
    control: ControlPlane
    backend: Backend
    health: health.aio.HealthServicer
    port: int
    snapshots: SnapshotManager | None = None
    telemetry: Telemetry | None = None
    rollouts: RolloutManager | None = None
    leader: LeaderGate | None = None
    """Set when several replicas share a backend: pools run only while it leads."""
    abandoned: Abandoned | None = None
    """Releases leases granted to calls that were cancelled; stop waits for them."""
    _step_down: asyncio.Task[None] | None = None
    _health_updates: set[asyncio.Future[None]] = field(default_factory=set)

    @property
    def address(self) -> str:
        """``host:port`` as bound (the real port when the settings asked for 0)."""
        return f"{self.settings.server.host}:{self.port}"

    async def start(self) -> None:
        """Starts pools and managers, then serves with all services SERVING; a standby first waits to lead."""
        if self.leader is not None:
            await self._wait_for_leadership()
        # Before the pools: the warm sandboxes they start need their images.
        if self.control.images is not None:
            await self.control.images.start()
        await self.control.start()
        if self.telemetry is not None:
            await self.telemetry.start()
        if self.snapshots is not None:
            await self.snapshots.start()
        if self.rollouts is not None:
            await self.rollouts.start()
        if self.leader is None:
            await self.server.start()
        for name in ["", LIVENESS_SERVICE, *SERVICE_NAMES]:
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        await self._engine_health(self.control.reconciler.health.degraded)
        self.control.reconciler.health.on_change = self._on_engine_change
        log.info("sandboxd listening on %s (instance %s)", self.address, self.settings.instance_id)

    async def stop(self, grace: float | None = None) -> None:
        """Graceful: stop taking calls, let in-flight ones finish, then stop
        the pools (leased sandboxes stay for the next start to adopt)."""
        await self.health.enter_graceful_shutdown()
        await self.server.stop(self.settings.server.grace_seconds if grace is None else grace)
        if self.abandoned is not None:
            # Calls cut off by the stop are among them: released before the pools stop.
            await self.abandoned.drain()
        if self.snapshots is not None:
            await self.snapshots.stop()
        if self.rollouts is not None:
            await self.rollouts.stop()
        await self.control.stop()
        if self.control.images is not None:
            await self.control.images.stop()
        if self.telemetry is not None:
            await self.telemetry.stop()
        if self._step_down is not None:
            self._step_down.cancel()
        if self.leader is not None:
            await self.leader.stop()  # releases the Lease: a standby takes over at once
        await self.backend.close()

    async def _engine_health(self, degraded: bool) -> None:
        status = health_pb2.HealthCheckResponse
        await self.health.set(ENGINE_SERVICE, status.NOT_SERVING if degraded else status.SERVING)

    def _on_engine_change(self, degraded: bool) -> None:
        # Called from pool code that cannot await; health.set only takes a lock.
        task = asyncio.ensure_future(self._engine_health(degraded))
        self._health_updates.add(task)
        task.add_done_callback(self._health_updates.discard)
        if degraded:
            log.warning("%s", self.control.reconciler.health.describe())
        else:
            log.info("engine recovered: its calls are fast again")

    async def _wait_for_leadership(self) -> None:
        """A standby answers health checks (NOT_SERVING overall, so Services
        route to the leader only; LIVENESS_SERVICE SERVING, for liveness
        probes) but runs no pools until it holds the Lease. A leader that
        loses the Lease stops serving and asks the process to stop (SIGTERM),
        so the orchestrator restarts it as a standby."""
        assert self.leader is not None
        leader = self.leader
        await self.health.set(LIVENESS_SERVICE, health_pb2.HealthCheckResponse.SERVING)
        for name in ["", *SERVICE_NAMES]:
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.server.start()
        log.info("sandboxd standby on %s: waiting for the leader lease", self.address)
        await leader.wait_leading()

        async def step_down() -> None:
            await leader.lost.wait()
            log.error("sandboxd lost the leader lease; stopping")
            for name in ["", *SERVICE_NAMES]:
                await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
            os.kill(os.getpid(), signal.SIGTERM)

        self._step_down = asyncio.create_task(step_down(), name="leader-step-down")


LIVENESS_SERVICE = "sandboxd.liveness"


class LeaderGate(Protocol):
    """Leader election among replicas sharing a backend: only the leader runs pools."""

    lost: asyncio.Event

    async def wait_leading(self, timeout: float | None = None) -> None:
        """Returns once this replica leads; TimeoutError after ``timeout`` seconds."""

    async def stop(self, release: bool = True) -> None:
        """Stops campaigning; with ``release`` a leader gives up the lease so a standby takes over."""


def make_blob_store(settings: Settings, *, persist: bool = True) -> BlobStore:
    """The snapshot blob store the settings choose: S3 when [snapshots.s3]
    names an endpoint, else a local directory (state_dir/blobs by default; a
    throw-away temporary directory when not persisting and none is set)."""
    cfg = settings.snapshots
    if cfg.s3.endpoint:
        return S3BlobStore(
            S3Config(
                endpoint=cfg.s3.endpoint,
                bucket=cfg.s3.bucket,
                access_key=cfg.s3.access_key,
                secret_key=cfg.s3.secret_key,
                region=cfg.s3.region,
                prefix=cfg.s3.prefix,
                concurrency=cfg.s3.concurrency,
            )
        )
    if cfg.blob_dir is not None:
        return LocalBlobStore(Path(cfg.blob_dir).expanduser())
    if persist:
        return LocalBlobStore(settings.state_dir / "blobs")
    return LocalBlobStore(Path(tempfile.mkdtemp(prefix="sandboxd-blobs-")), remove_on_close=True)


def make_snapshot_manager(
    settings: Settings, control: ControlPlane, clock: Clock, *, persist: bool = True
) -> SnapshotManager:
    """The snapshot manager for a server: catalog under state_dir (in memory
    when not persisting), blobs where make_blob_store puts them."""
    catalog = SnapshotCatalog(
        settings.state_dir / f"{settings.instance_id}-snapshots.sqlite3" if persist else None
    )
    blobs = make_blob_store(settings, persist=persist)
    staging = settings.state_dir / "live" / settings.instance_id if persist else None
    return SnapshotManager(control, catalog, blobs, settings.snapshots, clock, staging)


def build_app(
    settings: Settings,
    *,
    backend: Backend | None = None,
    clock: Clock | None = None,
    persist: bool = True,
    telemetry: Telemetry | None = None,
) -> App:
    """The whole server, bound but not started; OSError when its address cannot be bound."""
    backend = backend or make_backend(settings)
    state = make_state_store(settings, backend, persist)
    telemetry = telemetry or Telemetry(settings.telemetry)
    control = ControlPlane(settings, backend, state, clock or SystemClock(), meter=telemetry.meter)
    control.images = ImageCache(
        backend,
        control.clock,
        settings.images,
        ledger_path=settings.state_dir / f"{settings.instance_id}-images.sqlite3" if persist else None,
        meter=telemetry.meter,
        environ=os.environ,
    )
    telemetry.health_detail = control.reconciler.health.describe
    limit = settings.server.max_message_bytes
    server = grpc.aio.server(
        # Outermost first: errors from authentication are mapped like any other.
        interceptors=[
            ErrorInterceptor(),
            AuthInterceptor(make_authenticator(settings)),
            TracingInterceptor(telemetry.tracer),
        ],
        options=[
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", limit),
            ("grpc.so_reuseport", 0),
        ],
    )
    pools_pb2_grpc.add_PoolServiceServicer_to_server(PoolServicer(control), server)
    abandoned = Abandoned(control)
    sandboxes_pb2_grpc.add_SandboxServiceServicer_to_server(SandboxServicer(control, abandoned), server)
    exec_pb2_grpc.add_ExecServiceServicer_to_server(ExecServicer(control), server)
    files_pb2_grpc.add_FileServiceServicer_to_server(FileServicer(control), server)
    preflight_pb2_grpc.add_PreflightServiceServicer_to_server(PreflightServicer(control), server)
    snapshots = make_snapshot_manager(settings, control, control.clock, persist=persist)
    snapshots_pb2_grpc.add_SnapshotServiceServicer_to_server(SnapshotServicer(snapshots, abandoned), server)
    demand_pb2_grpc.add_DemandServiceServicer_to_server(DemandServicer(control), server)
    rollout_store = RolloutStore(
        settings.state_dir / f"{settings.instance_id}-rollouts.sqlite3" if persist else None
    )
    rollouts = RolloutManager(
        control,
        rollout_store,
        control.clock,
        snapshots=snapshots,
        tracer=telemetry.tracer,
        prices=settings.cost,
    )
    if settings.fleet.enabled:
        register_fleet_gauges(telemetry.meter, Fleet(settings.fleet, rollouts))
    register_rollout_gauges(telemetry.meter, rollouts)
    register_journal_meters(telemetry.meter, snapshots.watcher)
    rollouts_pb2_grpc.add_RolloutServiceServicer_to_server(RolloutServicer(rollouts), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        [*SERVICE_NAMES, health.SERVICE_NAME, reflection.SERVICE_NAME], server
    )
    address = f"{settings.server.host}:{settings.server.port}"
    credentials = server_credentials(settings)
    port = server.add_secure_port(address, credentials) if credentials else server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"cannot bind {settings.server.host}:{settings.server.port}")
    app = App(
        settings,
        server,
        control,
        backend,
        health_servicer,
        port,
        snapshots=snapshots,
        telemetry=telemetry,
        rollouts=rollouts,
        abandoned=abandoned,
    )
    cfg = settings.backend
    if isinstance(cfg, KubernetesBackendSettings) and cfg.leader_election:
        from sandboxd.backends.kubernetes import KubernetesBackend, LeaderElector

        if isinstance(backend, KubernetesBackend):
            identity = f"{settings.instance_id}/{socket.gethostname()}/{os.getpid()}"
            duration = cfg.lease_duration_seconds
            app.leader = LeaderElector(
                backend.client,
                cfg.lease_namespace or cfg.namespace,
                cfg.lease_name,
                identity,
                lease_duration=duration,
                renew_deadline=duration * 2 / 3,
                retry_period=duration * 2 / 15,
            )
    return app
