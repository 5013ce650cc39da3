"""Sandboxes as Pods through the Kubernetes API server.

Deployment: one Pod per sandbox (podspec.build_pod: hardened, labelled with
managed/instance/pool/sandbox/tenant), created with a POST and waited on
through the watch cache until Running and Ready; destroyed with a delete of
grace 0; listed by labels for adoption. The namespace gets one deny-all
NetworkPolicy for sandbox Pods. Runtime: exec, sessions and tar over the API
server's exec stream (execs, wsexec).

The handle of a sandbox is its Pod's name.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass, replace
from typing import Any

from sandboxd.backends.base import (
    LABEL_SANDBOX,
    BackendSandbox,
    ExecEvent,
    ExecOutcome,
    ExecResult,
    ExecSpec,
    LeaseMark,
    Limits,
    QuotaHeadroom,
    SandboxSpec,
    SandboxUsage,
)
from sandboxd.backends.kubernetes.cache import PodCache, PodInfo
from sandboxd.backends.kubernetes.client import (
    KubeClient,
    KubeError,
    idempotent,
    load_configuration,
    unavailable,
    unreachable,
    wrap,
)
from sandboxd.backends.kubernetes.execs import PodTarget, ShellSession, run_oneshot
from sandboxd.backends.kubernetes.ledger import KubeLedger
from sandboxd.backends.kubernetes.limits import (
    COUNTERS_ARGV,
    FS_ARGV,
    KILL_ALL_ARGV,
    Counters,
    explain_counters,
    explain_fs,
    parse_counters,
    parse_fs,
)
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
from sandboxd.backends.kubernetes.quotas import TenantQuotaManager
from sandboxd.backends.kubernetes.wsexec import V5, ExecStream
from sandboxd.backends.shell import get_tar_argv, put_tar_argv
from sandboxd.errors import (
    BackendError,
    InvalidArgument,
    NotFound,
    PermanentBackendError,
    ResourceExhausted,
    SandboxLost,
    TransientBackendError,
)

log = logging.getLogger(__name__)

# Reads cgroup v2 counters and workspace use inside the sandbox (usage()).
_USAGE = r"""
c=/sys/fs/cgroup
if [ -f $c/memory.current ]; then  # cgroup v2
  printf 'mem %s\npeak %s\npids %s\n' "$(cat $c/memory.current)" \
    "$(cat $c/memory.peak 2>/dev/null || echo 0)" "$(cat $c/pids.current 2>/dev/null || echo 0)"
  printf 'cpu %s\n' "$(sed -n 's/^usage_usec //p' $c/cpu.stat 2>/dev/null || echo 0)"
else  # cgroup v1
  printf 'mem %s\n' "$(cat $c/memory/memory.usage_in_bytes 2>/dev/null || echo 0)"
  printf 'peak %s\n' "$(cat $c/memory/memory.max_usage_in_bytes 2>/dev/null || echo 0)"
  printf 'pids %s\n' "$(cat $c/pids/pids.current 2>/dev/null || echo 0)"
  printf 'cpu %s\n' "$(( $(cat $c/cpuacct/cpuacct.usage 2>/dev/null || echo 0) / 1000 ))"
fi
# Used bytes and files of the workspace itself (an emptyDir shares the node's
# filesystem, so df would show the node's); totals from df when it is its own.
printf 'disk %s %s\n' "$(du -s -B1 -x /workspace 2>/dev/null | cut -f1)" \
  "$(df -P -B1 /workspace 2>/dev/null | awk 'NR==2{print $2}')"
printf 'files %s %s\n' "$(find /workspace -xdev 2>/dev/null | wc -l)" \
  "$(df -P -i /workspace 2>/dev/null | awk 'NR==2{print $2}')"
"""


@dataclass(frozen=True)
class KubernetesOptions:
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

    def pod_options(self) -> PodOptions:
        opts = self.pod or PodOptions(namespace=self.namespace, instance=self.instance)
        return replace(opts, tenant_quotas=self.tenant_quotas)


class KubernetesBackend:
    def __init__(self, options: KubernetesOptions, client: KubeClient | None = None) -> None:
        self._options = options
        self._pod_opts = options.pod_options()
        self._ns = options.namespace
        self._client = client or KubeClient(
            load_configuration(options.kubeconfig, options.context), threads=options.threads
        )
        self._pods_path = f"/api/v1/namespaces/{self._ns}/pods"
        self.cache = PodCache(
            self._client, self._ns, selector(options.instance), (ANNOTATION_POOL, ANNOTATION_LABELS)
        )
        self.quotas = TenantQuotaManager(self._client, self._ns)
        self.ledger = KubeLedger(self._client, self._ns, options.instance, selector(options.instance))
        self._started = asyncio.Lock()
        self._ready = False
        self._sessions: dict[str, dict[str, ShellSession]] = {}
        self._session_locks: dict[str, asyncio.Lock] = {}
        self._cleanups: set[asyncio.Future[None]] = set()
        # Limit counters (limits.py) last read per sandbox; None = unreadable.
        self._counters: dict[str, Counters | None] = {}

    @property
    def client(self) -> KubeClient:
        return self._client

    async def _ensure_started(self) -> None:
        if self._ready:
            return
        async with self._started:
            if self._ready:
                return
            try:
                if self._options.network_policy:
                    await self._ensure_network_policy()
                await self.cache.start()
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

    # -- Deployment ---------------------------------------------------------

    async def ping(self) -> None:
        try:
            await self._client.request("GET", "/version", timeout=10)
        except KubeError as e:
            raise TransientBackendError(f"Kubernetes API server unreachable: {e}") from e
        await self._ensure_started()

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

    async def create(self, spec: SandboxSpec) -> str:
        await self._ensure_started()
        if self._options.tenant_quotas:
            await self.quotas.ensure_class(tenant_of(spec.pool))
        body = build_pod(spec, self._pod_opts)
        name = str(body["metadata"]["name"])
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
                info = await self.cache.wait(name, settled, self._options.ready_timeout)
            except TimeoutError as e:
                pod = self.cache.get(name)
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
            if self._options.exec_health_check:
                await self._health_check(name)
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
            await self._delete(name)

    async def _health_check(self, name: str) -> None:
        # The limit counters' baseline doubles as the check that commands run
        # (grep: 0 = found, 1 = none, 2 = some counter file missing).
        probe = await self._probe(name, COUNTERS_ARGV, attempts=1)
        if probe[0] in (0, 1, 2):
            self._counters[name] = parse_counters(probe[1])
            return
        async for event in run_oneshot(self._target(name), ExecSpec(shell="true", timeout=30)):
            if isinstance(event, ExecResult) and (event.outcome is not ExecOutcome.EXITED or event.exit_code):
                raise TransientBackendError(f"health check failed: {event.detail or event.outcome.name}")

    async def _delete(self, name: str) -> None:
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

    async def destroy(self, handle: str) -> None:
        self._counters.pop(handle, None)
        sessions = list(self._sessions.pop(handle, {}).values())
        self._session_locks.pop(handle, None)
        for session in sessions:
            await session.close()
        await self._delete(handle)

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
            out.append(
                BackendSandbox(
                    sandbox_id=labels.get(LABEL_SANDBOX, ""),
                    pool=str(annotations.get(ANNOTATION_POOL) or ""),
                    handle=str(meta.get("name", "")),
                    running=running,
                    labels={**own, **labels},
                )
            )
        return out

    # -- TenantQuotas: ResourceQuotas per tenant (see quotas.py) ------------

    async def set_tenant_quota(self, tenant: str, pods: int, memory_bytes: int) -> None:
        if self._options.tenant_quotas:
            await self.quotas.set(tenant, pods, memory_bytes)

    async def quota_headroom(self, tenant: str) -> QuotaHeadroom:
        return await self.quotas.headroom(tenant)

    # -- Ledger: the API server keeps pools and leases (see ledger.py) -----

    async def load_pool_specs(self) -> dict[str, str]:
        return await self.ledger.load_pool_specs()

    async def save_pool_spec(self, key: str, spec: str) -> None:
        await self.ledger.save_pool_spec(key, spec)

    async def delete_pool_spec(self, key: str) -> None:
        await self.ledger.delete_pool_spec(key)

    async def mark_leased(self, handle: str, mark: LeaseMark) -> None:
        await self.ledger.mark_leased(handle, mark)

    async def lease_marks(self) -> builtins.list[tuple[str, str, LeaseMark]]:
        return await self.ledger.lease_marks()

    async def alive(self, handles: builtins.list[str]) -> set[str]:
        """From the watch cache: no API call at all."""
        await self._ensure_started()
        out = set()
        for h in handles:
            pod = self.cache.get(h)
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

    async def capacity(self) -> tuple[int, int]:
        """Allocatable memory and CPUs of the schedulable, Ready nodes the
        sandboxes may land on, capped by the namespace's ResourceQuotas.
        Without permission to list nodes, the quota alone (0 = unknown)."""
        memory, cpus = 0.0, 0.0
        try:
            nodes = await self._nodes()
        except PermanentBackendError:
            nodes = []
        for node in nodes:
            if (node.get("spec") or {}).get("unschedulable") or not self._tolerates(node):
                continue
            conditions = {
                c.get("type"): c.get("status") for c in (node.get("status") or {}).get("conditions") or []
            }
            if conditions.get("Ready") != "True":
                continue
            alloc = (node.get("status") or {}).get("allocatable") or {}
            memory += parse_quantity(alloc.get("memory", "0"))
            cpus += parse_quantity(alloc.get("cpu", "0"))
        try:
            quotas = await self._client.request("GET", f"/api/v1/namespaces/{self._ns}/resourcequotas")
        except KubeError:
            quotas = {}
        for quota in quotas.get("items") or []:
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
        await asyncio.gather(*self._cleanups, return_exceptions=True)
        for sessions in self._sessions.values():
            for session in sessions.values():
                await session.close()
        self._sessions.clear()
        await self.cache.stop()
        await self._client.close()

    # -- Runtime ------------------------------------------------------------

    def _target(self, handle: str) -> PodTarget:
        async def alive() -> bool:
            pod = self.cache.get(handle)
            return pod is not None and pod.running

        return PodTarget(self._client, self._ns, handle, CONTAINER, alive, self._spawn)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)

    async def exec(self, handle: str, spec: ExecSpec) -> AsyncIterator[ExecEvent]:
        if handle not in self._counters:  # adopted, or created without a health check
            probe = await self._probe(handle, COUNTERS_ARGV, attempts=1)
            if probe[0] is not None:  # else: read again before the next command
                self._counters[handle] = parse_counters(probe[1])
        async for event in self._exec(handle, spec):
            if isinstance(event, ExecResult) and _failed(event):
                event = await self._explain(handle, event)
            yield event

    async def _explain(self, handle: str, result: ExecResult) -> ExecResult:
        """Names the limit a failed command hit, if one did (limits.py)."""
        pod = self.cache.get(handle)
        ended = (pod.terminated_reason, pod.last_terminated_reason) if pod is not None else ()
        if result.outcome is ExecOutcome.SANDBOX_LOST and "OOMKilled" in ended:
            detail = "the sandbox's main process hit its memory limit and was killed"
            return replace(result, outcome=ExecOutcome.OOM_KILLED, detail=detail)
        if result.sandbox_gone:
            return result
        before = self._counters.get(handle)
        probe = await self._probe(handle, COUNTERS_ARGV, attempts=8)
        after = parse_counters(probe[1]) if probe[0] is not None else None
        if after is not None:
            self._counters[handle] = after
        if probe[0] is None and _NO_PROCESS_SLOT in probe[1].lower():
            # Not even one more process can start in the sandbox.
            why: tuple[ExecOutcome, str] | None = (
                ExecOutcome.PIDS_EXHAUSTED,
                "the sandbox's process limit was reached (no process can start)",
            )
        elif before is None or after is None:
            return result
        else:
            why = explain_counters(before, after)
        if why is None and result.outcome is ExecOutcome.EXITED:
            fs_probe = await self._probe(handle, FS_ARGV, attempts=1)
            fs = parse_fs(fs_probe[1]) if fs_probe[0] is not None else None
            why = explain_fs(fs) if fs else None
        if why is None:
            return result
        outcome, detail = why
        if outcome is ExecOutcome.PIDS_EXHAUSTED:
            detail += await self._stop_everything(handle)
        return replace(result, outcome=outcome, detail=detail)

    async def _stop_everything(self, handle: str) -> str:
        """A fork bomb fills the process table, so the usual kill by tag (a
        new exec that forks) may not even start: signal every process of the
        sandbox from one fork-free shell, retried until one gets a slot."""
        for session in self._sessions.pop(handle, {}).values():
            await session.close()
        if (await self._probe(handle, KILL_ALL_ARGV, attempts=20))[0] is not None:
            return "; every process in the sandbox was killed (sessions restart)"
        return "; its processes could not be stopped"

    async def _probe(self, handle: str, argv: builtins.list[str], attempts: int) -> tuple[int | None, str]:
        """(exit status, stdout) of ``argv`` run as is (no wrapper) in the
        sandbox; (None, why) when it did not start ``attempts`` times in a row."""
        why = ""
        for attempt in range(attempts):
            try:
                stream = await ExecStream.open(self._client, self._ns, handle, CONTAINER, argv, stdin=False)
            except KubeError as e:
                why = str(e)
                if e.status == 0:
                    break  # the API server does not answer: no point in retrying now
                if attempt + 1 < attempts:
                    # A full process table frees a slot between forks.
                    await asyncio.sleep(min(0.05 * 2**attempt, 1.0))
                continue
            out = bytearray()
            try:
                while isinstance(frame := await stream.next_frame(10.0), tuple):
                    if frame[0] == 1 and len(out) < 65536:
                        out += frame[1]
            finally:
                await stream.close()
            code = stream.exit_code
            return (-1 if code is None else code), out.decode(errors="replace")
        return None, why

    async def _exec(self, handle: str, spec: ExecSpec) -> AsyncIterator[ExecEvent]:
        try:
            if not spec.session:
                async for event in run_oneshot(self._target(handle), spec):
                    yield event
                return
            try:
                session = await self._session(handle, spec.session)
            except KubeError as e:
                pod = self.cache.get(handle)
                if pod is not None and pod.running and unreachable(e):
                    raise unavailable(e, "the session did not start") from e
                raise
            async for event in session.run(spec):
                yield event
        except (NotFound, SandboxLost, KubeError) as e:
            gone = self.cache.get(handle) is None
            yield ExecResult(ExecOutcome.SANDBOX_LOST, -1, 0.0, detail=str(e), sandbox_gone=gone)

    async def _session(self, handle: str, name: str) -> ShellSession:
        lock = self._session_locks.setdefault(handle, asyncio.Lock())
        async with lock:
            sessions = self._sessions.setdefault(handle, {})
            session = sessions.get(name)
            if session is None or session.dead:
                session = ShellSession(self._target(handle), {})
                await session.start()
                sessions[name] = session
            return session

    async def usage(self, handle: str) -> SandboxUsage:
        if self.cache.get(handle) is None:
            raise SandboxLost("the sandbox's Pod is gone")
        out = bytearray()
        try:
            stream = await ExecStream.open(
                self._client, self._ns, handle, CONTAINER, ["sh", "-c", _USAGE], stdin=False
            )
            try:
                while isinstance(frame := await stream.next_frame(10.0), tuple):
                    if frame[0] == 1:
                        out += frame[1]
            finally:
                await stream.close()
        except KubeError:
            return SandboxUsage()
        values: dict[str, list[int]] = {}
        for line in out.decode(errors="replace").splitlines():
            key, *nums = line.split()
            with contextlib.suppress(ValueError):
                values[key] = [int(n) for n in nums]

        def first(key: str, i: int = 0) -> int:
            v = values.get(key) or []
            return v[i] if len(v) > i else 0

        return SandboxUsage(
            memory_bytes=first("mem"),
            memory_peak_bytes=first("peak"),
            pids=first("pids"),
            disk_bytes=first("disk"),
            disk_total_bytes=first("disk", 1),
            files=first("files"),
            files_total=first("files", 1),
            cpu_seconds=first("cpu") / 1e6,
        )

    async def _open(self, handle: str, argv: builtins.list[str], stdin: bool) -> ExecStream:
        if self.cache.get(handle) is None:
            raise SandboxLost("the sandbox's Pod is gone")
        try:
            return await ExecStream.open(self._client, self._ns, handle, CONTAINER, argv, stdin=stdin)
        except KubeError as e:
            if unreachable(e):
                raise unavailable(e, "nothing was transferred") from e
            raise SandboxLost(f"cannot exec into Pod {handle}: {e}") from e

    async def put_tar(self, handle: str, dest: str, chunks: AsyncIterator[bytes]) -> None:
        stream = await self._open(handle, put_tar_argv(dest), stdin=True)
        stderr = bytearray()
        try:
            if stream.protocol != V5:
                raise PermanentBackendError(
                    "file upload needs the v5.channel.k8s.io exec protocol (Kubernetes >= 1.30)"
                )

            async def drain() -> None:
                while isinstance(frame := await stream.next_frame(None), tuple):
                    if frame[0] == 2 and len(stderr) < 8192:
                        stderr.extend(frame[1])

            reader = asyncio.create_task(drain())
            try:
                async for chunk in chunks:
                    await stream.write(chunk)
                await stream.close_stdin()
                await reader
            except (ConnectionError, OSError) as e:
                raise SandboxLost(f"upload stream cut: {e}") from e
            finally:
                reader.cancel()
        finally:
            await stream.close()
        code = stream.exit_code
        message = stderr.decode(errors="replace").strip()
        if code == 28:
            raise ResourceExhausted(f"workspace is full (bytes or files): {message}")
        if code == 3:
            raise InvalidArgument("path", f"cannot create directory {dest!r}: {message}")
        if code is None:
            raise SandboxLost(f"upload ended without an exit status: {stream.failure or message}")
        if code != 0:
            raise InvalidArgument("tar", f"extraction failed: {message or f'exit {code}'}")

    async def get_tar(self, handle: str, base: str, paths: tuple[str, ...]) -> AsyncIterator[bytes]:
        stream = await self._open(handle, get_tar_argv(base, paths), stdin=False)
        stderr = bytearray()
        try:
            while isinstance(frame := await stream.next_frame(None), tuple):
                if frame[0] == 1:
                    yield frame[1]
                elif len(stderr) < 8192:
                    stderr.extend(frame[1])
        finally:
            await stream.close()
        code = stream.exit_code
        message = stderr.decode(errors="replace").strip()
        if code == 3:
            missing = message.split("missing:", 1)[-1].splitlines()[0] if "missing:" in message else base
            raise NotFound(f"no such file or directory in the sandbox: {missing}")
        if code != 0:
            raise BackendError(f"reading files failed: {message or stream.failure or f'exit {code}'}")


# How the runtime answers an exec into a container whose process limit is full.
_NO_PROCESS_SLOT = "resource temporarily unavailable"


def _failed(result: ExecResult) -> bool:
    """A result a limit may explain (a command that ran and failed, or was cut off)."""
    if result.outcome is ExecOutcome.EXITED:
        return result.exit_code != 0
    return result.outcome in (ExecOutcome.TIMED_OUT, ExecOutcome.SANDBOX_LOST)


def _tolerated(taint: dict[str, Any], toleration: Any) -> bool:
    key, op = toleration.get("key", ""), toleration.get("operator", "Equal")
    if key and key != taint.get("key"):
        return False
    if toleration.get("effect") and toleration.get("effect") != taint.get("effect"):
        return False
    return bool(op == "Exists" or toleration.get("value", "") == taint.get("value", ""))


__all__ = ["KubernetesBackend", "KubernetesOptions"]
