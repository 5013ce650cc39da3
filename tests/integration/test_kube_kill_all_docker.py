"""The Kubernetes backend's fork-bomb stop (KILL_ALL_ARGV) in a real
container whose init is the Pod's keep-alive (KEEPALIVE), under a process
limit the bomb fills: the bomb is gone, and the keep-alive's own ``sleep``
lives on. Killing it too let init fork its next ``sleep`` while the bomb's
zombies still held every slot; the shell that is init exits on a failed fork,
so the whole sandbox ended with it (seen on the real kubelet node, under
load). The engine stands in for the node's runtime: both are runc."""

from __future__ import annotations

import time
from pathlib import Path

import docker
import pytest

from sandboxd.backends.kubernetes.limits import KILL_ALL_ARGV
from sandboxd.backends.kubernetes.podspec import KEEPALIVE

pytestmark = [pytest.mark.docker, pytest.mark.timeout(120)]

PIDS_LIMIT = 64
BOMB = ["bash", "-c", "bomb() { bomb | bomb & }; bomb; sleep 30"]


def _until(what: str, check: object, timeout: float = 30.0) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check() if callable(check) else check
        if value:
            return value
        time.sleep(0.05)  # the poll interval of this deadline-bounded wait
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def _pids_file(container: docker.models.containers.Container, name: str) -> Path:
    pid = container.attrs["State"]["Pid"]
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "pids" in controllers.split(","):
            return Path("/sys/fs/cgroup/pids") / path.lstrip("/") / name
    return Path("/sys/fs/cgroup") / path.lstrip("/") / name  # cgroup v2: one line


def _processes(container: docker.models.containers.Container) -> list[tuple[int, int, str]]:
    """(pid, parent, name) of every process but the listing itself; [] while none can start."""
    code, out = container.exec_run(["ps", "-eo", "pid=,ppid=,comm="])
    if code != 0:
        return []
    rows = [line.split(None, 2) for line in out.decode().splitlines() if line.strip()]
    return [(int(p), int(pp), name) for p, pp, name in rows if name != "ps"]


def test_kill_all_stops_a_bomb_and_spares_the_keep_alive(engine: docker.DockerClient, image: str) -> None:
    container = engine.containers.run(
        image, list(KEEPALIVE), detach=True, user="1000", pids_limit=PIDS_LIMIT, network_disabled=True
    )
    try:
        container.reload()
        keep_alive = _until(
            "the keep-alive's sleep", lambda: [p for p in _processes(container) if p[2] == "sleep"]
        )
        assert isinstance(keep_alive, list) and keep_alive[0][1] == 1, keep_alive
        events = _pids_file(container, "pids.events")
        container.exec_run(BOMB, detach=True)
        _until("a refused fork", lambda: int(events.read_text().split()[-1]) > 0)

        def killed() -> bool:
            # The kill's own exec may not start while the bomb holds every slot.
            try:
                return bool(container.exec_run(KILL_ALL_ARGV).exit_code == 0)
            except docker.errors.APIError:
                return False

        _until("the kill to start", killed)
        container.reload()
        assert container.status == "running"
        left = _until("a listing", lambda: _processes(container))
        assert left == [(1, 0, "sh"), keep_alive[0]], left
    finally:
        container.remove(force=True)
