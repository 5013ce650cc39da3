"""Which nodes already hold an image, from the nodes' ``status.images``
(each kubelet lists what its runtime holds), so a sandbox's Pod prefers a
node that needs no pull; the list is read at most every REFRESH_SECONDS."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from sandboxd.errors import BackendError

log = logging.getLogger(__name__)

REFRESH_SECONDS = 30.0
"""How old the nodes' image lists may be; a node that pulled since is
preferred from the next read (a preference only: the scheduler decides)."""
PREFER_WEIGHT = 50
"""Weight of the preference among the scheduler's scores (1-100)."""


def spellings(image: str) -> set[str]:
    """The names a kubelet may list ``image`` under: as written, with
    Docker Hub's host and ``library/`` added, with ``:latest``."""
    names = {image}
    last = image.rsplit("/", 1)[-1]
    if "@" not in image and ":" not in last:
        names.add(f"{image}:latest")
    first = image.split("/", 1)[0]
    hub = not ("/" in image and ("." in first or ":" in first or first == "localhost"))
    if hub:
        for name in list(names):
            path = name if "/" in name else f"library/{name}"
            names.add(f"docker.io/{path}")
    return names


def nodes_holding(nodes: Iterable[dict[str, Any]], image: str) -> list[str]:
    """Names of the nodes whose ``status.images`` list ``image``, sorted."""
    wanted = spellings(image)
    out = []
    for node in nodes:
        listed = (node.get("status") or {}).get("images") or []
        if any(wanted & set(entry.get("names") or ()) for entry in listed):
            out.append(str((node.get("metadata") or {}).get("name", "")))
    return sorted(n for n in out if n)


def prefer_nodes(names: Iterable[str]) -> dict[str, Any]:
    """A Pod ``affinity`` that prefers (never requires) the nodes ``names``."""
    return {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": PREFER_WEIGHT,
                    "preference": {
                        "matchExpressions": [
                            {"key": "kubernetes.io/hostname", "operator": "In", "values": sorted(names)}
                        ]
                    },
                }
            ]
        }
    }


class NodeImages:
    """The nodes' image lists, read through ``list_nodes`` at most every REFRESH_SECONDS."""

    def __init__(
        self, list_nodes: Callable[[], Awaitable[list[dict[str, Any]]]], now: Callable[[], float]
    ) -> None:
        self._list = list_nodes
        self._now = now
        self._nodes: list[dict[str, Any]] = []
        self._read_at: float | None = None
        # Creates at once share one read: each waits for it, none sees the
        # empty list from before it.
        self._reading = asyncio.Lock()

    async def holding(self, image: str) -> list[str]:
        """The nodes holding ``image`` as of the latest read (a fresh one when due)."""
        async with self._reading:
            now = self._now()
            if self._read_at is None or now - self._read_at >= REFRESH_SECONDS:
                self._read_at = now
                try:
                    self._nodes = await self._list()
                except BackendError as e:
                    # No preference then (an account that may not list nodes,
                    # an API server hiccup): the Pod is placed as before.
                    log.info("node image lists unavailable: %s", e)
                    self._nodes = []
        return nodes_holding(self._nodes, image)
