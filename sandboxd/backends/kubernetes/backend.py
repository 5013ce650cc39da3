"""Sandboxes as Pods through the Kubernetes API server: the backend port.

Where a sandbox runs (its Pod: create, delete, list for adoption, resize, the
nodes' capacity and host facts, hostcap.py) is pods.py; files in and out are
files.py; usage is usage.py. Pods the scheduler could not place are counted
by the watch cache (cache.py: SchedulingPressure). This module composes them
with what runs inside: one-shot commands and named sessions over the API
server's exec stream (execs, wsexec), and the limit a failed command hit
(limits.py). The pool and lease ledger (ledger.py) and tenant
ResourceQuotas (quotas.py) ride along.

The handle of a sandbox is its Pod's name.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
from collections.abc import AsyncIterator, Coroutine
from dataclasses import replace
from typing import Any

from sandboxd.backends.background import Background
from sandboxd.backends.base import (
    GVISOR,
    RUNC,
    BackendSandbox,
    ExecEvent,
    ExecOutcome,
    ExecResult,
    ExecSpec,
    HostFacts,
    Limits,
    OutputChunk,
    SandboxSpec,
    SandboxUsage,
)
from sandboxd.backends.gvisor_pids import KILL_ALL, RESCUE_SESSION, STDERR_KEPT, refused_fork
from sandboxd.backends.kubernetes.cache import PodCache, PodInfo, disk_eviction
from sandboxd.backends.kubernetes.client import (
    KubeClient,
    KubeError,
    load_configuration,
    unavailable,
    unreachable,
)
from sandboxd.backends.kubernetes.egress import ACK_PREFIX, KubeEgress, egress_pod
from sandboxd.backends.kubernetes.execs import PodExec, run_oneshot
from sandboxd.backends.kubernetes.files import PodFiles
from sandboxd.backends.kubernetes.ledger import KubeLedger, pools_configmap
from sandboxd.backends.kubernetes.limits import (
    COUNTERS_ARGV,
    FS_ARGV,
    KILL_ALL_ARGV,
    Counters,
    explain_counters,
    explain_filesystems,
    no_process_slot,
    parse_counters,
    parse_filesystems,
)
from sandboxd.backends.kubernetes.model_gateway import KubeGateway, KubeModelRoutes
from sandboxd.backends.kubernetes.narrowing import KubeEgressNarrowing, KubeNarrowing
from sandboxd.backends.kubernetes.pods import KubernetesOptions, Pods
from sandboxd.backends.kubernetes.podspec import (
    ANNOTATION_LABELS,
    ANNOTATION_POOL,
    ANNOTATION_RUNTIME,
    CONTAINER,
    selector,
)
from sandboxd.backends.kubernetes.quotas import TenantQuotaManager
from sandboxd.backends.kubernetes.records import KubeRecords
from sandboxd.backends.kubernetes.recycling import KubeRecycling
from sandboxd.backends.kubernetes.usage import read_usage
from sandboxd.backends.kubernetes.wsexec import ExecStream
from sandboxd.backends.session import SessionClosed, ShellSession
from sandboxd.errors import BackendError, FailedPrecondition, NotFound, SandboxLost, TransientBackendError

log = logging.getLogger(__name__)


class KubernetesBackend(KubeRecycling, KubeModelRoutes, KubeRecords, KubeEgressNarrowing):
    """The backend port on one namespace: Pods, files and usage composed with
    the one-shots and sessions that run over the API server's exec stream."""

    def __init__(self, options: KubernetesOptions, client: KubeClient | None = None) -> None:
        self._options = options
        self._ns = options.namespace
        self._client = client or KubeClient(
            load_configuration(options.kubeconfig, options.context), threads=options.threads
        )
        self.cache = PodCache(
            self._client,
            self._ns,
            selector(options.instance),
            (ANNOTATION_POOL, ANNOTATION_LABELS, ANNOTATION_RUNTIME, ACK_PREFIX),
        )
        self.quotas = TenantQuotaManager(self._client, self._ns)
        self.ledger = KubeLedger(self._client, self._ns, options.instance, selector(options.instance))
        self._pods = Pods(self._client, self.cache, self.quotas, options)
        self._egress = KubeEgress(self._client, options, pools_configmap(options.instance))
        self._narrowing = KubeNarrowing(self._client, self.cache, self._ns, self._egress)
        self._model_gateway = None
        self._gateway = (
            KubeGateway(self._client, self.cache, options.model_gateway, self._pods.sandbox_of)
            if options.model_gateway is not None
            else None
        )
        self._files = PodFiles(self._client, self.cache, self._ns)
        self._sessions: dict[str, dict[str, ShellSession]] = {}
        self._session_locks: dict[str, asyncio.Lock] = {}
        self._background = Background()
        # Limit counters (limits.py) last read per sandbox; None = unreadable.
        self._counters: dict[str, Counters | None] = {}

    @property
    def client(self) -> KubeClient:
        return self._client

    # -- Deployment ---------------------------------------------------------

    async def ping(self) -> None:
        await self._pods.ping()

    async def image_exists(self, image: str) -> bool:
        return await self._pods.image_exists(image)

    async def runtimes(self) -> frozenset[str]:
        """RUNC, and GVISOR when the gVisor RuntimeClass exists (a 403 counts
        as present: a least-privilege account may not read RuntimeClasses)."""
        name = self._options.pod_options().gvisor_runtime_class
        if not name:
            return frozenset({RUNC})
        try:
            await self._client.request("GET", f"/apis/node.k8s.io/v1/runtimeclasses/{name}")
        except KubeError as e:
            if e.status == 404:
                return frozenset({RUNC})
            if e.status != 403:
                raise
        return frozenset({RUNC, GVISOR})

    async def create(self, spec: SandboxSpec) -> str:
        check = self._health_check if self._options.exec_health_check else None
        gateway = await self.model_target() if spec.model_gateway else None
        if spec.model_gateway and gateway is None:
            raise FailedPrecondition(self.model_route_refusal(spec.runtime) or "no model gateway")
        spec, proxy_ip = await self._egress.prepare(spec, gateway)
        handle = await self._pods.create(spec, check, shape=lambda body: egress_pod(body, spec, proxy_ip))
        if spec.runtime == GVISOR:
            try:
                await self._rescue(handle)
            except BaseException:
                await self.destroy(handle)
                raise
        return handle

    async def _rescue(self, handle: str) -> ShellSession:
        """The gVisor sandbox's rescue session (gvisor_pids), started before
        any command can fill its process slots."""
        try:
            return await self._session(handle, RESCUE_SESSION)
        except KubeError as e:
            raise unavailable(e, "the sandbox's rescue session did not start") from e

    async def _health_check(self, name: str) -> None:
        # The limit counters' baseline doubles as the check that commands run
        # (grep: 0 = found, 1 = none, 2 = some counter file missing).
        probe = await self._probe(name, COUNTERS_ARGV, attempts=1)
        if probe[0] in (0, 1, 2):
            self._counters[name] = parse_counters(probe[1])
            return
        check = ExecSpec(shell="true", timeout=30)
        async for event in run_oneshot(self._transport(name), check, self._spawn):
            if isinstance(event, ExecResult) and (event.outcome is not ExecOutcome.EXITED or event.exit_code):
                raise TransientBackendError(f"health check failed: {event.detail or event.outcome.name}")

    async def destroy(self, handle: str) -> None:
        self._counters.pop(handle, None)
        sessions = list(self._sessions.pop(handle, {}).values())
        self._session_locks.pop(handle, None)
        for session in sessions:
            await session.close()
        await self._pods.delete(handle)

    async def list(self) -> builtins.list[BackendSandbox]:
        found = await self._pods.list()
        await self._egress.sweep(self.ledger.load_pool_specs)
        try:
            # Adopted sandboxes with the model route call it before any create.
            await self.model_target()
        except (BackendError, FailedPrecondition) as e:
            log.warning("the model gateway did not start (tried again with the next listing): %s", e)
        return found

    def network_refusal(self, runtime: str) -> str | None:
        return self._egress.refusal(runtime)

    async def root_refusal(self, runtime: str) -> str | None:
        """None: a writable root is the container's layer on the node, which
        the Pod's ephemeral-storage limit bounds (podspec.build_pod)."""
        return None

    def sandbox_user(self, handle: str) -> tuple[int, int]:
        """From memory: filled by create and by every listing (adoption)."""
        user = self._pods.known_user(handle)
        if user is None:
            raise NotFound(f"sandbox Pod {handle} is not known to this control plane")
        return user

    async def alive(self, handles: builtins.list[str]) -> set[str]:
        return await self._pods.alive(handles)

    async def capacity(self) -> tuple[int, int]:
        return await self._pods.capacity()

    async def prefetch_image(self, image: str, copies: int, pull_secrets: tuple[str, ...] = ()) -> int:
        """Pre-pull Pods of ``image`` on up to ``copies`` nodes lacking it (prepull.py)."""
        await self._pods.ensure_started()
        return await self._pods.prepulls.prefetch(image, copies, pull_secrets)

    def pulls_with_pool_secrets(self) -> bool:
        """A pool's image_pull_secrets go on its Pods and its pre-pulls (PoolPullSecrets)."""
        return True

    # -- HostCapacity and SchedulingPressure (hostcap.py, cache.py) --------

    async def host_facts(self) -> HostFacts:
        return await self._pods.host_facts()

    def unschedulable(self) -> tuple[int, str]:
        """This instance's Pods the scheduler could not place yet, from the watch cache."""
        return self.cache.unschedulable()

    async def update_limits(self, handle: str, limits: Limits) -> None:
        await self._pods.update_limits(handle, limits)

    async def close(self) -> None:
        await self._background.close()
        for sessions in self._sessions.values():
            for session in sessions.values():
                await session.close()
        self._sessions.clear()
        if self._gateway is not None:
            await self._gateway.close()
        await self._pods.close()
        await self.cache.stop()
        await self._client.close()

    # -- Runtime ------------------------------------------------------------

    def _transport(self, handle: str) -> PodExec:
        """A fresh exec stream into the sandbox's Pod, for one session or command."""
        return PodExec(self._client, self.cache, self._ns, handle, CONTAINER)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        self._background.spawn(coro)

    async def exec(self, handle: str, spec: ExecSpec) -> AsyncIterator[ExecEvent]:
        gvisor = self._gvisor(handle)
        rescue = self._sessions.get(handle, {}).get(RESCUE_SESSION)
        if gvisor and (rescue is None or rescue.dead):
            # Adopted, or its shell ended: best effort, the command runs either way.
            try:
                await self._rescue(handle)
            except BackendError as e:
                log.warning("sandbox %s: no rescue session: %s", handle, e)
        elif handle not in self._counters and not gvisor:  # adopted, or created without a health check
            probe = await self._probe(handle, COUNTERS_ARGV, attempts=1)
            if probe[0] is not None:  # else: read again before the next command
                self._counters[handle] = parse_counters(probe[1])
        stderr = b""
        async for event in self._exec(handle, spec):
            if gvisor and isinstance(event, OutputChunk) and event.stream == 2:
                stderr = (stderr + event.data)[-STDERR_KEPT:]
            elif isinstance(event, ExecResult) and _failed(event):
                if gvisor:
                    event = await self._explain_gvisor(handle, event, stderr)
                else:
                    event = await self._explain(handle, event)
            yield event

    def _gvisor(self, handle: str) -> bool:
        pod = self.cache.get(handle)
        return pod is not None and pod.annotations.get(ANNOTATION_RUNTIME) == GVISOR

    def _oom_killed(self, handle: str, result: ExecResult, whole: bool) -> ExecResult | None:
        """OOM_KILLED when the sandbox's container ended for memory, else None."""
        pod = self.cache.get(handle)
        ended = (pod.terminated_reason, pod.last_terminated_reason) if pod is not None else ()
        if "OOMKilled" not in ended:
            return None
        if whole:
            detail = "the sandbox hit its memory limit; under gVisor that stops the whole sandbox"
            return replace(result, outcome=ExecOutcome.OOM_KILLED, detail=detail, sandbox_gone=True)
        detail = "the sandbox's main process hit its memory limit and was killed"
        return replace(result, outcome=ExecOutcome.OOM_KILLED, detail=detail)

    async def _evicted_for_disk(self, handle: str, result: ExecResult) -> ExecResult | None:
        """DISK_FULL when the kubelet evicted the lost sandbox's Pod for its
        storage, else None; waits a while for the Pod's end to be seen."""
        if (pod := self.cache.get(handle)) is not None and not _ended(pod):
            with contextlib.suppress(TimeoutError):
                await self.cache.wait(handle, _ended, _ENDED_TIMEOUT)
        return disk_eviction(self.cache.get(handle), result)

    async def _explain_gvisor(self, handle: str, result: ExecResult, stderr: bytes) -> ExecResult:
        """Names the limit a failed command hit in a gVisor Pod. Its cgroup
        counters are gVisor's own view, which counts neither OOM kills nor
        refused forks: hitting the memory limit ends the whole sandbox (its
        container ends OOMKilled; the command's exec reports a code >= 128
        or is cut off), and the process limit is RLIMIT_NPROC, whose refusals
        only the command's stderr shows."""
        died = result.outcome is ExecOutcome.SANDBOX_LOST
        if not died and result.outcome is ExecOutcome.EXITED and result.exit_code >= 128:
            died = not await self._transport(handle).alive()
        if died:
            with contextlib.suppress(TimeoutError):
                await self.cache.wait(handle, _ended, _ENDED_TIMEOUT)
            named = self._oom_killed(handle, result, whole=True)
            if named is not None:
                return named
            return replace(result, outcome=ExecOutcome.SANDBOX_LOST, sandbox_gone=True)
        why: tuple[ExecOutcome, str] | None = None
        if refused_fork(stderr):
            detail = "the sandbox's process limit was reached (fork refused)"
            why = ExecOutcome.PIDS_EXHAUSTED, detail + await self._stop_in_gvisor(handle)
        elif result.outcome is ExecOutcome.EXITED:
            fs_probe = await self._probe(handle, FS_ARGV, attempts=1)
            why = explain_filesystems(parse_filesystems(fs_probe[1])) if fs_probe[0] is not None else None
        if why is None:
            return result
        outcome, detail = why
        return replace(result, outcome=outcome, detail=detail)

    async def _explain(self, handle: str, result: ExecResult) -> ExecResult:
        """Names the limit a failed command hit, if one did (limits.py)."""
        if result.outcome is ExecOutcome.SANDBOX_LOST:
            named = self._oom_killed(handle, result, whole=False)
            if (named := named or await self._evicted_for_disk(handle, result)) is not None:
                return named
        if result.sandbox_gone:
            return result
        before = self._counters.get(handle)
        probe = await self._probe(handle, COUNTERS_ARGV, attempts=8)
        after = parse_counters(probe[1]) if probe[0] is not None else None
        if after is not None:
            self._counters[handle] = after
        if probe[0] is None and no_process_slot(probe[1]):
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
            why = explain_filesystems(parse_filesystems(fs_probe[1])) if fs_probe[0] is not None else None
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

    async def _stop_in_gvisor(self, handle: str) -> str:
        """_stop_everything for a gVisor sandbox, where no exec starts while
        the process slots are full: KILL_ALL in the rescue session."""
        sessions = self._sessions.get(handle, {})
        for name in [n for n in sessions if n != RESCUE_SESSION]:
            await sessions.pop(name).close()
        rescue = sessions.get(RESCUE_SESSION)
        if rescue is None or rescue.dead:
            return "; its processes could not be stopped (no rescue session)"
        with contextlib.suppress(SessionClosed):
            async for event in rescue.run(ExecSpec(shell=KILL_ALL, session=RESCUE_SESSION, timeout=10)):
                if isinstance(event, ExecResult) and event.outcome is ExecOutcome.EXITED:
                    return "; every process the sandbox's commands started was killed (sessions restart)"
        return "; its processes could not be stopped"

    async def _probe(self, handle: str, argv: builtins.list[str], attempts: int) -> tuple[int | None, str]:
        """(exit status, stdout) of ``argv`` run as is (no wrapper) in the
        sandbox; (None, why) when it did not start ``attempts`` times in a row."""
        why = ""
        for attempt in range(attempts):
            if attempt:
                # A full process table frees a slot between forks.
                await asyncio.sleep(min(0.05 * 2 ** (attempt - 1), 1.0))
            try:
                stream = await ExecStream.open(self._client, self._ns, handle, CONTAINER, argv, stdin=False)
            except KubeError as e:
                why = str(e)
                if e.status == 0:
                    break  # the API server does not answer: no point in retrying now
                continue
            out = bytearray()
            try:
                while isinstance(frame := await stream.next_frame(10.0), tuple):
                    if frame[0] == 1 and len(out) < 65536:
                        out += frame[1]
            finally:
                await stream.close()
            code = stream.exit_code
            if code is None and stream.failure:
                # The stream opened but the runtime could not start the
                # process (runc's init died under a full process table).
                why = stream.failure
                continue
            return (-1 if code is None else code), out.decode(errors="replace")
        return None, why

    async def _exec(self, handle: str, spec: ExecSpec) -> AsyncIterator[ExecEvent]:
        try:
            if not spec.session:
                async for event in run_oneshot(self._transport(handle), spec, self._spawn):
                    yield event
                return
            for attempt in range(2):
                try:
                    session = await self._session(handle, spec.session)
                except KubeError as e:
                    pod = self.cache.get(handle)
                    if pod is not None and pod.running and unreachable(e):
                        raise unavailable(e, "the session did not start") from e
                    raise
                try:
                    async for event in session.run(spec):
                        yield event
                    return
                except SessionClosed:
                    # Closed while the command waited for it (a command
                    # abandoned before could not be stopped): a new shell.
                    if attempt:
                        raise
        except (NotFound, SandboxLost, KubeError, SessionClosed) as e:
            gone = self.cache.get(handle) is None
            yield ExecResult(ExecOutcome.SANDBOX_LOST, -1, 0.0, detail=str(e), sandbox_gone=gone)

    async def _session(self, handle: str, name: str) -> ShellSession:
        lock = self._session_locks.setdefault(handle, asyncio.Lock())
        async with lock:
            sessions = self._sessions.setdefault(handle, {})
            session = sessions.get(name)
            if session is None or session.dead:
                session = ShellSession(self._transport(handle), self._spawn)
                await session.start()
                sessions[name] = session
            return session

    async def usage(self, handle: str) -> SandboxUsage:
        usage = await read_usage(self._client, self.cache, self._ns, handle)
        # gVisor does not limit the file count: the workspace's inode total is not a limit.
        return replace(usage, files_total=0) if self._gvisor(handle) else usage

    async def put_tar(self, handle: str, dest: str, chunks: AsyncIterator[bytes]) -> None:
        await self._files.put_tar(handle, dest, chunks)

    def get_tar(self, handle: str, base: str, paths: tuple[str, ...]) -> AsyncIterator[bytes]:
        return self._files.get_tar(handle, base, paths)


# Longest the watch may take to report why a gVisor Pod's container ended.
_ENDED_TIMEOUT = 10.0


def _ended(pod: PodInfo | None) -> bool:
    """Whether the Pod is gone or its container has ended (with a reason)."""
    return pod is None or not pod.running or bool(pod.terminated_reason)


def _failed(result: ExecResult) -> bool:
    """A result a limit may explain (a command that ran and failed, or was cut off)."""
    if result.outcome is ExecOutcome.EXITED:
        return result.exit_code != 0
    return result.outcome in (ExecOutcome.TIMED_OUT, ExecOutcome.SANDBOX_LOST)


__all__ = ["KubernetesBackend", "KubernetesOptions"]
