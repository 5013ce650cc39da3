"""How large a snapshot's files may be, and what is read whole.

A file up to INLINE_BYTES is read whole and stored in a pack with others; a
larger one is streamed in pieces of at most CHUNK_BYTES, hashed on the way,
and stored as an object of its own, so no file is ever whole in memory.

Files are counted at their *apparent* size (what ``stat`` says, and what a
restore writes): a sparse file counts whole, holes included. A capture
refuses (ResourceExhausted, naming the file) a workspace whose files could
never be restored into a sandbox like the one they came from, and a file
larger than the tenant's whole snapshot quota, before it reads them; snapshots
are not stored sparse.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from sandboxd.backends.layout import WORKSPACE
from sandboxd.errors import ResourceExhausted

INLINE_BYTES = 4 << 20
"""Files up to this are read whole and packed; larger ones are streamed."""
CHUNK_BYTES = 1 << 20
"""The largest piece of a streamed file held at a time (per stage)."""
PAGE_BYTES = 4096
"""A tmpfs page: what the smallest file takes."""


class Sized(Protocol):
    """A listing record or a manifest entry: what counting needs of it."""

    @property
    def path(self) -> str:
        """Relative to the workspace: what a refusal names."""

    @property
    def kind(self) -> str:
        """One of "f", "d", "l" (file, directory, symlink); only files and links count."""

    @property
    def size(self) -> int:
        """The apparent size in bytes, as ``stat`` reports it (holes included)."""

    @property
    def target(self) -> str:
        """A symlink's target ("" otherwise); a long one takes a page of its own."""


def pages(item: Sized) -> int:
    """Bytes ``item`` takes on a tmpfs workspace, as manifest.footprint
    counts them: file contents at their apparent size in whole pages, a long
    symlink target a page."""
    if item.kind == "f":
        return (item.size + PAGE_BYTES - 1) // PAGE_BYTES * PAGE_BYTES
    if item.kind == "l" and len(item.target) > 60:
        return PAGE_BYTES
    return 0


def human(n: int) -> str:
    """``n`` bytes for a message (1.5 GiB)."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} bytes"


class SizeCheck:
    """Counts one capture's files against the sandbox's workspace limit
    (``disk_bytes``, 0: none) and the tenant's snapshot quota (0: none)."""

    def __init__(self, sandbox_id: str, disk_bytes: int, quota: int, tenant: str = "") -> None:
        self.sandbox_id = sandbox_id
        self.disk_bytes = disk_bytes
        self.quota = quota
        self.tenant = tenant
        self.total = 0
        self._largest: tuple[int, str] = (0, "")

    def file(self, path: str, size: int) -> None:
        """Refuses one file of ``size`` bytes (apparent) that can never be
        part of a snapshot; called before it is read."""
        if self.disk_bytes and size > self.disk_bytes:
            raise ResourceExhausted(
                f"snapshot of {self.sandbox_id} refused: {WORKSPACE}/{path} has an apparent size of "
                f"{size} bytes ({human(size)}; a sparse file counts whole), more than the "
                f"sandbox's workspace limit of {self.disk_bytes} bytes, so it could never be "
                "restored; remove or shrink it"
            )
        if self.quota and size > self.quota:
            raise ResourceExhausted(
                f"snapshot of {self.sandbox_id} refused: {WORKSPACE}/{path} has an apparent size of "
                f"{size} bytes ({human(size)}; a sparse file counts whole), more than the snapshot "
                f"quota of tenant {self.tenant!r} ({self.quota} bytes); remove or shrink it"
            )

    def add(self, item: Sized) -> None:
        """Counts one entry of the workspace; refuses once they pass the
        workspace limit."""
        if item.kind != "f" and item.kind != "l":
            return
        if item.kind == "f":
            self.file(item.path, item.size)
            if item.size > self._largest[0]:
                self._largest = (item.size, item.path)
        self.total += pages(item)
        if self.disk_bytes and self.total > self.disk_bytes:
            size, path = self._largest
            raise ResourceExhausted(
                f"snapshot of {self.sandbox_id} refused: its files take more than {self.total} bytes "
                f"({human(self.total)}) at their apparent sizes (a sparse file counts whole), more "
                f"than the sandbox's workspace limit of {self.disk_bytes} bytes, so it could never "
                f"be restored; the largest is {WORKSPACE}/{path} ({size} bytes)"
            )

    def workspace(self, items: Iterable[Sized]) -> None:
        """Counts every entry of ``items`` afresh (it runs on every snapshot:
        comprehensions, not a call per entry, unless it refuses)."""
        items = list(items)
        self.total = 0
        self._largest = (0, "")
        if not self.disk_bytes and not self.quota:
            return
        files = [item.size for item in items if item.kind == "f"]
        largest = max(files, default=0)
        longs = sum(1 for item in items if item.kind == "l" and len(item.target) > 60)
        total = (sum((size + PAGE_BYTES - 1) // PAGE_BYTES for size in files) + longs) * PAGE_BYTES
        limit = min(n for n in (self.disk_bytes, self.quota) if n)
        if largest > limit or (self.disk_bytes and total > self.disk_bytes):
            for item in items:  # the slow way, to name what does not fit
                self.add(item)
        self.total = total
