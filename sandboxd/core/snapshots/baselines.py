"""What each live sandbox's next snapshot builds on (its Baseline, left by
the last snapshot or restore), and the one inotify watcher their change
journals share."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from sandboxd.core.snapshots.journal import Journal, Watcher
from sandboxd.core.snapshots.listing import Baseline

# Above this many baselines, those of sandboxes that are gone are dropped.
_PRUNE_ABOVE = 64


class Baselines:
    """Baselines by sandbox id, and journals from the shared watcher."""

    def __init__(self) -> None:
        self._by_sandbox: dict[str, Baseline] = {}
        self._watcher = Watcher()
        self._watching = False

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

    def new_journal(self, baseline: Baseline | None) -> Journal | None:
        """A fresh journal (the old one of this sandbox, if any, is dropped:
        whatever it missed, a walk is about to see); None without inotify."""
        if baseline is not None and baseline.journal is not None:
            baseline.journal.close()
        if not self._watcher.available:
            return None
        fd = self._watcher.fd
        if fd < 0:
            return None
        if not self._watching:
            asyncio.get_running_loop().add_reader(fd, self._watcher.drain)
            self._watching = True
        return self._watcher.journal()

    def close(self) -> None:
        """Stops the watcher; journals handed out vouch for nothing after."""
        if self._watching:
            asyncio.get_running_loop().remove_reader(self._watcher.fd)
            self._watching = False
        self._watcher.close()
