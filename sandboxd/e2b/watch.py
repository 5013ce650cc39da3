"""envd's directory watches: the streaming WatchDir (the async SDK) and
CreateWatcher / GetWatcherEvents / RemoveWatcher (the sync SDK).

sandboxd's exec has no inotify channel, so a watch lists the directory
(``find``, names, mtimes and sizes) every ``INTERVAL`` seconds and reports
the difference: a new name is CREATE, a changed mtime or size WRITE, a
missing name REMOVE (a rename is REMOVE of the old name and CREATE of the
new). Names are relative to the watched directory, as envd gives them."""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

from sandboxd import errors
from sandboxd.e2b.connect import ConnectError, code_for
from sandboxd.e2b.processes import exec_user
from sandboxd.e2b.registry import Box

__all__ = ["INTERVAL", "Watcher", "diff", "watch_request"]

INTERVAL = 0.2
"""Seconds between listings: how late an event may be."""

_LIST = '[ -d "$1" ] || exit 44; find "$1" -mindepth 1 $2 -printf "%P\\0%T@\\0%s\\n"'

Listing = dict[str, tuple[str, str]]


def diff(before: Listing, after: Listing) -> list[dict[str, Any]]:
    """The FilesystemEvent messages that take ``before`` to ``after``."""
    events: list[dict[str, Any]] = []
    for name in sorted(after.keys() - before.keys()):
        events.append({"name": name, "type": "EVENT_TYPE_CREATE"})
    for name in sorted(after.keys() & before.keys()):
        if after[name] != before[name]:
            events.append({"name": name, "type": "EVENT_TYPE_WRITE"})
    for name in sorted(before.keys() - after.keys()):
        events.append({"name": name, "type": "EVENT_TYPE_REMOVE"})
    return events


def parse_listing(out: bytes) -> Listing:
    listing: Listing = {}
    for line in out.decode(errors="replace").split("\n"):
        parts = line.split("\0")
        if len(parts) == 3 and parts[0]:
            listing[parts[0]] = (parts[1], parts[2])
    return listing


def watch_request(message: dict[str, Any]) -> tuple[str, bool]:
    """(path, recursive) of a WatchDir or CreateWatcher request."""
    path = message.get("path")
    recursive = message.get("recursive", False)
    if not isinstance(path, str) or not path or "\0" in path:
        raise ConnectError("invalid_argument", "path must be a non-empty string")
    if not isinstance(recursive, bool):
        raise ConnectError("invalid_argument", "recursive must be a boolean")
    return path, recursive


class Watcher:
    """One watch of a directory, polling until cancelled."""

    def __init__(self, box: Box, user: str, path: str, recursive: bool) -> None:
        self.id = "w" + secrets.token_hex(8)
        self.box = box
        self.user = user
        self.path = path
        self.depth = "" if recursive else "-maxdepth 1"
        self.events: asyncio.Queue[dict[str, Any] | ConnectError] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    async def _list(self) -> Listing:
        try:
            result = await self.box.client.exec(
                self.box.sandbox_id,
                ["/bin/bash", "-c", _LIST, "e2b-watch", self.path, self.depth],
                user=exec_user(self.user),
                timeout=30.0,
            )
        except errors.SandboxdError as e:
            raise ConnectError(code_for(e), str(e)) from e
        if result.outcome == "SANDBOX_LOST":
            raise ConnectError("aborted", f"sandbox lost under the watch of {self.path}")
        if result.exit_code == 44:
            raise ConnectError("not_found", f"{self.path}: no such directory")
        if not result.ok:
            raise ConnectError("unknown", f"watch {self.path}: {result.stderr[:200]!r}")
        return parse_listing(result.stdout)

    async def start(self) -> None:
        """Takes the first listing (so a missing directory fails the call) and polls on."""
        first = await self._list()
        self._task = asyncio.create_task(self._poll(first))

    async def _poll(self, listing: Listing) -> None:
        try:
            while True:
                await asyncio.sleep(INTERVAL)  # the watch's polling period, see the module's doc
                current = await self._list()
                for event in diff(listing, current):
                    self.events.put_nowait(event)
                listing = current
        except ConnectError as e:
            self.events.put_nowait(e)

    def drain(self) -> list[dict[str, Any]]:
        """The events since the last drain (GetWatcherEvents)."""
        out: list[dict[str, Any]] = []
        while not self.events.empty():
            item = self.events.get_nowait()
            if isinstance(item, ConnectError):
                raise item
            out.append(item)
        return out

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()
