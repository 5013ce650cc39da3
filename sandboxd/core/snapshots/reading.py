"""Reading a workspace's contents for a snapshot: a host-side scan that
lists, reads and hashes in one worker thread; a tar stream started early;
what a change journal's paths look like now; batching by bytes. Files above
sizes.INLINE_BYTES are never read whole here: they are named for the caller
to stream (host_chunks)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass

from sandboxd.backends.hostfs import HostFile, HostWorkspace, Large, OnDir, Record
from sandboxd.core.snapshots import sizes
from sandboxd.core.snapshots.journal import Changes
from sandboxd.core.snapshots.listing import SANDBOX_OWNER, Listed, Owner, Stamp, recorded
from sandboxd.core.snapshots.manifest import DIR, Entry
from sandboxd.core.snapshots.sizes import SizeCheck

log = logging.getLogger(__name__)

# Each batch of new contents becomes one pack; small enough that hashing and
# writing the last one adds little after the stream ends.
BATCH_BYTES = 16 << 20
BATCH_FILES = 4096


@dataclass
class Changed:
    """A snapshot captured from a journal: its entries, what it stored, the
    new baseline's stamps, the delta on the old, files with several names."""

    when: float
    entries: dict[str, Entry]
    stored: int
    stamps: dict[str, tuple[Stamp, str]]
    put: list[Entry]
    deleted: list[str]
    linked: frozenset[str]


class Rewalk(Exception):
    """The journal cannot tell this change apart: walk the workspace."""


class Scan:
    """A host-side scan of a workspace (HostWorkspace.scan) in a worker
    thread that also hashes what it reads: batches of (file, content,
    sha256) come out while it runs, at most a few ahead of the consumer (who
    calls stored() for each it is done with); every other entry at the end.
    Files above sizes.INLINE_BYTES are left unread and listed in ``large``; with
    ``check``, every entry is counted against it before anything is read
    past it (the scan stops, raising, once the workspace cannot be taken).
    ``sandbox``: the sandbox user's (uid, gid), recorded as SANDBOX_UID."""

    _AHEAD = 3

    def __init__(
        self,
        view: HostWorkspace,
        on_dir: OnDir | None = None,
        check: SizeCheck | None = None,
        sandbox: Owner = SANDBOX_OWNER,
        when: float | None = None,
    ) -> None:
        """``when``: the capture's start, if taken before (no stamp after it is trusted)."""
        self._sandbox = sandbox
        self._loop = asyncio.get_running_loop()
        self._on_dir = on_dir
        self._check = check
        self.linked: set[str] = set()
        self.large: list[Listed] = []
        self._queue: asyncio.Queue[list[tuple[Listed, bytes, str]] | None] = asyncio.Queue()
        self._gate = threading.Semaphore(self._AHEAD)
        self._stop = threading.Event()
        self.when = time.time() if when is None else when
        self._future = asyncio.ensure_future(asyncio.to_thread(self._run, view))

    def _run(self, view: HostWorkspace) -> list[Listed]:
        others: list[Listed] = []
        batch: list[tuple[Listed, bytes, str]] = []
        size = 0
        try:
            for rec, content in view.scan(self._on_dir, sizes.INLINE_BYTES):
                if self._stop.is_set():
                    return others
                item = recorded(Listed(*rec), self._sandbox)
                if self._check is not None:
                    self._check.add(item)
                if content is None:
                    others.append(item)
                    continue
                if rec[7] > 1:
                    self.linked.add(rec[5])
                if isinstance(content, Large):
                    self.large.append(item)
                    continue
                batch.append((item, content, hashlib.sha256(content).hexdigest()))
                size += len(content)
                if size >= BATCH_BYTES or len(batch) >= BATCH_FILES:
                    self._hand(batch)
                    batch, size = [], 0
            if batch:
                self._hand(batch)
            return others
        finally:
            with contextlib.suppress(RuntimeError):  # the loop is gone: nobody listens
                self._loop.call_soon_threadsafe(self._queue.put_nowait, None)

    def _hand(self, batch: list[tuple[Listed, bytes, str]]) -> None:
        while not self._gate.acquire(timeout=0.1):
            if self._stop.is_set():
                return
        self._loop.call_soon_threadsafe(self._queue.put_nowait, batch)

    async def batches(self) -> AsyncIterator[list[tuple[Listed, bytes, str]]]:
        """(file, content, sha256) batches as the worker hands them; ends when the scan does."""
        while (item := await self._queue.get()) is not None:
            yield item

    def stored(self, _: object = None) -> None:
        """Frees one batch's place in the look-ahead (usable as a done callback: its argument is unused)."""
        self._gate.release()

    async def others(self) -> list[Listed]:
        """Every entry that is not a regular file (directories, links, ...), once the scan ends; raises
        what the scan raised."""
        return await self._future

    async def close(self) -> None:
        """Stops the worker at its next entry and waits for it; its error, if any, is swallowed."""
        self._stop.set()
        await asyncio.gather(self._future, return_exceptions=True)


class Prefetch:
    """A stream started early and buffered (boundedly) until it is read."""

    def __init__(self, stream: AsyncIterator[bytes]) -> None:
        self._queue: asyncio.Queue[bytes | BaseException | None] = asyncio.Queue(maxsize=256)
        self._task = asyncio.create_task(self._pump(stream))

    async def _pump(self, stream: AsyncIterator[bytes]) -> None:
        try:
            async for chunk in stream:
                await self._queue.put(chunk)
            await self._queue.put(None)
        except Exception as e:  # handed to the reader, which raises it
            await self._queue.put(e)
        finally:
            with contextlib.suppress(Exception):
                await stream.aclose()  # type: ignore[attr-defined]

    async def chunks(self) -> AsyncIterator[bytes]:
        """The stream's chunks in order, from the buffer; raises what the stream raised."""
        while True:
            item = await self._queue.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    async def close(self) -> None:
        """Stops reading ahead and closes the stream, whether or not it was read to its end."""
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


async def once(data: bytes) -> AsyncIterator[bytes]:
    """``data`` as a stream of one chunk."""
    yield data


def batches(names: list[str], listed: dict[str, Listed]) -> Iterable[list[str]]:
    """``names`` (sorted: a directory's files together) in runs of about a
    pack's worth of bytes by their listed sizes."""
    run: list[str] = []
    size = 0
    for name in names:
        run.append(name)
        size += listed[name].size
        if size >= BATCH_BYTES or len(run) >= BATCH_FILES:
            yield run
            run, size = [], 0
    if run:
        yield run


def stat_touched(
    view: HostWorkspace, changes: Changes, base: dict[str, Entry], on_dir: OnDir, linked: frozenset[str]
) -> dict[str, Record | None]:
    """The current record (None: gone) of every touched path and of every
    file known to have several names; a directory that is new (or was not
    one) is walked whole and watched."""
    out: dict[str, Record | None] = {}
    walked: set[str] = set()
    for path, record in view.stat_many(sorted(changes.touched | changes.fresh | linked)):
        if not path or below(path, walked):
            continue  # the workspace itself, or inside a directory walked already
        if record is not None and record[0] == "d":
            prev = base.get(path)
            if path in changes.fresh or prev is None or prev.kind != DIR:
                walked.add(path)
                for r in view.walk_dir(path, on_dir) or [record]:
                    out[r[5]] = r
                continue
        out[path] = record
    return out


def below(path: str, dirs: set[str]) -> bool:
    """Whether ``path`` lies below one of ``dirs``."""
    while dirs and "/" in path:
        path = path.rpartition("/")[0]
        if path in dirs:
            return True
    return False


def read_hashed(
    view: HostWorkspace, files: list[tuple[str, int]]
) -> tuple[list[tuple[str, bytes, str]], list[str]]:
    """((path, content, sha256) of the files still regular, paths of those
    above sizes.INLINE_BYTES, left unread for the caller to stream); one vanished
    or replaced since the walk is left out, as if it had been deleted first."""
    out: list[tuple[str, bytes, str]] = []
    large: list[str] = []
    for name, content in view.read_files(files, sizes.INLINE_BYTES):
        if content is None:
            log.info("snapshot: %s vanished while it was read", name)
            continue
        if isinstance(content, Large):
            large.append(name)
            continue
        out.append((name, content, hashlib.sha256(content).hexdigest()))
    return out, large


async def host_chunks(opened: HostFile) -> AsyncIterator[bytes]:
    """The content of a file opened in place, each piece of at most
    sizes.CHUNK_BYTES read in a worker thread (HostFile.chunks checks the count)."""
    pieces = opened.chunks(sizes.CHUNK_BYTES)
    while (piece := await asyncio.to_thread(next, pieces, None)) is not None:
        yield piece


def sha256_all(contents: list[bytes]) -> list[str]:
    """The hex sha256 of each of ``contents``, in order."""
    return [hashlib.sha256(c).hexdigest() for c in contents]
