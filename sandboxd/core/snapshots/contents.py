"""A capture's file contents: which of a workspace's files must be read (those
whose stamps left their baseline's), reading them (in place from the host,
as a tar out of the sandbox, or through its session), and storing them as
per-file blobs a batch (one pack) at a time, pinned before they are looked
up so the collector cannot take them in between. A file above
sizes.INLINE_BYTES is streamed into a blob of its own instead, and every
file is counted at its apparent size (sizes.SizeCheck) before it is read."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable

from sandboxd.backends.hostfs import HostWorkspace
from sandboxd.core.lifecycle import SandboxRecord
from sandboxd.core.snapshots import sizes
from sandboxd.core.snapshots.catalog import SnapshotCatalog
from sandboxd.core.snapshots.gc import Pins
from sandboxd.core.snapshots.journal import Changes
from sandboxd.core.snapshots.listing import (
    RACY_SECONDS,
    SANDBOX_OWNER,
    Baseline,
    Listed,
    Owner,
    Stamp,
    as_listed,
    file_entry,
    not_a_file,
    recorded,
)
from sandboxd.core.snapshots.manifest import FILE, Entry
from sandboxd.core.snapshots.packs import PackedBlobs, blob_key
from sandboxd.core.snapshots.reading import (
    BATCH_BYTES,
    BATCH_FILES,
    Changed,
    Prefetch,
    Rewalk,
    Scan,
    batches,
    host_chunks,
    read_hashed,
    sha256_all,
    stat_touched,
)
from sandboxd.core.snapshots.sizes import SizeCheck
from sandboxd.core.snapshots.tarstream import HARDLINK, Body, Member, read_members
from sandboxd.core.snapshots.workspaces import Workspaces

log = logging.getLogger(__name__)

# A journal that recorded more paths than this, and more than half the
# workspace, is answered by a walk instead (cheaper per entry).
_REWALK_TOUCHED = 1000


class Contents:
    """Reads what changed in a workspace and stores it as blobs."""

    def __init__(
        self, catalog: SnapshotCatalog, blobs: PackedBlobs, pins: Pins, workspaces: Workspaces
    ) -> None:
        self._catalog = catalog
        self._blobs = blobs
        self._pins = pins
        self._workspaces = workspaces

    @property
    def blobs(self) -> PackedBlobs:
        """The store contents go to."""
        return self._blobs

    def _pinner(self, pinned: list[str]) -> Callable[[str], Awaitable[None]]:
        """Pins one key for a streamed blob and records it in ``pinned``."""

        async def pin(key: str) -> None:
            pinned.extend(await self._pins.pin([key]))

        return pin

    async def stream_in_place(
        self,
        ns: str,
        view: HostWorkspace,
        name: str,
        check: SizeCheck,
        pinned: list[str],
        sandbox: Owner = SANDBOX_OWNER,
    ) -> tuple[Listed, str, int] | None:
        """(record as opened, sha256, bytes newly stored) of a file too large
        to read whole, streamed from the host into a blob of its own after
        its size is checked; None if it is gone or no longer regular."""
        opened = await asyncio.to_thread(view.open_file, name)
        if opened is None:
            log.info("snapshot: %s vanished before it was read", name)
            return None
        try:
            item = recorded(Listed(*opened.record), sandbox)
            check.file(name, item.size)
            digest, written = await self._blobs.put_stream(
                ns, host_chunks(opened), item.size, self._pinner(pinned)
            )
        finally:
            opened.close()
        return item, digest, written

    async def from_journal(
        self,
        ns: str,
        view: HostWorkspace,
        baseline: Baseline,
        changes: Changes,
        pinned: list[str],
        check: SizeCheck,
        sandbox: Owner = SANDBOX_OWNER,
        *,
        started: float | None = None,
    ) -> Changed:
        """The snapshot from what a journal recorded: only the touched paths
        (and files with several names) are looked at, directories made since
        whole, and only those that changed are read. Everything else is the
        baseline's, carried. Rewalk if a file got another name. ``started``:
        the capture's clock, if read before (no stamp after it is trusted)."""
        assert baseline.entries is not None and baseline.journal is not None
        if await self._catalog.depth(baseline.snapshot_id) is None:
            # The baseline's snapshot is gone, and with it perhaps the blobs of
            # what would be carried: a walk finds which to read again.
            raise Rewalk
        if len(changes.touched) > max(_REWALK_TOUCHED, len(baseline.entries) // 2):
            raise Rewalk  # most of it changed: one walk costs less than a look per path
        base = baseline.entries
        when = time.time() if started is None else started
        stats = await asyncio.to_thread(
            stat_touched, view, changes, base, baseline.journal.watch, baseline.linked
        )
        linked = {p for p, r in stats.items() if r is not None and r[0] == "f" and r[7] > 1}
        if not linked <= baseline.linked:
            # A file got another name: which other paths share it, only a walk tells.
            raise Rewalk
        linked |= {p for p in baseline.linked if p not in stats}
        entries = dict(base)
        stamps = dict(baseline.files)
        put: dict[str, Entry] = {}
        deleted: set[str] = set()
        need: dict[str, Listed] = {}

        def drop(path: str) -> None:
            if entries.pop(path, None) is not None:
                deleted.add(path)
            put.pop(path, None)
            stamps.pop(path, None)

        for path, record in stats.items():
            if record is None:
                drop(path)
                continue
            item = recorded(Listed(*record), sandbox)
            if item.kind == "f":
                known = None if path in changes.written else baseline.digest_of(item)
                if known is None:
                    need[path] = item
                    continue
                entry = baseline.unchanged(item, known) or file_entry(item, item.size, known)
                if float(item.ctime) < when - RACY_SECONDS:
                    stamps[path] = (item.stamp, known)
                if base.get(path) != entry:
                    entries[path] = put[path] = entry
                continue
            described = not_a_file(item, baseline.unchanged(item))
            if described is None:
                drop(path)  # not something a snapshot carries (a FIFO, a socket)
                continue
            stamps.pop(path, None)
            if base.get(path) != described:
                entries[path] = put[path] = described
        # Everything the snapshot will hold, counted before anything is read.
        check.workspace([*(e for p, e in entries.items() if p not in need), *need.values()])
        stored = 0
        for run in batches(sorted(need), need):
            got, large = await asyncio.to_thread(read_hashed, view, [(n, need[n].size) for n in run])
            blobs: dict[str, bytes] = {}
            read = set()
            for name, content, digest in got:
                read.add(name)
                item = need[name]
                entry = file_entry(item, len(content), digest)
                entries[name] = put[name] = entry
                if len(content) == item.size and float(item.ctime) < when - RACY_SECONDS:
                    stamps[name] = (item.stamp, digest)
                else:
                    stamps.pop(name, None)
                if content:
                    blobs.setdefault(blob_key(ns, digest), content)
            pinned.extend(await self._pins.pin(blobs))
            stored += await self._blobs.put_absent(blobs)
            for name in large:
                streamed = await self.stream_in_place(ns, view, name, check, pinned, sandbox)
                if streamed is None:
                    continue
                item, digest, written = streamed
                read.add(name)
                entries[name] = put[name] = file_entry(item, item.size, digest)
                if float(item.ctime) < when - RACY_SECONDS:
                    stamps[name] = (item.stamp, digest)
                else:
                    stamps.pop(name, None)
                stored += written
            for name in run:
                if name not in read:
                    drop(name)  # gone since it was looked at
        for path in list(put):
            if base.get(path) == put[path]:
                del put[path]
        return Changed(when, entries, stored, stamps, list(put.values()), sorted(deleted), frozenset(linked))

    async def read(
        self,
        rec: SandboxRecord,
        ns: str,
        when: float,
        listing: list[Listed],
        baseline: Baseline | None,
        pinned: list[str],
        session: str,
        prefetch: Prefetch | None = None,
        carried: dict[str, Entry] | None = None,
        view: HostWorkspace | None = None,
        scan: Scan | None = None,
        check: SizeCheck | None = None,
    ) -> tuple[dict[str, Entry], int, dict[str, tuple[Stamp, str]]]:
        """(entries by path, bytes newly stored, new baseline files).
        ``carried``: entries a delta listing showed unchanged; ``view``: read
        the files ``listing`` shows changed in place rather than as a tar
        from the sandbox; ``scan``: a host-side scan that lists and reads
        everything (``listing`` is then empty, and the scan counts what it
        finds against ``check``); ``check``: what the workspace may hold,
        counted before anything is read."""
        check = check or SizeCheck("", 0, 0)
        entries: dict[str, Entry] = dict(carried or {})
        need: dict[str, Listed] = {}
        reused: dict[str, Listed] = {}
        kept = {p for p, e in entries.items() if e.kind == FILE}

        def classify(items: list[Listed]) -> None:
            for item in items:
                if item.kind == "f":
                    known = baseline.digest_of(item) if baseline is not None else None
                    if known is not None:
                        assert baseline is not None
                        reused[item.path] = item
                        entries[item.path] = baseline.unchanged(item, known) or file_entry(
                            item, item.size, known
                        )
                    else:
                        need[item.path] = item
                elif (
                    described := not_a_file(item, baseline.unchanged(item) if baseline is not None else None)
                ) is not None:
                    entries[item.path] = described
                else:
                    log.info("snapshot of %s skips %s (type %s)", rec.sandbox_id, item.path, item.kind)

        classify(listing)
        if scan is None:
            check.workspace([*entries.values(), *need.values()])
        kept.update(reused)
        # While the baseline's snapshot has a row (pinned by the caller, so it
        # keeps it), what it references is kept and so is all that is kept here.
        if kept and baseline is not None and await self._catalog.depth(baseline.snapshot_id) is None:
            keys = {blob_key(ns, entries[p].digest) for p in kept if entries[p].size}
            pinned += await self._pins.pin(keys)
            # The parent is gone, so GC may have taken its blobs: re-read those.
            gone = await self._blobs.missing(sorted(keys))
            for p in list(kept):
                if entries[p].size and blob_key(ns, entries[p].digest) in gone:
                    need[p] = reused.pop(p) if p in reused else as_listed(entries[p])
                    kept.discard(p)
                    del entries[p]
        stored = 0
        stamps: dict[str, tuple[Stamp, str]] = {}
        digests: dict[str, str] = {}
        links: list[tuple[str, str, Listed]] = []
        writers: set[asyncio.Task[int]] = set()
        slots = asyncio.Semaphore(2)
        batch: list[tuple[str, Listed, bytes]] = []
        batch_bytes = 0

        async def write(files: list[tuple[str, Listed, bytes]], hashed: list[str] | None = None) -> int:
            try:
                if hashed is None:
                    # sha256 releases the GIL: hashing overlaps with reading the stream.
                    hashed = await asyncio.to_thread(sha256_all, [content for _, _, content in files])
                blobs: dict[str, bytes] = {}
                for (name, item, content), digest in zip(files, hashed, strict=True):
                    digests[name] = digest
                    entries[name] = file_entry(item, len(content), digest, name)
                    if len(content) == item.size and float(item.ctime) < when - RACY_SECONDS:
                        stamps[name] = (item.stamp, digest)
                    if content:
                        blobs.setdefault(blob_key(ns, digest), content)
                pinned.extend(await self._pins.pin(blobs))
                return await self._blobs.put_absent(blobs)
            finally:
                slots.release()

        async def flush() -> None:
            nonlocal batch, batch_bytes
            if batch:
                await slots.acquire()
                writers.add(asyncio.create_task(write(batch)))
                batch, batch_bytes = [], 0

        def streamed(name: str, item: Listed, size: int, digest: str, written: int, race: Listed) -> None:
            """Records a file streamed into a blob of its own; ``race``: the
            record whose stamp it may be trusted under."""
            nonlocal stored
            digests[name] = digest
            entries[name] = file_entry(item, size, digest, name)
            if size == race.size and float(race.ctime) < when - RACY_SECONDS:
                stamps[name] = (race.stamp, digest)
            stored += written

        async def stream_in_place(names: list[str]) -> None:
            assert view is not None
            for name in names:
                got = await self.stream_in_place(ns, view, name, check, pinned, self._workspaces.owner(rec))
                if got is not None:
                    item, digest, written = got
                    streamed(name, item, item.size, digest, written, item)

        try:
            if scan is not None:
                async for scanned in scan.batches():
                    await slots.acquire()
                    read = [(item.path, item, content) for item, content, _ in scanned]
                    writers.add(task := asyncio.create_task(write(read, [d for _, _, d in scanned])))
                    task.add_done_callback(scan.stored)
                classify(await scan.others())
                # Counted whole by the scan already: now they are read, in pieces.
                await stream_in_place([item.path for item in scan.large])
            elif need and view is not None:
                # One reader thread: per-file work is short calls that drop
                # the GIL, and two such threads measured slower than one.
                for run in batches(sorted(need), need):
                    got, large = await asyncio.to_thread(read_hashed, view, [(n, need[n].size) for n in run])
                    await slots.acquire()
                    files = [(name, need[name], content) for name, content, _ in got]
                    writers.add(asyncio.create_task(write(files, [digest for _, _, digest in got])))
                    await stream_in_place(large)
            elif need:
                # Each file read by its owner (root's by root), in one or more tar streams.
                streams = await self._workspaces.content_streams(rec, need, session, prefetch)
                readers = (read_members(s, sizes.INLINE_BYTES, sizes.CHUNK_BYTES) for s in streams)
                async for member, content in _chained(readers):
                    wanted = need.get(member.name)
                    if wanted is None:
                        continue  # a Body left unread is skipped by the reader
                    if member.type == HARDLINK:
                        links.append((member.name, member.linkname, wanted))
                    elif isinstance(content, Body):
                        check.file(member.name, member.size)
                        digest, written = await self._blobs.put_stream(
                            ns, aiter(content), member.size, self._pinner(pinned)
                        )
                        streamed(member.name, wanted, member.size, digest, written, wanted)
                    elif member.is_file:
                        batch.append((member.name, wanted, content))
                        batch_bytes += len(content)
                        if batch_bytes >= BATCH_BYTES or len(batch) >= BATCH_FILES:
                            await flush()
                await flush()
            for size in await asyncio.gather(*writers):
                stored += size
        except BaseException:
            for task in writers:
                task.cancel()
            await asyncio.gather(*writers, return_exceptions=True)
            raise
        for name, target, item in links:
            # A hard link's content is its target's; one whose target was not captured is left out.
            digest = digests.get(target, "")
            if digest:
                size = entries[target].size
                entries[name] = file_entry(item, size, digest, name)
                if size == item.size and float(item.ctime) < when - RACY_SECONDS:
                    stamps[name] = (item.stamp, digest)
        for p, item in reused.items():
            # Unchanged against a trusted stamp: as trustworthy as before.
            stamps[p] = (item.stamp, entries[p].digest)
        return entries, stored, stamps


async def _chained(
    readers: Iterable[AsyncIterator[tuple[Member, bytes | Body]]],
) -> AsyncIterator[tuple[Member, bytes | Body]]:
    """The members of each reader in turn."""
    for reader in readers:
        async for item in reader:
            yield item
