"""What a run left behind.

Two views, both must be empty after a run:

- on the engine: containers carrying a label of the run (the sandboxd server
  instance's ``sandboxd.instance`` label once that server has stopped, or the
  harness's own label for the baseline), found with the docker SDK;
- on the server: sandboxes still LEASED under the run's labels, found with
  ListSandboxes (works against any server, Docker or Kubernetes).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from sandboxd.client import AsyncClient
from sandboxd.v1 import common_pb2

RUN_LABEL = "load-run"
"""Acquire label naming the run on the server (sandbox labels)."""
HARNESS_LABEL = "sandboxd.load.run"
"""Container label of everything the baseline driver creates."""


class ContainerLike(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def labels(self) -> Mapping[str, str]: ...


def leftovers(containers: Iterable[ContainerLike], key: str, value: str) -> list[dict[str, str]]:
    """The containers labelled ``key=value``, described for the report."""
    return [{"name": c.name, "status": c.status} for c in containers if c.labels.get(key) == value]


def engine_leftovers(engine: Any, key: str, value: str, *, remove: bool = True) -> list[dict[str, str]]:
    """Containers on the engine labelled ``key=value`` (then removed, so a
    leak is reported once and not left behind). Blocking."""
    import docker.errors

    found = engine.containers.list(all=True, filters={"label": f"{key}={value}"})
    out = leftovers(found, key, value)
    if remove:
        for c in found:
            with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
                c.remove(force=True)
    return out


async def leased_leftovers(client: AsyncClient, run_id: str) -> list[dict[str, str]]:
    """Sandboxes the server still has LEASED under the run's label."""
    boxes = await client.list_sandboxes(
        labels={RUN_LABEL: run_id}, state=common_pb2.SandboxState.SANDBOX_STATE_LEASED
    )
    return [{"name": b.id, "status": "LEASED", "lease": b.lease_id} for b in boxes]
