"""The snapshot catalog's per-tenant usage: distinct blobs counted once,
kept up to date on insert and delete, enforced as a quota, and counted once
for a catalog written before the usage tables existed; deltas resolved on
their bases, which are hidden rather than dropped while something needs them."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sandboxd import errors
from sandboxd.core.snapshots import manifest as mf
from sandboxd.core.snapshots.catalog import BaseGone, SnapshotCatalog
from sandboxd.core.snapshots.info import SnapshotInfo

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


def E(path: str, digest: str = "", kind: str = mf.FILE, size: int = 1) -> mf.Entry:
    return mf.Entry(path, kind, 0o644 if kind == mf.FILE else 0o755, size if kind == mf.FILE else 0, digest)


async def test_a_delta_resolves_on_its_base_and_keeps_it_while_it_lives(catalog: SnapshotCatalog) -> None:
    base = [E("d", kind=mf.DIR), E("d/a", "1" * 64), E("d/b", "2" * 64), E("keep", "3" * 64)]
    await catalog.insert(info("a"), mf.encode(base), {"k1": 1, "k2": 1, "k3": 1}, 0)
    delta = mf.encode_delta([E("d/b", "4" * 64), E("new", "5" * 64)], ["d/a"])
    await catalog.insert(info("b"), delta, {"k4": 1, "k5": 1}, 0, base="a")
    assert mf.is_delta((await catalog.manifest("b")) or b"")
    resolved = await catalog.entries("b")
    assert resolved is not None
    assert {p: e.digest[:1] for p, e in resolved.items() if e.kind == mf.FILE} == {
        "d/b": "4", "keep": "3", "new": "5",
    }  # fmt: skip
    assert await catalog.depth("b") == 1
    # Deleting the base hides it: gone for clients, still there for the delta.
    assert await catalog.delete("a")
    assert await catalog.get("a") is None and not await catalog.exists("a")
    assert [i.id for i in await catalog.list_infos("t", 0)] == ["b"]
    assert not await catalog.delete("a"), "a hidden snapshot is not deleted twice"
    assert await catalog.entries("b") == resolved
    assert {"k1", "k2", "k3", "k4", "k5"} <= await catalog.live_keys()
    assert await catalog.usage("t") == 5
    # The last dependent gone, the hidden base goes with it.
    assert await catalog.delete("b")
    assert await catalog.depth("a") is None and await catalog.live_keys() == set()
    assert await catalog.usage("t") == 0


async def test_a_delta_on_a_base_that_is_gone_is_refused(catalog: SnapshotCatalog) -> None:
    with pytest.raises(BaseGone):
        await catalog.insert(info("b"), mf.encode_delta([], []), {}, 0, base="nope")
    assert await catalog.depth("b") is None


async def test_pinned_and_expired_snapshots_are_hidden_then_swept(catalog: SnapshotCatalog) -> None:
    await catalog.insert(info("a"), mf.encode([E("x", "1" * 64)]), {"k1": 1}, 0)
    await catalog.insert(info("p"), mf.encode([E("y", "2" * 64)]), {"k2": 1}, 0)
    assert await catalog.delete("p", keep=frozenset({"p"}))
    assert await catalog.depth("p") == 0, "pinned: hidden, not purged"
    assert await catalog.sweep_hidden(frozenset({"p"})) == 0
    assert await catalog.sweep_hidden() == 1
    assert await catalog.depth("p") is None
    # Expiry of a base something builds on hides it the same way.
    await catalog.insert(info("c"), mf.encode_delta([E("z", "3" * 64)], []), {"k3": 1}, 0, base="a")
    assert sorted(await catalog.delete_expired(2e12)) == ["a", "c"]
    assert await catalog.live_keys() == set()


async def test_a_corrupt_chain_is_unsafe(catalog: SnapshotCatalog, tmp_path: Path) -> None:
    await catalog.insert(info("a"), mf.encode([E("x", "1" * 64)]), {}, 0)
    await catalog.insert(info("b"), mf.encode_delta([], ["x"]), {}, 0, base="a")
    with catalog.db:
        catalog.db.execute("UPDATE snapshots SET manifest = ? WHERE id = 'a'", (b"garbage",))
    with pytest.raises(mf.UnsafeSnapshot, match="unreadable"):
        await catalog.entries("b")
