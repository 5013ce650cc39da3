"""What each live sandbox's next snapshot builds on (its Baseline, left by
the last snapshot or restore), and the one inotify watcher their change
journals share (within a Budget of the host's inotify limits)."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator

from sandboxd.core.lifecycle import SandboxRecord
from sandboxd.core.snapshots.journal import Budget, Journal, Watcher
from sandboxd.core.snapshots.lineage import LABEL_SNAPSHOT
from sandboxd.core.snapshots.listing import Baseline
from sandboxd.errors import FailedPrecondition

# Above this many baselines, those of sandboxes that are gone are dropped.
_PRUNE_ABOVE = 64


class Restoring:
    """The targets of one restore in progress (Baselines.restoring)."""

    def __init__(self, marks: dict[str, str], snapshot_id: str) -> None:
        self._marks = marks
        self._snapshot_id = snapshot_id
        self._ids: set[str] = set()

    def update(self, sandbox_ids: Iterable[str]) -> None:
        """Marks these sandboxes as being restored, from now on."""
        for sid in sandbox_ids:
            self._ids.add(sid)
            self._marks[sid] = self._snapshot_id

    def clear(self) -> None:
        """The restore is over: its targets may be snapshotted."""
        for sid in self._ids:
            if self._marks.get(sid) == self._snapshot_id:
                del self._marks[sid]
        self._ids.clear()


class Baselines:
    """Baselines by sandbox id, and journals from the shared watcher."""

    def __init__(self, budget: Budget | None = None) -> None:
        self._by_sandbox: dict[str, Baseline] = {}
        self._watcher = Watcher(budget)
        self._watching = False
        self._restoring: dict[str, str] = {}
        self._pending: Counter[str] = Counter()

    def get(self, sandbox_id: str) -> Baseline | None:
        """The baseline of ``sandbox_id``, if it has one."""
        return self._by_sandbox.get(sandbox_id)

    def set(self, sandbox_id: str, baseline: Baseline) -> None:
        """Makes ``baseline`` what the next snapshot of ``sandbox_id`` builds on."""
        self._by_sandbox[sandbox_id] = baseline

    def __contains__(self, sandbox_id: object) -> bool:
        return sandbox_id in self._by_sandbox

    def prune(self, is_live: Callable[[str], bool]) -> None:
        """Drops (and closes the journals of) baselines of sandboxes no longer
        live, once there are enough of them to matter."""
        if len(self._by_sandbox) > _PRUNE_ABOVE:
            for sid in [s for s in self._by_sandbox if not is_live(s)]:
                journal = self._by_sandbox.pop(sid).journal
                if journal is not None:
                    journal.close()

    @contextlib.contextmanager
    def restoring(self, snapshot_id: str) -> Iterator[Restoring]:
        """Marks a restore of ``snapshot_id`` in progress for the block; the
        caller names its targets (``update``) as soon as it knows them.
        Before that, a sandbox labelled with ``snapshot_id`` and without a
        baseline counts as one of them (its acquire labelled it and has not
        answered yet)."""
        marks = Restoring(self._restoring, snapshot_id)
        self._pending[snapshot_id] += 1
        try:
            yield marks
        finally:
            self._pending[snapshot_id] -= 1
            if not self._pending[snapshot_id]:
                del self._pending[snapshot_id]
            marks.clear()

    def refuse_restoring(self, rec: SandboxRecord) -> None:
        """FailedPrecondition if a restore into ``rec`` is in progress: its
        workspace is half written until the restore answers."""
        restoring = self.restore_of(rec)
        if restoring:
            raise FailedPrecondition(
                f"sandbox {rec.sandbox_id} is being restored from snapshot {restoring}; snapshot it once "
                "the Restore call has answered"
            )

    def restore_of(self, rec: SandboxRecord) -> str:
        """The snapshot being restored into ``rec`` now ("" if none)."""
        if rec.sandbox_id in self._restoring:
            return self._restoring[rec.sandbox_id]
        label = rec.labels.get(LABEL_SNAPSHOT, "")
        if label in self._pending and rec.sandbox_id not in self._by_sandbox:
            return label
        return ""

    def new_journal(self, baseline: Baseline | None) -> Journal | None:
        """A fresh journal (the old one of this sandbox, if any, is dropped:
        whatever it missed, a walk is about to see); None without inotify."""
        if baseline is not None and baseline.journal is not None:
            baseline.journal.close()
        if not self._watching:
            loop = asyncio.get_running_loop()
            self._watcher.attach(loop.add_reader, loop.remove_reader)
            self._watching = True
        return self._watcher.journal()

    @property
    def watcher(self) -> Watcher:
        """The inotify instances the journals share, their budget and what fell back to walks."""
        return self._watcher

    def close(self) -> None:
        """Stops the watcher; journals handed out vouch for nothing after."""
        self._watcher.close()
        self._watching = False
