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
"""

from __future__ import annotations

import secrets
from collections import defaultdict
from collections.abc import Mapping, Sequence

from sandboxd.core.snapshot_catalog import SnapshotCatalog
from sandboxd.stores.base import BlobStore

_PACKS = "packs"


def _namespace(key: str) -> str:
    return key.split("/", 1)[0]


def _is_pack(key: str) -> bool:
    parts = key.split("/")
    return len(parts) == 3 and parts[1] == _PACKS


class PackedBlobs:
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

    async def _may_hold_loose(self) -> bool:
        if self._loose is None:
            self._loose = any(not _is_pack(k) for k in await self.store.list_keys())
        return self._loose

    async def get_many(self, keys: Sequence[str]) -> dict[str, bytes]:
        wanted = list(dict.fromkeys(keys))
        located = await self._catalog.locate(wanted)
        out = await self.store.get_many([k for k in wanted if k not in located])
        by_pack: dict[str, list[tuple[str, int, int]]] = defaultdict(list)
        for key, (pack, offset, size) in located.items():
            by_pack[pack].append((key, offset, size))
        for pack, items in by_pack.items():
            items.sort(key=lambda item: item[1])
            datas = await self.store.get_ranges(pack, [(offset, size) for _, offset, size in items])
            out.update((key, data) for (key, _, _), data in zip(items, datas, strict=True))
        return out

    async def missing(self, keys: Sequence[str]) -> set[str]:
        wanted = list(dict.fromkeys(keys))
        located = await self._catalog.locate(wanted)
        rest = [k for k in wanted if k not in located]
        return await self.store.missing(rest) if rest else set()

    async def delete_many(self, keys: Sequence[str]) -> None:
        wanted = list(dict.fromkeys(keys))
        if not wanted:
            return
        located = await self._catalog.locate(wanted)
        emptied = await self._catalog.unpack(list(located))
        await self.store.delete_many(
            [p for p in emptied if p not in self._writing] + [k for k in wanted if k not in located]
        )

    async def list_keys(self, prefix: str = "") -> list[str]:
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
        await self.store.close()
