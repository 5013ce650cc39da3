"""The E2B sandboxes this server holds: each is one sandboxd sandbox under a
lease this server keeps, owned by the API key that created it.

An E2B sandbox id outlives the sandboxd sandbox behind it: a filesystem
pause releases the sandbox after snapshotting it and a resume restores the
snapshot into a new one, under the same E2B id."""

from __future__ import annotations

import datetime as dt
import secrets
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sandboxd.client import AsyncClient

if TYPE_CHECKING:
    from sandboxd.e2b.interpreter import Kernel
    from sandboxd.e2b.processes import Proc
    from sandboxd.e2b.watch import Watcher

__all__ = ["Box", "Registry", "now"]

RUNNING = "running"
PAUSED = "paused"


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@dataclass
class Box:
    """One E2B sandbox."""

    id: str
    key: str
    client: AsyncClient
    template: str
    pool: str
    metadata: dict[str, str]
    envs: dict[str, str]
    timeout: float
    sandbox_id: str
    lease_id: str
    image: str = ""
    """The template's image ("" = its pool's own)."""
    access_token: str = field(default_factory=lambda: secrets.token_hex(16))
    """envd's X-Access-Token for this sandbox."""
    traffic_token: str = field(default_factory=lambda: secrets.token_hex(16))
    """E2B's traffic access token: what calls to the sandbox's ports (the code interpreter's) carry."""
    started_at: dt.datetime = field(default_factory=now)
    end_at: dt.datetime = field(default_factory=now)
    state: str = RUNNING
    paused_live: bool = False
    """How it is paused: frozen in memory (gVisor) or as a filesystem snapshot."""
    snapshot_id: str = ""
    processes: dict[int, Proc] = field(default_factory=dict)
    watchers: dict[str, Watcher] = field(default_factory=dict)
    kernels: dict[str, Kernel] = field(default_factory=dict)
    """The code interpreter's contexts (run_code)."""
    default_kernel: str = ""
    next_pid: int = 1000

    def extend(self, timeout: float) -> None:
        self.timeout = timeout
        self.end_at = now() + dt.timedelta(seconds=timeout)

    @property
    def expired(self) -> bool:
        return self.state == RUNNING and now() >= self.end_at

    def new_pid(self) -> int:
        self.next_pid += 1
        return self.next_pid


def new_id() -> str:
    return "i" + secrets.token_hex(10)


class Registry:
    """E2B id -> Box. A box past its end is dropped when next looked at: its
    lease ran out on the server, which ended the sandbox."""

    def __init__(self) -> None:
        self._boxes: dict[str, Box] = {}

    def add(self, box: Box) -> None:
        self._boxes[box.id] = box

    def get(self, key: str, box_id: str) -> Box | None:
        """The key's box, or None: another key's boxes are not seen."""
        box = self._boxes.get(box_id)
        if box is None or box.key != key:
            return None
        if box.expired:
            self.drop(box)
            return None
        return box

    def drop(self, box: Box) -> None:
        self._boxes.pop(box.id, None)
        for proc in list(box.processes.values()):
            proc.cancel()
        for watcher in box.watchers.values():
            watcher.cancel()
        box.watchers.clear()
        for kernel in box.kernels.values():
            kernel.close()
        box.kernels.clear()

    def by_id(self, box_id: str) -> Box | None:
        """Any key's box (envd calls prove access with its token instead)."""
        box = self._boxes.get(box_id)
        if box is not None and box.expired:
            self.drop(box)
            return None
        return box

    def of_key(self, key: str) -> list[Box]:
        boxes = [b for b in self._boxes.values() if b.key == key]
        for b in boxes:
            if b.expired:
                self.drop(b)
        return [b for b in boxes if not b.expired]

    def all(self) -> list[Box]:
        return list(self._boxes.values())
