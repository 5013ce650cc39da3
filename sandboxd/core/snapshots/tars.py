"""A snapshot's tar for a restore: built from its blobs, each verified against
its digest while the archive is written, and the recent small ones kept in
memory (a fork, or a snapshot restored again, skips the build).

A snapshot with a file above sizes.INLINE_BYTES, or more content than
_MEMORY_TAR_BYTES, is written to a file instead, in bounded memory: small
blobs a batch at a time (the next one fetched while the last is written),
large ones streamed, each hashed on the way; a blob that does not match its
manifest entry fails the build, naming the entry."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from sandboxd.core.snapshots import manifest as mf
from sandboxd.core.snapshots import sizes
from sandboxd.core.snapshots.info import SnapshotInfo
from sandboxd.core.snapshots.manifest import FILE, Entry, UnsafeSnapshot
from sandboxd.core.snapshots.packs import PackedBlobs, blob_key
from sandboxd.core.snapshots.reading import BATCH_BYTES
from sandboxd.errors import BackendError, NotFound

_TAR_CACHE_BYTES = 256 << 20
# Snapshots with more content than this are built into a file, streamed.
_MEMORY_TAR_BYTES = 64 << 20
# Written to the archive file in runs of about this much.
_WRITE_BYTES = 4 << 20


class Tars:
    """Builds restore archives from verified blobs; caches the small ones."""

    def __init__(self, blobs: PackedBlobs) -> None:
        self._blobs = blobs
        self._cached: OrderedDict[str, bytes] = OrderedDict()

    @staticmethod
    def streamed(entries: list[Entry]) -> bool:
        """Whether a restore of ``entries`` is built into a file, streamed
        (then ``tar`` needs ``to``), rather than in memory (and never cached)."""
        total = 0
        for e in entries:
            if e.kind == FILE:
                if e.size > sizes.INLINE_BYTES:
                    return True
                total += e.size
        return total > _MEMORY_TAR_BYTES

    async def tar(
        self, info: SnapshotInfo, entries: list[Entry], ns: str, to: Path | None = None
    ) -> bytes | None:
        """The snapshot's tar, built from its verified blobs: the cached bytes
        if there are some, else written to ``to`` when it is given (None is
        returned), else built (and cached) in memory. A streamed one
        (``streamed``) is always written to ``to``."""
        cached = self._cached.get(info.id)
        if cached is not None:
            self._cached.move_to_end(info.id)
            return cached
        if self.streamed(entries):
            if to is None:
                raise ValueError("a streamed restore archive needs a file to be written to")
            await self._write_streamed(info, entries, ns, to)
            return None
        digests = sorted({e.digest for e in entries if e.kind == FILE and e.size})
        try:
            blobs = await self._blobs.get_many([blob_key(ns, d) for d in digests])
        except NotFound as err:
            raise UnsafeSnapshot(f"snapshot {info.id} is corrupt: {err}") from err
        contents = {d: blobs[blob_key(ns, d)] for d in digests}
        for e in entries:
            if e.kind == FILE and e.size and len(contents[e.digest]) != e.size:
                raise _wrong_size(info, e, len(contents[e.digest]))
        # Verified while the tar is built (sha256 releases the GIL); a bad blob discards it.
        building = (
            asyncio.to_thread(mf.write_tar, to, entries, contents)
            if to is not None
            else asyncio.to_thread(mf.build_tar, entries, contents)
        )
        bad, tar = await asyncio.gather(asyncio.to_thread(_mismatches, contents), building)
        if bad:
            raise UnsafeSnapshot(
                f"snapshot {info.id} is corrupt: blob {bad[0]} does not match its digest "
                f"({len(bad)} bad blob(s)); nothing was restored"
            )
        if tar is not None and len(tar) <= _TAR_CACHE_BYTES // 2:
            self._cached[info.id] = tar
            while sum(len(t) for t in self._cached.values()) > _TAR_CACHE_BYTES:
                self._cached.popitem(last=False)
        return tar

    async def contents(self, info: SnapshotInfo, entries: list[Entry], ns: str) -> dict[str, bytes]:
        """The verified content of every non-empty file of ``entries``, by
        digest, in memory (a restore in rounds builds a tar per round)."""
        return await self._fetch(info, ns, [e for e in entries if e.kind == FILE and e.size])

    async def _write_streamed(self, info: SnapshotInfo, entries: list[Entry], ns: str, to: Path) -> None:
        """Writes the archive to new file ``to`` in bounded memory."""
        ordered = sorted(entries, key=lambda e: e.path)
        runs = list(_small_runs(ordered))
        fd = os.open(to, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        fh = os.fdopen(fd, "wb", buffering=1 << 20)
        ahead: asyncio.Task[dict[str, bytes]] | None = None
        try:
            os.fchmod(fd, 0o644)  # read by the sandbox user, whatever our umask
            pending = iter(runs)
            run = next(pending, None)
            if run is not None:
                ahead = asyncio.create_task(self._fetch(info, ns, run))
            current: dict[str, bytes] = {}
            left = 0  # small files of the current run not written yet
            parts: list[bytes] = []
            size = 0
            for e in ordered:
                parts.append(mf.tar_header(e))
                size += 512
                if e.kind == FILE and e.size > sizes.INLINE_BYTES:
                    await asyncio.to_thread(_write, fh, parts)
                    parts, size = [], 0
                    await self._copy_blob(info, ns, e, fh)
                    parts.append(mf.tar_padding(e.size))
                elif e.kind == FILE and e.size:
                    if not left:
                        assert ahead is not None and run is not None
                        current, left = await ahead, len(run)
                        run = next(pending, None)
                        ahead = asyncio.create_task(self._fetch(info, ns, run)) if run is not None else None
                    parts += (current[e.digest], mf.tar_padding(e.size))
                    size += e.size
                    left -= 1
                if size >= _WRITE_BYTES:
                    await asyncio.to_thread(_write, fh, parts)
                    parts, size = [], 0
            parts.append(mf.TAR_END)
            await asyncio.to_thread(_write, fh, parts)
            await asyncio.to_thread(fh.close)
        finally:
            if ahead is not None:
                ahead.cancel()
                await asyncio.gather(ahead, return_exceptions=True)
            with contextlib.suppress(OSError):
                fh.close()

    async def _fetch(self, info: SnapshotInfo, ns: str, run: list[Entry]) -> dict[str, bytes]:
        """The verified contents of a run of small files, by digest."""
        keys = [blob_key(ns, d) for d in dict.fromkeys(e.digest for e in run)]
        try:
            got = await self._blobs.get_many(keys)
        except NotFound as err:
            raise UnsafeSnapshot(f"snapshot {info.id} is corrupt: {err}") from err
        contents = {key.rsplit("/", 1)[1]: data for key, data in got.items()}
        for e in run:
            if len(contents[e.digest]) != e.size:
                raise _wrong_size(info, e, len(contents[e.digest]))
        bad = await asyncio.to_thread(_mismatches, contents)
        if bad:
            raise UnsafeSnapshot(
                f"snapshot {info.id} is corrupt: blob {bad[0]} does not match its digest; "
                "nothing was restored"
            )
        return contents

    async def _copy_blob(self, info: SnapshotInfo, ns: str, e: Entry, fh: BinaryIO) -> None:
        """Streams the blob of ``e`` into ``fh``, hashed and counted on the way."""
        sha = hashlib.sha256()
        count = 0
        try:
            async for piece in self._blobs.open_stream(blob_key(ns, e.digest), e.size):
                count += len(piece)
                if count > e.size:
                    break
                await asyncio.to_thread(_hash_write, fh, sha, piece)
        except NotFound as err:
            raise UnsafeSnapshot(f"snapshot {info.id} is corrupt: {err}") from err
        except BackendError as err:
            if "ends" not in str(err):
                raise
            raise UnsafeSnapshot(
                f"snapshot {info.id} is corrupt: the stored content of {mf.shown(e.path)} is shorter than "
                f"the {e.size} bytes its manifest records ({err}); nothing was restored"
            ) from err
        if count != e.size:
            raise _wrong_size(info, e, count)
        if sha.hexdigest() != e.digest:
            raise UnsafeSnapshot(
                f"snapshot {info.id} is corrupt: the stored content of {mf.shown(e.path)} does not match its "
                "digest; nothing was restored"
            )

    def forget(self, snapshot_id: str) -> None:
        """Drops the cached tar of a snapshot deleted or expired."""
        self._cached.pop(snapshot_id, None)

    def clear(self) -> None:
        """Drops every cached tar."""
        self._cached.clear()


def _small_runs(ordered: list[Entry]) -> Iterator[list[Entry]]:
    """The non-empty files up to sizes.INLINE_BYTES, in archive order, in runs of
    about BATCH_BYTES (content a later run needs again is fetched again)."""
    run: list[Entry] = []
    size = 0
    for e in ordered:
        if e.kind == FILE and 0 < e.size <= sizes.INLINE_BYTES:
            run.append(e)
            size += e.size
            if size >= BATCH_BYTES:
                yield run
                run, size = [], 0
    if run:
        yield run


def _wrong_size(info: SnapshotInfo, e: Entry, got: int) -> UnsafeSnapshot:
    return UnsafeSnapshot(
        f"snapshot {info.id} is corrupt: the stored content of {mf.shown(e.path)} holds "
        f"{'more than ' if got > e.size else ''}{got} bytes, its manifest records {e.size}; "
        "nothing was restored"
    )


def _write(fh: BinaryIO, parts: list[bytes]) -> None:
    fh.writelines(parts)


def _hash_write(fh: BinaryIO, sha: hashlib._Hash, piece: bytes) -> None:
    sha.update(piece)
    fh.write(piece)


def _mismatches(contents: dict[str, bytes]) -> list[str]:
    return [d for d, data in contents.items() if hashlib.sha256(data).hexdigest() != d]
