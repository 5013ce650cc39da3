"""Where a Kubernetes sandbox runs: its Pod, from spec to deletion.

One Pod per sandbox (podspec.build_pod: hardened, labelled with
managed/instance/pool/sandbox/tenant), created with a POST and waited on
through the watch cache until Running and Ready; deleted with a grace of 0;
listed by labels for adoption. The namespace gets one deny-all NetworkPolicy
for sandbox Pods. Also what the cluster can hold for them: the nodes they may
land on (capacity, host facts with the namespace's quotas: hostcap.py,
images) and in-place resizes.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import json
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

from sandboxd.backends.base import LABEL_SANDBOX, BackendSandbox, HostFacts, Limits, SandboxSpec
from sandboxd.backends.kubernetes import hostcap
from sandboxd.backends.kubernetes.cache import PodCache, PodInfo
from sandboxd.backends.kubernetes.client import KubeClient, KubeError, idempotent, unreachable, wrap
from sandboxd.backends.kubernetes.egress import EgressProxyRef
from sandboxd.backends.kubernetes.model_gateway import GatewayOptions
from sandboxd.backends.kubernetes.nodeimages import NodeImages
from sandboxd.backends.kubernetes.podspec import (
    ANNOTATION_LABELS,
    ANNOTATION_POOL,
    CONTAINER,
    PodOptions,
    build_pod,
    deny_all_policy,
    parse_quantity,
    resize_body,
    selector,
    tenant_of,
)
from sandboxd.backends.kubernetes.prepull import PrePulls
from sandboxd.backends.kubernetes.quotas import TenantQuotaManager
from sandboxd.backends.uids import SandboxUids
from sandboxd.errors import BackendError, PermanentBackendError, SandboxLost, TransientBackendError

# Deletes remembered for listings in flight (far more than one listing spans).
_DELETED_KEPT = 4096

HealthCheck = Callable[[str], Awaitable[None]]
"""Runs in a Pod that just became Ready (by name); raises if it cannot serve."""


@dataclass(frozen=True)
class KubernetesOptions:
    """Where the Kubernetes backend puts its Pods and how it vets them."""

    instance: str
    namespace: str = "sandboxd-sandboxes"
    kubeconfig: str | None = None
    context: str | None = None
    threads: int = 16
    pod: PodOptions | None = None
    ready_timeout: float = 300.0
    network_policy: bool = True
    allowed_images: tuple[str, ...] = ()
    check_node_images: bool = False
    exec_health_check: bool = False
    tenant_quotas: bool = False
    """Enforce each tenant's quota with a ResourceQuota too (quotas.py)."""
    prefer_image_nodes: bool = True
    """Pods prefer nodes whose status.images list their image (no pull)."""
    egress_proxy: EgressProxyRef | None = None
    """The chart's egress proxy, for pools with network rules (None: such pools are refused)."""
    prepulls_per_node: int = 2
    """Pre-pulls one node runs at once (prepull.py: a node busy pulling is not free)."""
    model_gateway: GatewayOptions | None = None
    """The control plane's gateway listener for Pods of pools with a model
    endpoint (None: such pools are refused)."""
    pool_specs_in_cluster: bool = True
    """Pool specs live in the API server (state = cluster), where a pool's
    NetworkPolicy is removed with its spec."""

    def pod_options(self) -> PodOptions:
        """The Pod options, with this backend's tenant quota setting."""
        opts = self.pod or PodOptions(namespace=self.namespace, instance=self.instance)
        return replace(opts, tenant_quotas=self.tenant_quotas)


class Pods:
    """The sandbox Pods of one control-plane instance in one namespace:
    create, delete, list, resize, and the nodes they may run on."""

    def __init__(
        self, client: KubeClient, cache: PodCache, quotas: TenantQuotaManager, options: KubernetesOptions
    ) -> None:
        self._client = client
        self._cache = cache
        self._quotas = quotas
        self._options = options
        self._pod_opts = options.pod_options()
        self._ns = options.namespace
        self._pods_path = f"/api/v1/namespaces/{self._ns}/pods"
        self._started = asyncio.Lock()
        self._ready = False
        self._cleanups: set[asyncio.Future[None]] = set()
        self.uids = SandboxUids(self._pod_opts.uids, options.instance)
        """Which sandbox holds which uid (its Pod's runAsUser)."""
        # The sandbox user's (uid, gid) of each Pod, and its sandbox id, by name.
        self._users: dict[str, tuple[int, int]] = {}
        self._sandbox_of: dict[str, str] = {}
        # Pods this control plane deleted lately: a listing that still shows
        # one (it began before the delete) books no uid for it.
        self._deleted: OrderedDict[str, None] = OrderedDict()
        self._node_images = NodeImages(self._nodes, time.monotonic)
        self.prepulls = PrePulls(
            client,
            self._pod_opts,
            self._schedulable_nodes,
            self._node_images.holding,
            options.prepulls_per_node,
        )
        """Images pulled onto nodes ahead of their sandboxes."""

    async def ensure_started(self) -> None:
        """Once: the namespace's NetworkPolicy (if asked for) and the watch cache."""
        if self._ready:
            return
        async with self._started:
            if self._ready:
                return
            try:
                if self._options.network_policy:
                    await self._ensure_network_policy()
                await self._cache.start()
            except KubeError as e:
                raise wrap(e, f"cannot watch Pods in namespace {self._ns!r}") from e
            self._ready = True

    async def _ensure_network_policy(self) -> None:
        path = f"/apis/networking.k8s.io/v1/namespaces/{self._ns}/networkpolicies"
        try:
            await self._client.request("POST", path, body=deny_all_policy(self._ns))
        except KubeError as e:
            if e.status != 409:  # created by an earlier start: fine
                raise

    async def ping(self) -> None:
        """Raises TransientBackendError if the API server does not answer; then ensure_started()."""
        try:
            await self._client.request("GET", "/version", timeout=10)
        except KubeError as e:
            raise TransientBackendError(f"Kubernetes API server unreachable: {e}") from e
        await self.ensure_started()

    async def image_exists(self, image: str) -> bool:
        """Kubernetes has no image store to ask before scheduling: with an
        allow-list, the image must be on it; with check_node_images, some
        node must report it in status.images (kubelets list what they hold;
        kwok nodes list nothing); otherwise every image is assumed to exist
        and a bad one fails the create (ErrImagePull is permanent)."""
        if self._options.allowed_images:
            return image in self._options.allowed_images
        if not self._options.check_node_images:
            return True
        nodes = await self._nodes()
        for node in nodes:
            for img in (node.get("status") or {}).get("images") or []:
                if image in (img.get("names") or []):
                    return True
        return False

    async def create(
        self,
        spec: SandboxSpec,
        check: HealthCheck | None,
        shape: Callable[[dict[str, Any]], dict[str, Any]] = lambda body: body,
    ) -> str:
        """Creates the sandbox's Pod (its manifest passed through ``shape``),
        waits until it serves and runs ``check`` in it; returns the Pod's name.
        A failed or cancelled create deletes the Pod, even one still being posted."""
        await self.ensure_started()
        if self._options.tenant_quotas:
            await self._quotas.ensure_class(tenant_of(spec.pool))
        user = None if self.uids.shared else self.uids.allocate(spec.sandbox_id)
        image_nodes = await self._node_images.holding(spec.image) if self._options.prefer_image_nodes else []
        body = shape(build_pod(spec, self._pod_opts, user, image_nodes))
        name = str(body["metadata"]["name"])
        self._users[name] = user or (self._pod_opts.uid, self._pod_opts.gid)
        self._sandbox_of[name] = spec.sandbox_id
        self._deleted.pop(name, None)
        posting = asyncio.ensure_future(self._client.request("POST", self._pods_path, body=body))
        try:
            try:
                await asyncio.shield(posting)
            except KubeError as e:
                if e.status == 409:
                    raise TransientBackendError(f"Pod {name} already exists (a previous attempt)") from e
                if e.status == 403 and "exceeded quota" in str(e):
                    raise TransientBackendError(f"namespace quota is full: {e}") from e
                raise wrap(e, f"cannot create Pod {name}") from e
            seen: list[bool] = [False]

            def settled(p: PodInfo | None) -> bool:
                if p is None:
                    return seen[0]
                seen[0] = True
                return p.serving or p.permanent or p.deleting or p.phase in ("Failed", "Succeeded")

            try:
                info = await self._cache.wait(name, settled, self._options.ready_timeout)
            except TimeoutError as e:
                pod = self._cache.get(name)
                why = pod.problem if pod and pod.problem else f"phase {pod.phase if pod else 'unknown'}"
                raise TransientBackendError(
                    f"Pod {name} not ready after {self._options.ready_timeout:g}s: {why}"
                ) from e
            if info is None or not info.serving:
                why = (
                    (info.problem or info.terminated_reason or info.phase)
                    if info
                    else "deleted while starting"
                )
                if info is not None and info.permanent:
                    raise PermanentBackendError(f"Pod {name} cannot start: {why}")
                raise TransientBackendError(f"Pod {name} did not start: {why}")
            if check is not None:
                await check(name)
            return name
        except BaseException:
            cleanup = asyncio.ensure_future(self._cleanup_create(posting, name))
            self._cleanups.add(cleanup)
            cleanup.add_done_callback(self._cleanups.discard)
            await asyncio.shield(cleanup)
            raise

    async def _cleanup_create(self, posting: asyncio.Future[Any], name: str) -> None:
        with contextlib.suppress(BaseException):
            await posting
        with contextlib.suppress(BackendError):
            await self.delete(name)

    def sandbox_of(self, name: str) -> str:
        """The sandbox id of a Pod created or listed here ("" = none known)."""
        return self._sandbox_of.get(name, "")

    def known_user(self, name: str) -> tuple[int, int] | None:
        """The sandbox user's (uid, gid) of a Pod created or listed here."""
        return self._users.get(name)

    def _adopt(self, name: str, sandbox_id: str, pod: dict[str, Any]) -> None:
        """Records the user a listed Pod runs as (its container's runAsUser,
        else the Pod's)."""
        spec = pod.get("spec") or {}
        contexts = [c.get("securityContext") or {} for c in spec.get("containers") or []]
        contexts.append(spec.get("securityContext") or {})
        uid = next(
            (c["runAsUser"] for c in contexts if isinstance(c.get("runAsUser"), int)), self._pod_opts.uid
        )
        gid = next((c["runAsGroup"] for c in contexts if isinstance(c.get("runAsGroup"), int)), uid)
        self._users[name] = (uid, gid)
        if sandbox_id:
            self._sandbox_of[name] = sandbox_id
            self.uids.adopt(sandbox_id, uid)

    async def delete(self, name: str) -> None:
        """Deletes the Pod at once (grace 0); gone already is fine."""
        try:
            # Idempotent: retried through a blip of the API server, so fewer
            # Pods are left for the orphan sweep.
            await idempotent(
                lambda: self._client.request(
                    "DELETE",
                    f"{self._pods_path}/{name}",
                    body={"gracePeriodSeconds": 0, "propagationPolicy": "Background"},
                    timeout=10,
                )
            )
        except KubeError as e:
            if e.status != 404:
                raise wrap(e, f"cannot delete Pod {name}") from e
        # Deleted with a grace of 0: its processes are being killed.
        self._users.pop(name, None)
        sandbox_id = self._sandbox_of.pop(name, "")
        if sandbox_id:
            self.uids.release(sandbox_id)
        self._deleted[name] = None
        while len(self._deleted) > _DELETED_KEPT:
            self._deleted.popitem(last=False)

    async def list(self) -> builtins.list[BackendSandbox]:
        """A fresh list from the API server (not the cache): adoption must see
        everything, including Pods created after the last watch event."""
        try:
            body = await self._client.request(
                "GET", self._pods_path, query={"labelSelector": selector(self._options.instance)}, timeout=120
            )
        except KubeError as e:
            raise wrap(e, "cannot list Pods") from e
        out = []
        for pod in body.get("items") or []:
            meta = pod.get("metadata") or {}
            labels = dict(meta.get("labels") or {})
            annotations = meta.get("annotations") or {}
            try:
                own = json.loads(annotations.get(ANNOTATION_LABELS) or "{}")
            except ValueError:
                own = {}
            running = (pod.get("status") or {}).get("phase") == "Running" and not meta.get(
                "deletionTimestamp"
            )
            if meta.get("name") not in self._deleted and not meta.get("deletionTimestamp"):
                self._adopt(str(meta.get("name", "")), labels.get(LABEL_SANDBOX, ""), pod)
            out.append(
                BackendSandbox(
                    sandbox_id=labels.get(LABEL_SANDBOX, ""),
                    pool=str(annotations.get(ANNOTATION_POOL) or ""),
                    handle=str(meta.get("name", "")),
                    running=running,
                    labels={**own, **labels},
                    image=_image_of(pod),
                )
            )
        return out

    async def alive(self, handles: builtins.list[str]) -> set[str]:
        """From the watch cache: no API call at all."""
        await self.ensure_started()
        out = set()
        for h in handles:
            pod = self._cache.get(h)
            if pod is not None and pod.running:
                out.add(h)
        return out

    async def _nodes(self) -> builtins.list[dict[str, Any]]:
        query = {}
        sel = self._pod_opts.node_selector
        if sel:
            query["labelSelector"] = ",".join(f"{k}={v}" for k, v in sel.items())
        try:
            body = await self._client.request("GET", "/api/v1/nodes", query=query, timeout=60)
        except KubeError as e:
            raise wrap(e, "cannot list nodes") from e
        return list(body.get("items") or [])

    async def _schedulable_nodes(self) -> builtins.list[dict[str, Any]] | None:
        """The schedulable, Ready nodes sandbox Pods may land on (their node
        selector, their tolerations); None when this account may not list
        nodes. Raises BackendError when the API server cannot be reached."""
        try:
            nodes = await self._nodes()
        except PermanentBackendError:
            return None
        out = []
        for node in nodes:
            if (node.get("spec") or {}).get("unschedulable") or not self._tolerates(node):
                continue
            conditions = {
                c.get("type"): c.get("status") for c in (node.get("status") or {}).get("conditions") or []
            }
            if conditions.get("Ready") == "True":
                out.append(node)
        return out

    async def _resource_quotas(self) -> builtins.list[dict[str, Any]]:
        """The namespace's ResourceQuotas; none when this account may not read
        them. Raises BackendError when the API server cannot be reached."""
        try:
            body = await self._client.request("GET", f"/api/v1/namespaces/{self._ns}/resourcequotas")
        except KubeError as e:
            if unreachable(e) or e.status >= 500:
                raise wrap(e, "cannot read ResourceQuotas") from e
            return []
        return list(body.get("items") or [])

    async def capacity(self) -> tuple[int, int]:
        """Allocatable memory and CPUs of the schedulable, Ready nodes the
        sandboxes may land on, capped by the namespace's ResourceQuotas.
        Without permission to list nodes, the quota alone (0 = unknown)."""
        memory, cpus = 0.0, 0.0
        for node in await self._schedulable_nodes() or []:
            alloc = (node.get("status") or {}).get("allocatable") or {}
            memory += parse_quantity(alloc.get("memory", "0"))
            cpus += parse_quantity(alloc.get("cpu", "0"))
        for quota in await self._resource_quotas():
            hard = (quota.get("status") or {}).get("hard") or (quota.get("spec") or {}).get("hard") or {}
            for key in ("limits.memory", "requests.memory", "memory"):
                if key in hard:
                    q = parse_quantity(hard[key])
                    memory = min(memory, q) if memory else q
            for key in ("limits.cpu", "requests.cpu", "cpu"):
                if key in hard:
                    q = parse_quantity(hard[key])
                    cpus = min(cpus, q) if cpus else q
        return int(memory), int(cpus)

    async def host_facts(self) -> HostFacts:
        """Per-node allocatable of the nodes sandboxes may land on, and the
        namespace's quotas as what they leave this control plane (see
        hostcap.py for what each figure means). Never raises for a missing
        permission (nodes: the quotas alone; quotas: none); BackendError
        when the API server cannot be reached."""
        nodes = await self._schedulable_nodes()
        quotas = await self._resource_quotas()
        return hostcap.host_facts(nodes, quotas, self._own_use(), self._pod_opts.memory_request_ratio)

    def _own_use(self) -> hostcap.OwnUse:
        """What this control plane's Pods count in quotas, from the watch
        cache (nothing before it has synced: the quota's room then errs low)."""
        if not self._cache.synced.is_set():
            return hostcap.OwnUse()
        counted = [p for p in self._cache.pods.values() if p.counted_by_quota]
        return hostcap.OwnUse(
            pods=len(counted),
            memory_limit=sum(p.memory_limit for p in counted),
            memory_request=sum(p.memory_request for p in counted),
            cpu_limit_millis=sum(p.cpu_limit_millis for p in counted),
            cpu_request_millis=sum(p.cpu_request_millis for p in counted),
        )

    def _tolerates(self, node: dict[str, Any]) -> bool:
        """Whether sandbox Pods (their tolerations) may be scheduled on ``node``."""
        for taint in (node.get("spec") or {}).get("taints") or []:
            if taint.get("effect") not in ("NoSchedule", "NoExecute"):
                continue
            if not any(_tolerated(taint, t) for t in self._pod_opts.tolerations):
                return False
        return True

    async def update_limits(self, handle: str, limits: Limits) -> None:
        """In-place resize through the pods/resize subresource (beta in 1.33,
        on by default). The kubelet applies it asynchronously. A per-Pod pids
        limit does not exist in Kubernetes (it is the kubelet's podPidsLimit),
        so ``pids`` is ignored here."""
        if not (limits.memory_bytes or limits.cpu_millis):
            return
        try:
            await self._client.request(
                "PATCH",
                f"{self._pods_path}/{handle}/resize",
                body=resize_body(limits, self._pod_opts),
                content_type="application/strategic-merge-patch+json",
            )
        except KubeError as e:
            if e.status == 404 and "resize" not in str(e):
                raise SandboxLost("the sandbox's Pod is gone") from e
            if e.status in (400, 404, 405, 422):
                raise PermanentBackendError(
                    f"in-place resize of Pod {handle} refused (needs Kubernetes >= 1.33 with "
                    f"InPlacePodVerticalScaling, and a resize the node can satisfy): {e}"
                ) from e
            raise wrap(e, f"cannot resize Pod {handle}") from e

    async def close(self) -> None:
        """Waits for the deletes of failed creates still running; stops looking after pre-pulls."""
        await asyncio.gather(*self._cleanups, return_exceptions=True)
        await self.prepulls.close()


def _image_of(pod: dict[str, Any]) -> str:
    """The image the sandbox container of ``pod`` was created from."""
    for container in (pod.get("spec") or {}).get("containers") or []:
        if container.get("name") == CONTAINER:
            return str(container.get("image") or "")
    return ""


def _tolerated(taint: dict[str, Any], toleration: Any) -> bool:
    key, op = toleration.get("key", ""), toleration.get("operator", "Equal")
    if key and key != taint.get("key"):
        return False
    if toleration.get("effect") and toleration.get("effect") != taint.get("effect"):
        return False
    return bool(op == "Exists" or toleration.get("value", "") == taint.get("value", ""))
