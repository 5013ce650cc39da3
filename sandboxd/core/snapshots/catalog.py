"""The snapshot catalog: metadata, manifests and blob references of every
snapshot in SQLite (``state_dir/<instance>-snapshots.sqlite3``), so lineage,
listing by labels, per-tenant usage and the garbage collector's mark phase
are queries. Blob contents live in a BlobStore, packed
(sandboxd.core.snapshots.packs): the catalog also indexes where in which pack
each blob lies. All access goes through one worker thread, as in
sandboxd.core.store.

A snapshot taken on top of another (its *base*) records only a delta: the
manifest entries it changed and the blobs they reference. Its base's row,
manifest and references then stay for as long as the delta does: deleting or
expiring a snapshot something still builds on (or that an operation in flight
has pinned) *hides* it (no longer listed or restorable, its blobs still
referenced) until the last dependent is gone. Chains are bounded by
MAX_DEPTH (past it a snapshot is recorded in full)."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path
from typing import Any

from sandboxd.core.snapshots import manifest as mf
from sandboxd.core.snapshots.info import SnapshotInfo
from sandboxd.core.sqlite import SqliteThread
from sandboxd.errors import FailedPrecondition, ResourceExhausted

_SCHEMA = """
CREATE TABLE IF NOT EXISTS snapshots (
  id TEXT PRIMARY KEY, tenant TEXT NOT NULL, created_at REAL NOT NULL,
  expires_at REAL NOT NULL, meta TEXT NOT NULL, manifest BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS snapshots_tenant ON snapshots(tenant);
-- base, hidden and depth columns are added by _migrate (older catalogs lack them).
CREATE TABLE IF NOT EXISTS refs (
  snapshot_id TEXT NOT NULL, key TEXT NOT NULL, size INTEGER NOT NULL,
  PRIMARY KEY (snapshot_id, key)
) WITHOUT ROWID;
-- Only the collector reads refs by key, and it reads them all.
DROP INDEX IF EXISTS refs_key;
CREATE TABLE IF NOT EXISTS packed (
  key TEXT PRIMARY KEY, pack TEXT NOT NULL, offset INTEGER NOT NULL, size INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS packed_pack ON packed(pack);
-- Each tenant's distinct blobs with how many of its snapshots reference them,
-- and their total kept up to date by triggers: the quota check reads one row
-- instead of scanning every reference of every snapshot.
CREATE TABLE IF NOT EXISTS tenant_blobs (
  tenant TEXT NOT NULL, key TEXT NOT NULL, size INTEGER NOT NULL, n INTEGER NOT NULL,
  PRIMARY KEY (tenant, key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS tenant_usage (tenant TEXT PRIMARY KEY, bytes INTEGER NOT NULL);
-- Additions are summed once per snapshot by the insert itself: a trigger per
-- new row cost about 8 microseconds each, 40 ms for a 5,000-file snapshot.
DROP TRIGGER IF EXISTS tenant_blobs_added;
CREATE TRIGGER IF NOT EXISTS tenant_blobs_dropped AFTER DELETE ON tenant_blobs BEGIN
  UPDATE tenant_usage SET bytes = bytes - OLD.size WHERE tenant = OLD.tenant;
END;
"""
log = logging.getLogger(__name__)

# SQLite's default limit on host parameters is 999 in older builds.
_CHUNK = 900
MAX_DEPTH = 16
"""Longest chain of deltas behind a snapshot; a restore reads this many
small manifests at most."""


class BaseGone(Exception):
    """The base a delta was to be recorded on no longer exists."""


def _migrate(db: sqlite3.Connection) -> None:
    columns = {r[1] for r in db.execute("PRAGMA table_info(snapshots)")}
    with db:
        if "base" not in columns:
            db.execute("ALTER TABLE snapshots ADD COLUMN base TEXT")
            db.execute("ALTER TABLE snapshots ADD COLUMN hidden INTEGER NOT NULL DEFAULT 0")
            db.execute("ALTER TABLE snapshots ADD COLUMN depth INTEGER NOT NULL DEFAULT 0")
        db.execute("CREATE INDEX IF NOT EXISTS snapshots_base ON snapshots(base) WHERE base IS NOT NULL")
    if db.execute("SELECT 1 FROM tenant_usage LIMIT 1").fetchone() is None:
        with db:  # a catalog from before the usage tables: count once
            db.execute(
                "INSERT INTO tenant_blobs SELECT s.tenant, r.key, MAX(r.size), COUNT(*) FROM refs r "
                "JOIN snapshots s ON s.id = r.snapshot_id GROUP BY s.tenant, r.key"
            )
            db.execute("INSERT INTO tenant_usage SELECT tenant, SUM(size) FROM tenant_blobs GROUP BY tenant")


class SnapshotCatalog:
    """Snapshot metadata, manifests, blob references and the pack index, in SQLite."""

    def __init__(self, path: Path | None) -> None:
        """``path`` None keeps the catalog in memory (tests, throw-away servers)."""
        self._sql = SqliteThread(path, "sandboxd-catalog")
        self._run = self._sql.run
        self._unreadable: set[str] = set()

    async def open(self) -> None:
        """Opens (creating or migrating) the database."""
        await self._sql.open(_SCHEMA, _migrate)

    async def close(self) -> None:
        """Closes the database after the statements already asked for have run."""
        await self._sql.close()

    @property
    def db(self) -> sqlite3.Connection:
        """The connection; only for code running on the catalog's worker thread."""
        return self._sql.db

    # -- writes ---------------------------------------------------------------

    async def insert(
        self, info: SnapshotInfo, manifest: bytes, refs: dict[str, int], quota: int, base: str = ""
    ) -> int:
        """Records a snapshot and its blob references in one transaction; with
        ``quota`` > 0, refuses (ResourceExhausted) when the tenant's stored
        bytes would pass it. With ``base``, ``manifest`` is a delta on that
        snapshot's and ``refs`` what the delta adds (BaseGone if its row is
        gone, hidden or not). Returns the tenant's usage afterwards."""
        usage: int = await self._run(self._insert_sync, info, manifest, refs, quota, base)
        return usage

    def _insert_sync(
        self, info: SnapshotInfo, manifest: bytes, refs: dict[str, int], quota: int, base: str
    ) -> int:
        db = self.db
        with db:
            depth = 0
            if base:
                row = db.execute("SELECT depth FROM snapshots WHERE id = ?", (base,)).fetchone()
                if row is None:
                    raise BaseGone(base)
                depth = int(row[0]) + 1
            db.execute(
                "INSERT INTO snapshots (id, tenant, created_at, expires_at, meta, manifest, base, depth) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    info.id, info.tenant, info.created_at, info.expires_at, info.to_json(), manifest,
                    base or None, depth,
                ),
            )  # fmt: skip
            db.executemany(
                "INSERT INTO refs VALUES (?, ?, ?)", [(info.id, k, size) for k, size in refs.items()]
            )
            known: set[str] = set()
            keys = list(refs)
            for i in range(0, len(keys), _CHUNK):
                part = keys[i : i + _CHUNK]
                marks = ",".join("?" * len(part))
                known.update(
                    r[0]
                    for r in db.execute(
                        f"SELECT key FROM tenant_blobs WHERE tenant = ? AND key IN ({marks})",
                        (info.tenant, *part),
                    )
                )
            db.executemany(
                "UPDATE tenant_blobs SET n = n + 1 WHERE tenant = ? AND key = ?",
                [(info.tenant, k) for k in known],
            )
            new = [(info.tenant, k, size, 1) for k, size in refs.items() if k not in known]
            db.executemany("INSERT INTO tenant_blobs VALUES (?, ?, ?, ?)", new)
            db.execute(
                "INSERT INTO tenant_usage VALUES (?, ?) ON CONFLICT(tenant) DO UPDATE SET bytes = bytes + ?",
                (info.tenant, sum(r[2] for r in new), sum(r[2] for r in new)),
            )
            usage = self._usage_sync(info.tenant)
            if quota and usage > quota:
                db.rollback()
                raise ResourceExhausted(
                    f"snapshot quota of tenant {info.tenant!r} exceeded: this snapshot would bring its "
                    f"stored bytes to {usage} (quota {quota}); delete snapshots or let them expire"
                )
        return usage

    async def delete(self, snapshot_id: str, keep: frozenset[str] = frozenset()) -> bool:
        """Removes a visible snapshot: hidden if another builds on it or it is
        in ``keep`` (pinned), purged otherwise. False if it was not visible."""
        removed: list[str] = await self._run(self._remove_sync, [snapshot_id], keep)
        return bool(removed)

    def _remove_sync(self, ids: list[str], keep: frozenset[str]) -> list[str]:
        db = self.db
        removed: list[str] = []
        with db:
            for sid in ids:
                row = db.execute("SELECT 1 FROM snapshots WHERE id = ? AND hidden = 0", (sid,)).fetchone()
                if row is None:
                    continue
                removed.append(sid)
                if sid in keep or self._has_dependents(sid):
                    db.execute("UPDATE snapshots SET hidden = 1 WHERE id = ?", (sid,))
                else:
                    self._purge(sid, keep)
        return removed

    def _has_dependents(self, sid: str) -> bool:
        return (
            self.db.execute("SELECT 1 FROM snapshots WHERE base = ? LIMIT 1", (sid,)).fetchone() is not None
        )

    def _purge(self, sid: str, keep: frozenset[str]) -> None:
        """Drops a row and its references, then its base too if that is
        hidden and nothing else needs it."""
        db = self.db
        while sid:
            row = db.execute("SELECT tenant, base FROM snapshots WHERE id = ?", (sid,)).fetchone()
            if row is None:
                return
            tenant, base = row
            mine = "SELECT key FROM refs WHERE snapshot_id = ?"
            db.execute(
                f"UPDATE tenant_blobs SET n = n - 1 WHERE tenant = ? AND key IN ({mine})", (tenant, sid)
            )
            db.execute(
                f"DELETE FROM tenant_blobs WHERE tenant = ? AND n <= 0 AND key IN ({mine})", (tenant, sid)
            )
            db.execute("DELETE FROM snapshots WHERE id = ?", (sid,))
            db.execute("DELETE FROM refs WHERE snapshot_id = ?", (sid,))
            sid = ""
            if base and base not in keep and not self._has_dependents(base):
                hidden = db.execute("SELECT hidden FROM snapshots WHERE id = ?", (base,)).fetchone()
                if hidden is not None and hidden[0]:
                    sid = base

    async def delete_expired(self, now: float, keep: frozenset[str] = frozenset()) -> list[str]:
        """Removes (as delete does) every visible snapshot past its expiry."""
        ids: list[str] = await self._run(self._delete_expired_sync, now, keep)
        return ids

    def _delete_expired_sync(self, now: float, keep: frozenset[str]) -> list[str]:
        ids = [
            r[0]
            for r in self.db.execute("SELECT id FROM snapshots WHERE expires_at <= ? AND hidden = 0", (now,))
        ]
        return self._remove_sync(ids, keep) if ids else []

    async def sweep_hidden(self, keep: frozenset[str] = frozenset()) -> int:
        """Purges hidden snapshots nothing builds on any more and nobody has
        pinned (a pin released after the delete); returns how many."""
        n: int = await self._run(self._sweep_hidden_sync, keep)
        return n

    def _sweep_hidden_sync(self, keep: frozenset[str]) -> int:
        db = self.db
        n = 0
        with db:
            for (sid,) in db.execute(
                "SELECT id FROM snapshots s WHERE hidden = 1 "
                "AND NOT EXISTS (SELECT 1 FROM snapshots d WHERE d.base = s.id)"
            ).fetchall():
                if sid not in keep:
                    self._purge(sid, keep)
                    n += 1
        return n

    # -- reads ----------------------------------------------------------------

    async def get(self, snapshot_id: str) -> SnapshotInfo | None:
        """The snapshot's metadata, unless it is hidden or unknown (expiry is
        the caller's check); FailedPrecondition for a record that cannot be read."""
        row = await self._run(
            self._one, "SELECT CAST(meta AS BLOB) FROM snapshots WHERE id = ? AND hidden = 0", (snapshot_id,)
        )
        if row is None:
            return None
        info = self._decoded(snapshot_id, row[0])
        if info is None:
            raise FailedPrecondition(f"snapshot {snapshot_id}: its record cannot be read; it cannot be used")
        return info

    async def tenant_of(self, snapshot_id: str) -> str | None:
        """The tenant of a visible snapshot's row, readable or not."""
        sql = "SELECT tenant FROM snapshots WHERE id = ? AND hidden = 0"
        row = await self._run(self._one, sql, (snapshot_id,))
        return None if row is None else str(row[0])

    def _decoded(self, snapshot_id: str, meta: bytes) -> SnapshotInfo | None:
        """A row's metadata, or None for one that cannot be decoded (logged
        once): a single bad record must not fail every listing of its tenant."""
        try:
            return SnapshotInfo.from_json(bytes(meta).decode("utf-8"))
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            if snapshot_id not in self._unreadable:
                self._unreadable.add(snapshot_id)
                log.error("snapshot %s: its catalog record cannot be decoded (%s); left out", snapshot_id, e)
            return None

    async def manifest(self, snapshot_id: str) -> bytes | None:
        """The stored manifest as it is (complete or a delta)."""
        row = await self._run(self._one, "SELECT manifest FROM snapshots WHERE id = ?", (snapshot_id,))
        return None if row is None else bytes(row[0])

    async def entries(self, snapshot_id: str) -> dict[str, mf.Entry] | None:
        """The snapshot's complete manifest (path -> entry), its deltas
        resolved; None if it has no row. UnsafeSnapshot if unreadable."""
        out: dict[str, mf.Entry] | None = await self._run(self._entries_sync, snapshot_id)
        return out

    def _entries_sync(self, snapshot_id: str) -> dict[str, mf.Entry] | None:
        chain: list[bytes] = []
        sid: str | None = snapshot_id
        while sid:
            row = self.db.execute("SELECT manifest, base FROM snapshots WHERE id = ?", (sid,)).fetchone()
            if row is None:
                if not chain:
                    return None
                raise mf.UnsafeSnapshot(f"snapshot {snapshot_id}: the base {sid} of its manifest is missing")
            chain.append(bytes(row[0]))
            sid = row[1]
            if len(chain) > MAX_DEPTH + 1:
                raise mf.UnsafeSnapshot(f"snapshot {snapshot_id}: manifest chain too long")
        out = {e.path: e for e in mf.decode(chain.pop())}
        while chain:
            out = mf.apply_delta(out, chain.pop())
        return out

    async def exists(self, snapshot_id: str) -> bool:
        """Whether the snapshot is visible (not deleted, expired or hidden)."""
        row = await self._run(
            self._one, "SELECT 1 FROM snapshots WHERE id = ? AND hidden = 0", (snapshot_id,)
        )
        return row is not None

    async def depth(self, snapshot_id: str) -> int | None:
        """Deltas behind the snapshot's manifest, None if it has no row (a
        hidden one has: what it references is still kept)."""
        row = await self._run(self._one, "SELECT depth FROM snapshots WHERE id = ?", (snapshot_id,))
        return None if row is None else int(row[0])

    def _one(self, sql: str, params: tuple[Any, ...]) -> tuple[Any, ...] | None:
        row: tuple[Any, ...] | None = self.db.execute(sql, params).fetchone()
        return row

    async def list_infos(self, tenant: str, now: float) -> list[SnapshotInfo]:
        """The tenant's visible snapshots unexpired at ``now``, oldest first."""
        rows = await self._run(
            self._all,
            "SELECT id, CAST(meta AS BLOB) FROM snapshots WHERE tenant = ? AND expires_at > ? AND hidden = 0 "
            "ORDER BY created_at",
            (tenant, now),
        )
        infos = (self._decoded(sid, meta) for sid, meta in rows)
        return [info for info in infos if info is not None]

    def _all(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        return list(self.db.execute(sql, params).fetchall())

    async def usage(self, tenant: str) -> int:
        """Bytes of distinct blobs the tenant's snapshots reference."""
        usage: int = await self._run(self._usage_sync, tenant)
        return usage

    def _usage_sync(self, tenant: str) -> int:
        row = self.db.execute("SELECT bytes FROM tenant_usage WHERE tenant = ?", (tenant,)).fetchone()
        return int(row[0]) if row else 0

    async def referenced(self, tenant: str, keys: list[str]) -> set[str]:
        """Those of ``keys`` (of ``tenant``'s namespace) that some snapshot
        of the tenant references, hidden ones included."""
        out: set[str] = await self._run(self._referenced_sync, tenant, keys)
        return out

    def _referenced_sync(self, tenant: str, keys: list[str]) -> set[str]:
        out: set[str] = set()
        for i in range(0, len(keys), _CHUNK):
            part = keys[i : i + _CHUNK]
            marks = ",".join("?" * len(part))
            out.update(
                r[0]
                for r in self.db.execute(
                    f"SELECT key FROM tenant_blobs WHERE tenant = ? AND key IN ({marks})", (tenant, *part)
                )
            )
        return out

    async def live_keys(self) -> set[str]:
        """Every blob key some snapshot still references (the GC's mark set)."""
        rows = await self._run(self._all, "SELECT DISTINCT key FROM refs", ())
        return {r[0] for r in rows}

    # -- pack index (sandboxd.core.snapshots.packs) ------------------------------

    async def locate(self, keys: list[str]) -> dict[str, tuple[str, int, int]]:
        """(pack, offset, size) of each of ``keys`` that lies in a pack."""
        out: dict[str, tuple[str, int, int]] = await self._run(self._locate_sync, keys)
        return out

    def _locate_sync(self, keys: list[str]) -> dict[str, tuple[str, int, int]]:
        out: dict[str, tuple[str, int, int]] = {}
        for i in range(0, len(keys), _CHUNK):
            part = keys[i : i + _CHUNK]
            marks = ",".join("?" * len(part))
            for key, pack, offset, size in self.db.execute(
                f"SELECT key, pack, offset, size FROM packed WHERE key IN ({marks})", part
            ):
                out[key] = (pack, offset, size)
        return out

    async def add_packed(self, pack: str, rows: list[tuple[str, int, int]]) -> None:
        """Indexes (key, offset, size) rows of ``pack``; a key already packed
        elsewhere keeps its first location."""
        await self._run(self._add_packed_sync, pack, rows)

    def _add_packed_sync(self, pack: str, rows: list[tuple[str, int, int]]) -> None:
        with self.db:
            self.db.executemany(
                "INSERT OR IGNORE INTO packed VALUES (?, ?, ?, ?)", [(k, pack, o, n) for k, o, n in rows]
            )

    async def packed_keys(self, prefix: str) -> list[str]:
        """Logical keys under ``prefix`` that lie in a pack."""
        rows = await self._run(
            self._all, "SELECT key FROM packed WHERE substr(key, 1, ?) = ?", (len(prefix), prefix)
        )
        return [r[0] for r in rows]

    async def packs(self) -> set[str]:
        """Every pack the index knows."""
        rows = await self._run(self._all, "SELECT DISTINCT pack FROM packed", ())
        return {r[0] for r in rows}

    async def unpack(self, keys: list[str]) -> list[str]:
        """Drops the index rows of ``keys``; returns the packs that no longer
        hold any indexed blob (to be deleted)."""
        emptied: list[str] = await self._run(self._unpack_sync, keys)
        return emptied

    def _unpack_sync(self, keys: list[str]) -> list[str]:
        db = self.db
        touched: set[str] = set()
        with db:
            for i in range(0, len(keys), _CHUNK):
                part = keys[i : i + _CHUNK]
                marks = ",".join("?" * len(part))
                touched.update(
                    r[0] for r in db.execute(f"SELECT DISTINCT pack FROM packed WHERE key IN ({marks})", part)
                )
                db.execute(f"DELETE FROM packed WHERE key IN ({marks})", part)
        return [
            p
            for p in sorted(touched)
            if db.execute("SELECT 1 FROM packed WHERE pack = ? LIMIT 1", (p,)).fetchone() is None
        ]
