"""A watch-fed cache of this control plane's Pods, instead of polling.

One list, then one long watch per namespace (resumed from the last
resourceVersion; a 410 Gone or a cut stream relists). It keeps a small summary
per Pod, not the Pod itself, so 10,000 tracked Pods cost a few MB. Callers
wait for a Pod to reach a condition (Running and Ready, gone) through
futures the watch resolves: no per-Pod polling, no per-Pod task.

It also indexes the Pods the scheduler could not place (PodScheduled False,
reason Unschedulable), so SchedulingPressure is a dict lookup, not a scan.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from sandboxd.backends.base import ExecOutcome, ExecResult
from sandboxd.backends.kubernetes.client import Json, KubeClient, KubeError
from sandboxd.backends.kubernetes.podspec import parse_quantity

log = logging.getLogger(__name__)

# Waiting reasons that will not fix themselves: the create fails at once.
PERMANENT_WAITING = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
    }
)


@dataclass
class PodInfo:
    """What the cache keeps of a Pod: enough to tell whether it serves, and if not, why."""

    name: str
    uid: str
    phase: str
    ready: bool
    deleting: bool
    labels: dict[str, str]
    annotations: dict[str, str]
    node: str = ""
    problem: str = ""
    """Why the Pod cannot start (image pull error, unschedulable), or ''."""
    permanent: bool = False
    """``problem`` will not go away by waiting."""
    terminated_reason: str = ""
    last_terminated_reason: str = ""
    """Why the container's previous run ended (e.g. OOMKilled), or ''."""
    evicted_for_disk: str = ""
    """The kubelet's message when it evicted the Pod for its ephemeral
    storage (its writable layer, logs and disk-backed volumes), or ''."""
    unschedulable: bool = False
    """The scheduler found no node for it (PodScheduled False, reason Unschedulable)."""
    schedule_message: str = ""
    """The scheduler's message when ``unschedulable`` ("0/4 nodes are available: ...")."""
    created: str = ""
    """metadata.creationTimestamp (RFC 3339, UTC: sorts as time)."""
    memory_limit: int = 0
    memory_request: int = 0
    cpu_limit_millis: int = 0
    cpu_request_millis: int = 0
    """The containers' resources summed, as a ResourceQuota counts them."""
    address: str = ""
    """status.podIP ("" before the Pod has one)."""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def running(self) -> bool:
        """Whether it is Running and not being deleted (a deleting Pod counts as gone)."""
        return self.phase == "Running" and not self.deleting

    @property
    def serving(self) -> bool:
        """Whether it is running and Ready."""
        return self.running and self.ready

    @property
    def waiting_for_node(self) -> bool:
        """Pending, not being deleted, and the scheduler could not place it."""
        return self.unschedulable and self.phase == "Pending" and not self.deleting

    @property
    def counted_by_quota(self) -> bool:
        """Whether a ResourceQuota counts it (every Pod not yet Failed or Succeeded)."""
        return self.phase not in ("Failed", "Succeeded")


def _quantity(value: Any) -> float:
    try:
        return parse_quantity(str(value))
    except ValueError:
        return 0.0


def _resources(spec: Mapping[str, Any]) -> tuple[int, int, int, int]:
    """(memory limit, memory request, CPU limit, CPU request in millicores)
    of a Pod's containers, summed; a request left out defaults to the limit,
    as the API server's defaulting does."""
    mem_l = mem_r = cpu_l = cpu_r = 0.0
    for c in spec.get("containers") or []:
        res = c.get("resources") or {}
        lim, req = res.get("limits") or {}, res.get("requests") or {}
        mem_l += _quantity(lim.get("memory", 0))
        mem_r += _quantity(req.get("memory", lim.get("memory", 0)))
        cpu_l += _quantity(lim.get("cpu", 0))
        cpu_r += _quantity(req.get("cpu", lim.get("cpu", 0)))
    return int(mem_l), int(mem_r), int(cpu_l * 1000), int(cpu_r * 1000)


def disk_eviction(pod: PodInfo | None, result: ExecResult) -> ExecResult | None:
    """``result`` as DISK_FULL (the sandbox gone) when the kubelet evicted
    the Pod for its storage (a writable root's or the workspace's writes
    past their limit); None otherwise."""
    if pod is None or not pod.evicted_for_disk:
        return None
    detail = f"the sandbox's disk writes passed its limit and the kubelet evicted it ({pod.evicted_for_disk})"
    return replace(result, outcome=ExecOutcome.DISK_FULL, detail=detail, sandbox_gone=True)


def _kept(key: str, keep: tuple[str, ...]) -> bool:
    # A kept name ending in "/" keeps every annotation under that prefix.
    return key in keep or any(k.endswith("/") and key.startswith(k) for k in keep)


def summarize(pod: Json, keep_annotations: tuple[str, ...] = ()) -> PodInfo:
    """A Pod's summary, only ``keep_annotations`` kept (one ending in "/":
    every annotation under that prefix); a start problem waiting cannot fix
    is permanent."""
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    ready = (conditions.get("Ready") or {}).get("status") == "True"
    problem, permanent, terminated, last_terminated = "", False, "", ""
    for cs in status.get("containerStatuses") or []:
        state = cs.get("state") or {}
        waiting = state.get("waiting")
        if waiting and waiting.get("reason") in PERMANENT_WAITING:
            problem = f"{waiting.get('reason')}: {waiting.get('message', '')}".strip(": ")
            permanent = True
        term = state.get("terminated")
        if term:
            terminated = str(term.get("reason") or f"exit {term.get('exitCode')}")
        last = (cs.get("lastState") or {}).get("terminated")
        if last:
            last_terminated = str(last.get("reason") or f"exit {last.get('exitCode')}")
    sched = conditions.get("PodScheduled") or {}
    unschedulable = sched.get("status") == "False" and sched.get("reason") == "Unschedulable"
    # Many Pods carry the same message: keep one copy of it.
    schedule_message = sys.intern(str(sched.get("message") or "")) if unschedulable else ""
    if not problem and unschedulable:
        problem = f"Unschedulable: {schedule_message}"
    if status.get("phase") == "Failed" and not problem:
        problem, permanent = f"Pod failed: {status.get('reason') or terminated or 'unknown'}", True
    evicted_for_disk = ""
    message = str(status.get("message") or "")
    # The kubelet's words for a container's, a Pod's or an emptyDir's storage past its limit.
    if status.get("reason") == "Evicted" and ("ephemeral" in message.lower() or "EmptyDir" in message):
        evicted_for_disk = message
    annotations = meta.get("annotations") or {}
    spec = pod.get("spec") or {}
    mem_l, mem_r, cpu_l, cpu_r = _resources(spec)
    return PodInfo(
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        phase=str(status.get("phase") or "Pending"),
        ready=ready,
        deleting=bool(meta.get("deletionTimestamp")),
        labels=dict(meta.get("labels") or {}),
        annotations={k: v for k, v in annotations.items() if _kept(k, keep_annotations)},
        node=str(spec.get("nodeName") or ""),
        problem=problem,
        permanent=permanent,
        terminated_reason=terminated,
        last_terminated_reason=last_terminated,
        evicted_for_disk=evicted_for_disk,
        unschedulable=unschedulable,
        schedule_message=schedule_message,
        created=str(meta.get("creationTimestamp") or ""),
        memory_limit=mem_l,
        memory_request=mem_r,
        cpu_limit_millis=cpu_l,
        cpu_request_millis=cpu_r,
        address=str(status.get("podIP") or ""),
    )


Predicate = Callable[[PodInfo | None], bool]


class PodCache:
    """This control plane's Pods in one namespace, kept current by one list and a resumed watch."""

    def __init__(
        self,
        client: KubeClient,
        namespace: str,
        label_selector: str,
        keep_annotations: tuple[str, ...] = (),
        on_change: Callable[[str, PodInfo | None], None] | None = None,
    ) -> None:
        """``on_change(name, pod or None)`` is called with every change the
        list or watch brings, in the API server's order, before any waiter
        of that Pod is woken."""
        self._client = client
        self._path = f"/api/v1/namespaces/{namespace}/pods"
        self._selector = label_selector
        self._keep = keep_annotations
        self._on_change = on_change
        self.pods: dict[str, PodInfo] = {}
        self._unplaced: dict[str, PodInfo] = {}
        self._at: dict[str, str] = {}
        self._waiters: dict[str, list[tuple[Predicate, asyncio.Future[PodInfo | None]]]] = {}
        self._rv = ""
        self._task: asyncio.Task[None] | None = None
        self.synced = asyncio.Event()
        self.relists = 0

    async def start(self) -> None:
        """Lists the Pods, then watches from there; returns with the list in. Again, it does nothing."""
        if self._task is None:
            await self._list()
            self._task = asyncio.create_task(self._run(), name=f"pod-watch {self._path}")

    async def stop(self) -> None:
        """Ends the watch and cancels every wait still pending."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for waiters in self._waiters.values():
            for _, fut in waiters:
                if not fut.done():
                    fut.cancel()
        self._waiters.clear()

    def unschedulable(self) -> tuple[int, str]:
        """(Pods the scheduler could not place, its message for the oldest);
        (0, "") when none. From the cache alone."""
        if not self._unplaced:
            return 0, ""
        oldest = min(self._unplaced.values(), key=lambda p: (p.created, p.name))
        return len(self._unplaced), oldest.schedule_message

    def at(self, address: str) -> PodInfo | None:
        """The Pod of this cache that has ``address`` now (not one being
        deleted: its address may already be another's), or None."""
        info = self.pods.get(self._at.get(address, ""))
        return info if info is not None and info.address == address and not info.deleting else None

    def get(self, name: str) -> PodInfo | None:
        """The Pod as last seen, or None when the cache holds no such Pod; never asks the API server."""
        return self.pods.get(name)

    async def wait(self, name: str, predicate: Predicate, timeout: float) -> PodInfo | None:
        """Waits until ``predicate(pod or None)`` holds; returns the Pod (None
        once it is gone). Raises TimeoutError."""
        current = self.pods.get(name)
        if predicate(current):
            return current
        fut: asyncio.Future[PodInfo | None] = asyncio.get_running_loop().create_future()
        entry = (predicate, fut)
        self._waiters.setdefault(name, []).append(entry)
        try:
            return await asyncio.wait_for(fut, timeout)
        finally:
            waiters = self._waiters.get(name)
            if waiters is not None:
                with contextlib.suppress(ValueError):
                    waiters.remove(entry)
                if not waiters:
                    del self._waiters[name]

    def _set(self, name: str, info: PodInfo | None) -> None:
        old = self.pods.pop(name, None) if info is None else self.pods.get(name)
        if old is not None and old.address and self._at.get(old.address) == name:
            del self._at[old.address]
        if info is not None:
            self.pods[name] = info
            if info.address:
                self._at[info.address] = name
        if info is not None and info.waiting_for_node:
            self._unplaced[name] = info
        else:
            self._unplaced.pop(name, None)
        if self._on_change is not None:
            self._on_change(name, info)
        for predicate, fut in list(self._waiters.get(name, ())):
            if not fut.done() and predicate(info):
                fut.set_result(info)

    async def _list(self) -> None:
        body = await self._client.request("GET", self._path, query={"labelSelector": self._selector})
        seen: set[str] = set()
        for pod in body.get("items") or []:
            info = summarize(pod, self._keep)
            seen.add(info.name)
            self._set(info.name, info)
        for name in [n for n in self.pods if n not in seen]:
            self._set(name, None)
        self._rv = str((body.get("metadata") or {}).get("resourceVersion") or "")
        self.relists += 1
        self.synced.set()

    async def _run(self) -> None:
        backoff = 0.2
        while True:
            try:
                query = {
                    "labelSelector": self._selector,
                    "resourceVersion": self._rv,
                    "timeoutSeconds": str(random.randint(240, 360)),
                }
                applied = 0
                async for event in self._client.watch(self._path, query):
                    backoff = 0.2
                    self._apply(event)
                    applied += 1
                    if applied % 32 == 0:
                        # A burst of buffered events (a pool warming up) must
                        # not hold the event loop: let acquires run between.
                        await asyncio.sleep(0)
            except asyncio.CancelledError:
                raise
            except KubeError as e:
                if e.status != 410:
                    log.warning("pod watch interrupted (%s); relisting in %.1fs", e, backoff)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 10.0)
                with contextlib.suppress(KubeError):
                    await self._list()
            except Exception:
                log.exception("pod watch failed; relisting")
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)
                with contextlib.suppress(KubeError):
                    await self._list()

    def _apply(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        obj = event.get("object") or {}
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if rv:
            self._rv = str(rv)
        if kind == "BOOKMARK":
            return
        name = str((obj.get("metadata") or {}).get("name", ""))
        if kind == "DELETED":
            self._set(name, None)
        elif kind in ("ADDED", "MODIFIED"):
            self._set(name, summarize(obj, self._keep))
