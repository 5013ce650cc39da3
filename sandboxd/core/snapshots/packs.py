"""Snapshot blobs stored in packs: the new file contents of one capture batch
are concatenated into one stored object, and the catalog indexes where each
content-addressed blob lies in which pack.

Why: a snapshot of thousands of small files as one object per file costs a
file creation (or an S3 PUT) per file, which dominated the capture; a pack
costs one. Deduplication stays per file (a blob already indexed is never
written again), so incremental snapshots still store only what changed.

The layer keeps the BlobStore interface over *logical* keys
(``<namespace>/<aa>/<sha256>``), so the snapshot core, its pins and its
garbage collector work unchanged: deleting a logical key drops its index row,
and a pack is deleted once no indexed blob lies in it. Bytes of dropped blobs
inside a pack that still holds live ones stay until the pack empties
(``dead_bytes`` reports them). Blobs stored loose by earlier versions are
still read, listed and deleted.

A blob too large for a batch (a file above reading.INLINE_BYTES) is streamed
into a pack of its own and hashed on the way (``put_stream``); its key is
known only at its end, when it is indexed, or dropped if that content was
stored already. Any blob can be read back as a stream (``open_stream``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import secrets
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence

from sandboxd.core.snapshots.catalog import SnapshotCatalog
from sandboxd.stores.base import BlobStore

_PACKS = "packs"
# Ranges of one pack read in one request while the gap between them stays
# below _GAP_BYTES and the request below _SPAN_BYTES: adjacent blobs cost one
# round trip, and no read spans a large blob nobody asked for.
_GAP_BYTES = 1 << 20
_SPAN_BYTES = 32 << 20


def _namespace(key: str) -> str:
    return key.split("/", 1)[0]


def _is_pack(key: str) -> bool:
    parts = key.split("/")
    return len(parts) == 3 and parts[1] == _PACKS


@functools.lru_cache(maxsize=1024)
def tenant_namespace(tenant: str) -> str:
    """The key prefix of a tenant's blobs (a hash: tenant names never shape store keys)."""
    return hashlib.sha256(tenant.encode()).hexdigest()[:16]


def blob_key(namespace: str, digest: str) -> str:
    """The logical key of the blob whose content has sha256 ``digest``."""
    return f"{namespace}/{digest[:2]}/{digest}"


class PackedBlobs:
    """A BlobStore over logical keys whose new blobs are written in packs."""

    def __init__(self, store: BlobStore, catalog: SnapshotCatalog) -> None:
        self.store = store
        self._catalog = catalog
        # Packs written but not indexed yet: the orphan sweep must not take them.
        self._writing: set[str] = set()
        # Whether the store may hold loose blobs of earlier versions (None:
        # not looked yet). Nothing writes loose blobs any more, so a store
        # found without any never has to be asked about each key again.
        self._loose: bool | None = None

    async def put_absent(self, blobs: Mapping[str, bytes]) -> int:
        """Writes the blobs not stored yet, one pack per namespace."""
        if not blobs:
            return 0
        keys = list(blobs)
        packed = await self._catalog.locate(keys)
        rest = [k for k in keys if k not in packed]
        if rest and await self._may_hold_loose():
            absent = await self.store.missing(rest)
            rest = [k for k in rest if k in absent]
        by_ns: dict[str, list[str]] = defaultdict(list)
        for key in rest:
            by_ns[_namespace(key)].append(key)
        written = 0
        for ns, new in by_ns.items():
            pack = f"{ns}/{_PACKS}/{secrets.token_hex(12)}"
            rows: list[tuple[str, int, int]] = []
            offset = 0
            for key in new:
                size = len(blobs[key])
                rows.append((key, offset, size))
                offset += size
            self._writing.add(pack)
            try:
                await self.store.put_parts(pack, [blobs[k] for k in new])
                await self._catalog.add_packed(pack, rows)
            finally:
                self._writing.discard(pack)
            written += offset
        return written

    async def put_stream(
        self, ns: str, chunks: AsyncIterator[bytes], size: int, pin: Callable[[str], Awaitable[None]]
    ) -> tuple[str, int]:
        """Stores a blob of ``size`` bytes streamed from ``chunks`` as a pack
        of its own, hashing it on the way: (its sha256, bytes written, 0 when
        that content was stored already). ``pin`` pins its key once it is
        known, before it is looked up (as callers of put_absent pin theirs
        first), so the collector cannot take it in between."""
        pack = f"{ns}/{_PACKS}/{secrets.token_hex(12)}"
        sha = hashlib.sha256()

        async def hashed() -> AsyncIterator[bytes]:
            async for chunk in chunks:
                await asyncio.to_thread(sha.update, chunk)  # sha256 releases the GIL
                yield chunk

        self._writing.add(pack)
        indexed = False
        try:
            await self.store.put_stream(pack, hashed(), size)
            digest = sha.hexdigest()
            key = blob_key(ns, digest)
            await pin(key)
            if key in await self._catalog.locate([key]) or (
                await self._may_hold_loose() and not await self.store.missing([key])
            ):
                return digest, 0  # stored already: this copy goes
            await self._catalog.add_packed(pack, [(key, 0, size)])
            indexed = True
            return digest, size
        finally:
            self._writing.discard(pack)
            if not indexed:
                # Not indexed, the copy is garbage; one a crash leaves the sweep takes.
                with contextlib.suppress(Exception):
                    await self.store.delete_many([pack])

    def open_stream(self, key: str, size: int) -> AsyncIterator[bytes]:
        """Blob ``key`` (``size`` bytes as recorded) in bounded pieces;
        NotFound if it is not stored."""
        return self._stream(key, size)

    async def _stream(self, key: str, size: int) -> AsyncIterator[bytes]:
        located = (await self._catalog.locate([key])).get(key)
        if located is None:
            source = self.store.read_stream(key, 0, size)  # loose, from an earlier version
        else:
            pack, offset, _ = located
            source = self.store.read_stream(pack, offset, size)
        try:
            async for piece in source:
                yield piece
        finally:
            await source.aclose()  # type: ignore[attr-defined]

    async def _may_hold_loose(self) -> bool:
        if self._loose is None:
            self._loose = any(not _is_pack(k) for k in await self.store.list_keys())
        return self._loose

    async def get_many(self, keys: Sequence[str]) -> dict[str, bytes]:
        """The blobs' contents, nearby blobs of a pack in one ranged read; NotFound if one is missing."""
        wanted = list(dict.fromkeys(keys))
        located = await self._catalog.locate(wanted)
        out = await self.store.get_many([k for k in wanted if k not in located])
        by_pack: dict[str, list[tuple[str, int, int]]] = defaultdict(list)
        for key, (pack, offset, size) in located.items():
            by_pack[pack].append((key, offset, size))
        for pack, items in by_pack.items():
            items.sort(key=lambda item: item[1])
            for run in _runs(items):
                datas = await self.store.get_ranges(pack, [(offset, size) for _, offset, size in run])
                out.update((key, data) for (key, _, _), data in zip(run, datas, strict=True))
        return out

    async def missing(self, keys: Sequence[str]) -> set[str]:
        """Which of ``keys`` are neither indexed in a pack nor stored loose."""
        wanted = list(dict.fromkeys(keys))
        located = await self._catalog.locate(wanted)
        rest = [k for k in wanted if k not in located]
        return await self.store.missing(rest) if rest else set()

    async def delete_many(self, keys: Sequence[str]) -> None:
        """Drops the keys' index rows, then deletes loose blobs and packs left empty (unless in writing)."""
        wanted = list(dict.fromkeys(keys))
        if not wanted:
            return
        located = await self._catalog.locate(wanted)
        emptied = await self._catalog.unpack(list(located))
        await self.store.delete_many(
            [p for p in emptied if p not in self._writing] + [k for k in wanted if k not in located]
        )

    async def list_keys(self, prefix: str = "") -> list[str]:
        """Every logical key under ``prefix``, packed or loose, sorted; packs themselves are not listed."""
        loose = [k for k in await self.store.list_keys(prefix) if not _is_pack(k)]
        return sorted(set(loose).union(await self._catalog.packed_keys(prefix)))

    async def sweep_packs(self) -> int:
        """Deletes stored packs the index does not know (a crash between
        writing a pack and indexing it); returns how many."""
        # Order matters: a listed pack was stored before the listing; if it is
        # not being written when the listing returns, its index rows were
        # committed before the index is read below.
        stored = [k for k in await self.store.list_keys() if _is_pack(k)]
        writing = set(self._writing)
        indexed = await self._catalog.packs()
        orphans = [k for k in stored if k not in indexed and k not in writing]
        await self.store.delete_many(orphans)
        return len(orphans)

    async def close(self) -> None:
        """Closes the underlying store; the catalog stays open."""
        await self.store.close()


def _runs(items: list[tuple[str, int, int]]) -> list[list[tuple[str, int, int]]]:
    """(key, offset, size) items of one pack, sorted by offset, in runs that
    one ranged read each serves (see _GAP_BYTES)."""
    runs: list[list[tuple[str, int, int]]] = []
    start = end = 0
    for item in items:
        _, offset, size = item
        if runs and offset - end <= _GAP_BYTES and offset + size - start <= _SPAN_BYTES:
            runs[-1].append(item)
            end = max(end, offset + size)
        else:
            runs.append([item])
            start, end = offset, offset + size
    return runs
