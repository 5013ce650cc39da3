"""The snapshot catalog's per-tenant usage: distinct blobs counted once,
kept up to date on insert and delete, enforced as a quota, and counted once
for a catalog written before the usage tables existed."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sandboxd import errors
from sandboxd.core.snapshot_catalog import SnapshotCatalog, SnapshotInfo

pytestmark = pytest.mark.timeout(30)


def info(sid: str, tenant: str = "t") -> SnapshotInfo:
    return SnapshotInfo(
        id=sid, tenant=tenant, pool="p", image="img", labels={}, policy_version=None, turn=0,
        parent_id="", session="", cwd="", env={}, size_bytes=0, stored_bytes=0, entry_count=0,
        digest="", created_at=0.0, expires_at=1e12,
    )  # fmt: skip


@pytest.fixture
async def catalog(tmp_path: Path) -> AsyncIterator[SnapshotCatalog]:
    c = SnapshotCatalog(tmp_path / "c.sqlite3")
    await c.open()
    try:
        yield c
    finally:
        await c.close()


async def test_usage_counts_distinct_blobs_and_follows_deletes(catalog: SnapshotCatalog) -> None:
    assert await catalog.insert(info("a"), b"m", {"k1": 100, "k2": 10}, 0) == 110
    assert await catalog.insert(info("b"), b"m", {"k2": 10, "k3": 1}, 0) == 111
    assert await catalog.insert(info("c", tenant="u"), b"m", {"k1": 100}, 0) == 100
    assert await catalog.usage("t") == 111 and await catalog.usage("u") == 100
    assert await catalog.delete("a")
    assert await catalog.usage("t") == 11, "k2 is still referenced by b"
    assert await catalog.delete_expired(2e12) == ["b", "c"]
    assert await catalog.usage("t") == 0 and await catalog.usage("u") == 0


async def test_quota_refuses_and_leaves_nothing(catalog: SnapshotCatalog) -> None:
    await catalog.insert(info("a"), b"m", {"k1": 100}, 150)
    with pytest.raises(errors.ResourceExhausted, match="quota"):
        await catalog.insert(info("b"), b"m", {"k1": 100, "k2": 60}, 150)
    assert await catalog.get("b") is None
    assert await catalog.usage("t") == 100
    assert await catalog.insert(info("c"), b"m", {"k1": 100, "k2": 50}, 150) == 150


async def test_a_catalog_from_before_the_usage_tables_is_counted_on_open(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    db = sqlite3.connect(path)
    db.executescript(
        """
        CREATE TABLE snapshots (id TEXT PRIMARY KEY, tenant TEXT NOT NULL, created_at REAL NOT NULL,
          expires_at REAL NOT NULL, meta TEXT NOT NULL, manifest BLOB NOT NULL);
        CREATE TABLE refs (snapshot_id TEXT NOT NULL, key TEXT NOT NULL, size INTEGER NOT NULL,
          PRIMARY KEY (snapshot_id, key));
        CREATE INDEX refs_key ON refs(key);
        """
    )
    for sid in ("a", "b"):
        db.execute("INSERT INTO snapshots VALUES (?, 't', 0, 1e12, ?, x'00')", (sid, info(sid).to_json()))
    db.executemany("INSERT INTO refs VALUES (?, ?, ?)", [("a", "k1", 7), ("b", "k1", 7), ("b", "k2", 5)])
    db.commit()
    db.close()
    catalog = SnapshotCatalog(path)
    await catalog.open()
    try:
        assert await catalog.usage("t") == 12
        await catalog.delete("b")
        assert await catalog.usage("t") == 7
    finally:
        await catalog.close()
