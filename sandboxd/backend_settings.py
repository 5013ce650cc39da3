"""The ``[backend]`` section of the server's settings: which backend runs the
sandboxes, and its own settings (one dataclass per backend; ``kind`` picks
it). Re-exported by sandboxd.settings, which reads them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from sandboxd.backends.uids import DEFAULT_UIDS


@dataclass
class DockerBackendSettings:
    """Sandboxes as containers on a Docker engine (sandboxd.backends.docker); the default backend."""

    kind: Literal["docker"] = "docker"
    base_url: str | None = None
    """Engine address (unix:// or tcp://); None = $DOCKER_HOST as the
    entry point found it, else the local socket (unix:///var/run/docker.sock)."""
    user: str = "1000:1000"
    """uid:gid every sandbox's commands run as when ``uid_count`` is 0 (one
    user shared by all sandboxes, and with it every per-user kernel limit)."""
    uid_base: int = DEFAULT_UIDS.base
    """First host uid given to runc sandboxes: each runs as a uid (and gid)
    of its own from ``uid_base`` on, so that no sandbox can use up another's
    per-user kernel limits (inotify instances, queued signals). Must lie
    above root and the system users (> 999), and the range must not hold
    1000 (the images' sandbox user), 65534 (nobody) or an image's own user.
    gVisor sandboxes run as ``user`` (each sentry counts nothing per host
    uid). Without an inbox (a remote engine) the image's /etc/passwd stays:
    HOME, USER and LOGNAME are set, but a lookup of the uid finds no name."""
    uid_count: int = DEFAULT_UIDS.count
    """How many uids from ``uid_base`` sandboxes are given (more than the
    host ever runs at once; a create past it is refused until one is
    destroyed); 0 = every sandbox runs as ``user``."""
    threads: int = 16
    """Threads for blocking engine calls."""
    runtime: str | None = None
    """OCI runtime of runc pools' sandboxes (the engine's name for it); None =
    the engine default."""
    gvisor_runtime: str = "runsc"
    """The engine's name for gVisor's OCI runtime (daemon.json "runtimes"),
    which pools of runtime "gvisor" run under."""
    inbox_dir: str | None = None
    """Host directory of the sandboxes' read-only inboxes, through which large
    archives (restores, forks) are handed over by hard link instead of being
    streamed through the engine. None = state_dir/inbox with a local engine
    (unix socket) and off with a remote one; "" = off."""
    host_workspaces: bool = True
    """Snapshots read workspaces in place when the control plane can see the
    containers' processes (same host and pid namespace, as root, default
    runtime); they fall back to reading through the sandbox otherwise.
    False = always through it."""
    session_pipes: bool = True
    """Session shells' stdin/stdout/stderr on FIFOs in the sandbox's inbox,
    read and written by the control plane directly, where it can see the
    containers' processes (runc and crun sandboxes with an inbox); False =
    through the engine's exec stream, as under gVisor."""
    egress_hosts: dict[str, str] = field(default_factory=dict)
    """Host names (name -> address) the egress proxy of a pool with a network
    policy resolves from this table instead of the host's resolver: an
    internal mirror or forge known by a name of its own."""
    egress_max_connections: int = 64
    """Connections through its egress proxy a sandbox with a network policy
    may hold open at once; more are answered 429."""
    egress_bytes_per_second: int = 64 << 20
    """Bandwidth of such a sandbox's egress, both directions and all its
    connections together; 0 = unbounded."""


@dataclass
class FakeBackendSettings:
    """The in-memory backend with a small simulated shell (sandboxd.backends.fake), for fast tests."""

    kind: Literal["fake"] = "fake"
    start_delay_seconds: float = 0.0
    """Simulated create latency."""


@dataclass
class KubernetesBackendSettings:
    """Sandboxes as Pods (sandboxd.backends.kubernetes)."""

    kind: Literal["kubernetes"] = "kubernetes"
    namespace: str = "sandboxd-sandboxes"
    """Namespace the sandbox Pods live in (must exist)."""
    kubeconfig: str | None = None
    """Kubeconfig file; None = the in-cluster ServiceAccount when mounted, else
    the client's default lookup ($KUBECONFIG, ~/.kube/config)."""
    context: str | None = None
    """Kubeconfig context; None = the current one."""
    threads: int = 16
    """Threads (and pooled connections) for API requests."""
    uid: int = 1000
    """uid (and gid) every sandbox container runs as when ``uid_count`` is 0."""
    uid_base: int = DEFAULT_UIDS.base
    """First uid given to sandbox Pods (runAsUser, runAsGroup and fsGroup):
    each runs as a uid of its own from ``uid_base`` on, so that Pods on one
    node share no per-user kernel limit (inotify instances, queued signals).
    Must lie above root and the system users (> 999), and the range must not
    hold 1000 (the images' sandbox user) or 65534 (nobody)."""
    uid_count: int = DEFAULT_UIDS.count
    """How many uids from ``uid_base`` sandbox Pods are given (more than the
    cluster ever runs at once); 0 = every Pod runs as ``uid``."""
    command: list[str] = field(default_factory=list)
    """What the sandbox container runs (keeps it alive; commands come by exec);
    empty = a shell loop that also reaps orphaned processes (podspec.KEEPALIVE)."""
    runtime_class: str | None = None
    """RuntimeClass of runc pools' Pods (e.g. kata); None = the node default."""
    gvisor_runtime_class: str = "gvisor"
    """RuntimeClass of pools of runtime "gvisor" (its handler: gVisor's
    containerd shim, runsc); "" = such pools are refused."""
    node_selector: dict[str, str] = field(default_factory=dict)
    """Node labels sandbox Pods must land on (also scopes capacity())."""
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    """Pod tolerations, as in the Pod spec."""
    priority_class: str | None = None
    image_pull_policy: str = "IfNotPresent"
    image_pull_secrets: list[str] = field(default_factory=list)
    """Secrets in the namespace (kubernetes.io/dockerconfigjson) every
    sandbox Pod pulls its image with: a private registry's credentials."""
    prefer_image_nodes: bool = True
    """Pods prefer nodes whose status.images already list their image
    (a preferred node affinity; the scheduler still decides)."""
    prepulls_per_node: int = 2
    """Pre-pulls of announced images one node runs at once: a node with as
    many in flight gets no more until one ends (busy pulling is not free)."""
    cpu_request_ratio: float = 1.0
    """CPU request = limit x this (below 1 overcommits nodes)."""
    memory_request_ratio: float = 1.0
    """Memory request = limit x this."""
    workspace: Literal["emptydir", "memory", "ephemeral"] = "emptydir"
    """Workspace volume: emptydir (size enforced by kubelet eviction), memory
    (tmpfs, size kernel-enforced), ephemeral (a PVC per Pod from
    workspace_storage_class; bytes and files enforced by its filesystem)."""
    workspace_storage_class: str | None = None
    ready_timeout_seconds: float = 300.0
    """Longest a create waits for its Pod to be Running and Ready."""
    network_policy: bool = True
    """Create a deny-all NetworkPolicy for sandbox Pods in the namespace."""
    egress_proxy_service: str = ""
    """The chart's egress proxy Service (``sandboxd egress-proxy``) that Pods
    of pools with network rules reach the allowed hosts through; empty =
    such pools are refused (FAILED_PRECONDITION)."""
    egress_proxy_namespace: str = ""
    """Namespace of that Service and its Pods; empty = ``namespace``."""
    model_gateway_listen: str = ""
    """IP:PORT where the control plane serves the model gateway to Pods of
    pools with a model endpoint (the chart: "0.0.0.0:8091"); empty = such
    pools are refused (FAILED_PRECONDITION)."""
    model_gateway_service: str = ""
    """The control plane's Service (a port named ``model-gateway``) Pods reach
    that listener through; empty = ``model_gateway_address``."""
    model_gateway_namespace: str = ""
    """Namespace of that Service and its Pods; empty = ``namespace``."""
    model_gateway_address: str = ""
    """IP:PORT Pods reach the listener at without a Service; empty = the
    listener's own address (it must then name an IP, not 0.0.0.0)."""
    allowed_images: list[str] = field(default_factory=list)
    """Images pools may use; empty = any (image_exists() is then always true)."""
    check_node_images: bool = False
    """image_exists() asks whether some node reports the image in status.images."""
    exec_health_check: bool = False
    """Run ``true`` in each new Pod before it counts as ready (needs real nodes)."""
    leader_election: bool = False
    """Hold a coordination.k8s.io Lease before running pools (several replicas):
    a standby serves health (NOT_SERVING) until it leads (sandboxd.app)."""
    lease_name: str = "sandboxd-leader"
    lease_namespace: str | None = None
    """Namespace of the election Lease; None = ``namespace``."""
    tenant_quotas: bool = False
    """Mirror each tenant's quota (max_sandboxes, max_memory_bytes, plus its
    pools' warm ceilings) as a ResourceQuota scoped to a per-tenant
    PriorityClass that its Pods name, so the API server enforces it too.
    Needs create/get of PriorityClasses (cluster-wide) and create/patch of
    ResourceQuotas; replaces ``priority_class``."""
    lease_duration_seconds: float = 15.0
    """How long a standby waits after the leader's last renewal before it
    takes over; the leader renews every 2/15 of it and steps down when it has
    not renewed for 2/3 of it (client-go's 15 / 2 / 10 s)."""
    state: Literal["cluster", "sqlite"] = "cluster"
    """Where pools and leases persist: ``cluster`` = in the API server (each
    lease as an annotation on its Pods, pool specs in a ConfigMap), so a
    standby replica takes over what the leader leased; ``sqlite`` = under
    ``state_dir`` (one replica with a persistent volume)."""
    lease_record_slack: float = 0.5
    """With state = cluster, the expiry written on a Pod is the lease's expiry
    plus this x its TTL, and a heartbeat rewrites it only once the real expiry
    passes it: fewer writes, at the cost of keeping an abandoned lease this
    much longer after a failover."""


BackendSettings = DockerBackendSettings | FakeBackendSettings | KubernetesBackendSettings
