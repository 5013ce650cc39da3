"""The fake backend's reset in place (sandboxd.backends.recycling): its
sandboxes have no processes, so the baseline is the files and directories
as they came, and a reset puts them back. Leftovers a hostile tenant could
make that a reset must not miss are injected: ``leave_process`` (a
background process that survives the kill), ``tamper`` (a file of the
baseline changed) and ``oom`` (an OOM kill in the sandbox)."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from sandboxd.errors import TransientBackendError
from sandboxd.sandbox_reset import Baseline, ResetReport

if TYPE_CHECKING:
    from sandboxd.backends.fake import FakeSandbox


class FakeReset:
    """Mixed into FakeBackend: take_baseline and reset_in_place on the in-memory sandboxes."""

    sandboxes: dict[str, FakeSandbox]
    resets: int = 0
    """Resets in place carried out."""
    reset_failures: int = 0
    """The next this-many resets fail (as a step that did not answer)."""

    def _reset_box(self, handle: str) -> FakeSandbox:
        box = self.sandboxes.get(handle)
        if box is None or not box.running:
            raise TransientBackendError(f"sandbox {handle} is gone")
        return box

    @staticmethod
    def _digest(box: FakeSandbox) -> str:
        h = hashlib.sha256()
        for path in sorted(box.files):
            data, mode = box.files[path]
            h.update(f"{path}\0{mode}\0".encode() + hashlib.sha256(data).digest())
        for path in sorted(box.dirs):
            h.update(f"d {path}\0{box.dir_modes.get(path, 0o755)}\n".encode())
        h.update(f"events {getattr(box, 'oom_kills', 0)}".encode())
        return h.hexdigest()

    async def take_baseline(self, handle: str, timeout: float) -> Baseline:
        """The sandbox's files and directories now, as a digest and a listing."""
        box = self._reset_box(handle)
        return Baseline(
            digest=self._digest(box),
            infra=("1:1",),
            fingerprints={"1:1": "init"},
            listing=tuple(sorted({*box.files, *box.dirs})),
            events=(box.oom_kills, 0),
        )

    async def reset_in_place(self, handle: str, baseline: Baseline, timeout: float) -> ResetReport:
        """Forgets the sessions and removes what the baseline did not list;
        injected leftovers are reported as a real reset would find them."""
        box = self._reset_box(handle)
        if self.reset_failures > 0:
            self.reset_failures -= 1
            raise TransientBackendError("injected reset failure: the step did not answer")
        self.resets += 1
        box.sessions.clear()
        keep = set(baseline.listing)
        extra = [p for p in [*box.files, *box.dirs, *box.links] if p not in keep]
        for path in extra:
            box.files.pop(path, None)
            box.dirs.discard(path)
            box.links.pop(path, None)
            box.stamps.pop(path, None)
        return ResetReport(
            survivors=box.leftover_processes,
            infra_changed=(),
            removed=len(extra),
            left=0,
            ipc_left=0,
            digest=self._digest(box),
            events=(box.oom_kills, 0),
        )

    def leave_process(self, handle: str) -> None:
        """A background process the next reset cannot kill."""
        self.sandboxes[handle].leftover_processes += 1

    def tamper(self, handle: str, path: str) -> None:
        """Changes ``path``, a file or directory the sandbox came with."""
        box = self.sandboxes[handle]
        if path in box.files:
            data, mode = box.files[path]
            box.files[path] = (data + b"!", mode)
        else:
            box.dir_modes[path] = 0o700

    def oom(self, handle: str) -> None:
        """An OOM kill in the sandbox."""
        self.sandboxes[handle].oom_kills += 1
