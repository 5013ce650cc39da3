"""Images pulled onto nodes ahead of the sandboxes that will need them: a
short-lived Pod of the image bound to a node that does not list it yet
(``nodeName``: no scheduling, no sandbox capacity taken beyond a sliver).
Its kubelet pulls the image to start it; once the container has started or
ended (the pull is done either way: an image without ``true`` fails after
its pull), or the Pod failed, it is deleted. Pre-pull Pods carry labels of
their own, not a sandbox's: the pools, adoption and the orphan sweep never
see them. Those a previous run left are deleted at the first pre-pull.

A node busy pulling is not free: one with ``per_node`` pre-pulls in flight
gets no more until one ends (its disk and network are taken), and the nodes
with the fewest in flight are chosen first, so an announcement of many
images spreads its pulls instead of queueing them behind one kubelet."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from sandboxd.backends.kubernetes.client import KubeClient, KubeError, wrap
from sandboxd.backends.kubernetes.podspec import PodOptions, label_value, pull_secrets_of
from sandboxd.errors import BackendError

log = logging.getLogger(__name__)

LABEL_PREPULL = "sandboxd.prepull"
"""The instance a pre-pull Pod belongs to."""
POLL_SECONDS = 2.0
"""How often pre-pull Pods in flight are looked at."""
DEADLINE_SECONDS = 1800
"""A pre-pull Pod that has not pulled by then is ended by Kubernetes (activeDeadlineSeconds)."""
PER_NODE = 2
"""Pre-pulls one node runs at once, by default (backend.prepulls_per_node)."""
_UID = 65534


def prepull_pod(
    image: str, node: str, opts: PodOptions, pull_secrets: tuple[str, ...] = ()
) -> dict[str, Any]:
    """The pre-pull Pod of ``image`` on ``node``: ``true`` as nobody, read-only,
    no privileges, pulling with the backend's and ``pull_secrets``."""
    digest = hashlib.sha256(f"{image}\0{node}".encode()).hexdigest()[:12]
    spec: dict[str, Any] = {
        "nodeName": node,
        "restartPolicy": "Never",
        "activeDeadlineSeconds": DEADLINE_SECONDS,
        "terminationGracePeriodSeconds": 0,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        # What the namespace's "restricted" Pod Security level asks of every Pod.
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": _UID,
            "runAsGroup": _UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [
            {
                "name": "pull",
                "image": image,
                "imagePullPolicy": "IfNotPresent",
                "command": ["true"],
                "resources": {
                    "requests": {"cpu": "10m", "memory": "16Mi"},
                    "limits": {"cpu": "10m", "memory": "16Mi"},
                },
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "readOnlyRootFilesystem": True,
                    "capabilities": {"drop": ["ALL"]},
                },
            }
        ],
    }
    secrets = pull_secrets_of(opts, pull_secrets)
    if secrets:
        spec["imagePullSecrets"] = secrets
    if opts.tolerations:
        spec["tolerations"] = [dict(t) for t in opts.tolerations]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"sandboxd-prepull-{digest}",
            "namespace": opts.namespace,
            "labels": {LABEL_PREPULL: label_value(opts.instance)},
            "annotations": {"sandboxd.prepull/image": image},
        },
        "spec": spec,
    }


def pulled(pod: dict[str, Any]) -> bool:
    """Whether the Pod is done with: its container started or ended (the
    image is on the node), or the Pod itself ended."""
    status = pod.get("status") or {}
    if status.get("phase") in ("Succeeded", "Failed", "Running"):
        return True
    for container in status.get("containerStatuses") or []:
        state = container.get("state") or {}
        if "running" in state or "terminated" in state:
            return True
    return False


class PrePulls:
    """Pre-pull Pods of one instance in one namespace."""

    def __init__(
        self,
        client: KubeClient,
        opts: PodOptions,
        nodes: Callable[[], Awaitable[list[dict[str, Any]] | None]],
        holding: Callable[[str], Awaitable[list[str]]],
        per_node: int = PER_NODE,
    ) -> None:
        self._client = client
        self._per_node = per_node
        self._opts = opts
        self._nodes = nodes
        self._holding = holding
        self._path = f"/api/v1/namespaces/{opts.namespace}/pods"
        self._selector = f"{LABEL_PREPULL}={label_value(opts.instance)}"
        self._swept = False
        self._reaper: asyncio.Task[None] | None = None

    async def prefetch(self, image: str, copies: int, pull_secrets: tuple[str, ...] = ()) -> int:
        """Starts pulls of ``image`` onto up to ``copies`` schedulable nodes
        that do not list it (and have no pre-pull of it running), those least
        busy pulling first, none already running ``per_node`` pre-pulls;
        returns how many. BackendError when the cluster refuses."""
        if not self._swept:
            self._swept = True
            await self._delete_where(lambda _: True)
        nodes = await self._nodes() or []
        holding = set(await self._holding(image))
        busy = Counter(
            str((p.get("spec") or {}).get("nodeName", "")) for p in await self._list() if not pulled(p)
        )
        names = sorted(
            (str(n["metadata"]["name"]) for n in nodes if n["metadata"]["name"] not in holding),
            key=lambda name: (busy[name], name),
        )
        started = 0
        for node in names:
            if started >= copies:
                break
            if busy[node] >= self._per_node:
                continue
            try:
                await self._client.request(
                    "POST", self._path, body=prepull_pod(image, node, self._opts, pull_secrets)
                )
            except KubeError as e:
                if e.status == 409:  # one is pulling it there already
                    continue
                raise wrap(e, f"cannot start a pre-pull of {image} on {node}") from e
            started += 1
            busy[node] += 1
        if started and (self._reaper is None or self._reaper.done()):
            self._reaper = asyncio.create_task(self._reap(), name="prepull-reaper")
        return started

    async def _list(self) -> list[dict[str, Any]]:
        try:
            body = await self._client.request("GET", self._path, query={"labelSelector": self._selector})
        except KubeError as e:
            raise wrap(e, "cannot list pre-pull Pods") from e
        return list(body.get("items") or [])

    async def _delete_where(self, done: Callable[[dict[str, Any]], bool]) -> int:
        """Deletes the pre-pull Pods ``done`` picks; returns how many are left."""
        left = 0
        for pod in await self._list():
            if not done(pod):
                left += 1
                continue
            name = pod["metadata"]["name"]
            try:
                await self._client.request(
                    "DELETE", f"{self._path}/{name}", body={"gracePeriodSeconds": 0}, timeout=10
                )
            except KubeError as e:
                if e.status != 404:
                    raise wrap(e, f"cannot delete pre-pull Pod {name}") from e
        return left

    async def _reap(self) -> None:
        while True:
            await asyncio.sleep(POLL_SECONDS)
            try:
                if await self._delete_where(pulled) == 0:
                    return
            except BackendError as e:
                log.warning("pre-pull Pods: %s", e)

    async def close(self) -> None:
        """Stops looking after pre-pull Pods (the next run's first pre-pull deletes what is left)."""
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
