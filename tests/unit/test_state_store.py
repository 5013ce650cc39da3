"""The SQLite state store's group commit: writes that arrive together go in
one transaction, as one statement per run of like writes, in order; each is
durable when its caller hears back, and a failed transaction fails every
write in it (so an acquire whose lease was not stored is never answered)."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from sandboxd.backends.base import Limits
from sandboxd.backends.fake import FakeBackend
from sandboxd.core.leases import Lease
from sandboxd.core.lifecycle import State
from sandboxd.core.pools import PoolConfig
from sandboxd.core.state import SqliteStateStore, Write, batch_statements
from tests.unit.conftest import MakeControl, wait_for

pytestmark = pytest.mark.timeout(30)


def lease(i: int, ttl: float = 60.0) -> Lease:
    return Lease(f"ls-{i:024x}", "p", [f"sb-{i:012x}"], ttl, 0.0, 1_700_000_000.0 + i, {"i": str(i)})


async def stored_ids(store: SqliteStateStore) -> set[str]:
    return {row[0] for row in await store.load_leases()}


def test_runs_of_like_writes_become_one_statement_each() -> None:
    writes = [
        Write("leases", ("a", 1)),
        Write("leases", ("b", 2)),
        Write("leases", ("a",), delete=True),
        Write("leases", ("c",), delete=True),
        Write("pools", ("p", "{}")),
        Write("leases", ("d", 3)),
    ]
    assert batch_statements(writes) == [
        ("INSERT OR REPLACE INTO leases VALUES (?, ?), (?, ?)", ("a", 1, "b", 2)),
        ("DELETE FROM leases WHERE id IN (?, ?)", ("a", "c")),
        ("INSERT OR REPLACE INTO pools VALUES (?, ?)", ("p", "{}")),
        ("INSERT OR REPLACE INTO leases VALUES (?, ?)", ("d", 3)),
    ]


def test_a_long_run_is_split_within_the_parameter_limit() -> None:
    statements = batch_statements([Write("leases", (str(i), 0, 0, 0, 0, 0)) for i in range(400)])
    assert [len(params) for _, params in statements] == [996, 996, 408]
    assert all(sql.count("?") == len(params) for sql, params in statements)


async def test_concurrent_writes_commit_together_in_order(tmp_path: Path) -> None:
    store = SqliteStateStore(tmp_path / "s.sqlite3")
    await store.open()
    try:
        await store.save_lease(lease(0))
        before = store.commits
        # Saved, deleted, saved again, extended: all queued before the first commit.
        await asyncio.gather(
            *(store.save_lease(lease(i)) for i in range(1, 65)),
            store.delete_lease(lease(0).lease_id),
            store.delete_lease(lease(1).lease_id),
            store.save_lease(lease(1, ttl=99.0)),
            store.save_lease(lease(2, ttl=7.0)),
            store.save_lease(lease(2, ttl=8.0)),
        )
        assert store.commits - before <= 2  # the first write's commit, then everything that queued behind it
        rows = {row[0]: row for row in await store.load_leases()}
        assert set(rows) == {lease(i).lease_id for i in range(1, 65)}
        assert rows[lease(1).lease_id][3] == 99.0
        assert rows[lease(2).lease_id][3] == 8.0  # the later of two writes of one lease in a batch wins
        assert rows[lease(5).lease_id][2:] == (["sb-000000000005"], 60.0, 1_700_000_005.0, {"i": "5"}, [])
    finally:
        await store.close()


async def test_acknowledged_writes_survive_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite3"
    store = SqliteStateStore(path)
    await store.open()
    await asyncio.gather(*(store.save_lease(lease(i)) for i in range(32)))
    await store.delete_lease(lease(3).lease_id)
    # The process dies here: no close, no checkpoint. A new process opens the file.
    reopened = SqliteStateStore(path)
    await reopened.open()
    try:
        assert await stored_ids(reopened) == {lease(i).lease_id for i in range(32) if i != 3}
    finally:
        await reopened.close()
        await store.close()


async def test_a_failed_commit_fails_every_write_in_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SqliteStateStore(tmp_path / "s.sqlite3")
    await store.open()
    try:
        await store.save_lease(lease(0))
        real = store._commit
        failing = True

        def commit(writes: list[Write]) -> None:
            if failing:
                raise sqlite3.OperationalError("disk I/O error")
            real(writes)

        monkeypatch.setattr(store, "_commit", commit)
        results = await asyncio.gather(
            *(store.save_lease(lease(i)) for i in range(1, 9)), return_exceptions=True
        )
        assert all(isinstance(r, sqlite3.OperationalError) for r in results)
        failing = False
        await store.save_lease(lease(9))  # the store goes on after a failed batch
        assert await stored_ids(store) == {lease(0).lease_id, lease(9).lease_id}
    finally:
        await store.close()


async def test_pool_specs_go_through_the_same_commits(tmp_path: Path) -> None:
    store = SqliteStateStore(tmp_path / "s.sqlite3")
    await store.open()
    try:
        specs = [
            PoolConfig(name=f"p{i}", image="img", min_ready=0, max_size=1, limits=Limits()) for i in range(3)
        ]
        await asyncio.gather(
            *(store.save_pool(c) for c in specs), store.delete_pool("p1"), store.save_lease(lease(1))
        )
        assert sorted(c.name for c in await store.load_pools()) == ["p0", "p2"]
        assert await stored_ids(store) == {lease(1).lease_id}
    finally:
        await store.close()


async def test_a_burst_of_acquires_is_durable_through_a_crash(
    make_control: MakeControl, tmp_path: Path
) -> None:
    backend = FakeBackend()
    path = tmp_path / "state.sqlite3"
    first = await make_control(backend=backend, store_path=path)
    await first.warm_pool(min_ready=16, max_size=16)
    assert isinstance(first.control.store, SqliteStateStore)
    before = first.control.store.commits
    got = await asyncio.gather(*(first.acquire(ttl=600.0) for _ in range(16)))
    assert first.control.store.commits - before <= 2  # one burst, one or two transactions
    handed = {lease.lease_id: records[0].sandbox_id for lease, records in got}
    assert len(set(handed.values())) == 16  # no sandbox handed out twice
    await first.crash()

    second = await make_control(backend=backend, store_path=path)
    for lease_id, sandbox_id in handed.items():
        assert second.control.get_lease(lease_id).sandbox_ids == [sandbox_id]
        assert second.control.get_sandbox(sandbox_id).state is State.LEASED


async def test_an_acquire_whose_lease_was_not_stored_is_not_answered(
    make_control: MakeControl, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = await make_control(store_path=tmp_path / "state.sqlite3")
    pool = await h.warm_pool(min_ready=4, max_size=4)
    store = h.control.store
    assert isinstance(store, SqliteStateStore)

    def commit(writes: list[Write]) -> None:
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(store, "_commit", commit)
    results = await asyncio.gather(*(h.acquire() for _ in range(4)), return_exceptions=True)
    assert all(isinstance(r, sqlite3.OperationalError) for r in results)
    monkeypatch.undo()
    # Nothing is held: the sandboxes were given up, and the pool refills.
    assert len(h.control.leases) == 0
    await wait_for(lambda: pool.ready == 4 and pool.count(State.RELEASING) == 0, what="refilled")
    assert await stored_ids(store) == set()


async def test_a_leases_narrower_network_rules_persist(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite3"
    store = SqliteStateStore(path)
    await store.open()
    narrowed = Lease("ls-" + "a" * 24, "p", ["sb-1"], 60.0, 0.0, 1_700_000_000.0, network=("pypi.test:443",))
    await store.save_lease(narrowed)
    await store.save_lease(lease(1))
    await store.close()
    reopened = SqliteStateStore(path)
    await reopened.open()
    try:
        rows = {row[0]: row for row in await reopened.load_leases()}
        assert rows[narrowed.lease_id][6] == ["pypi.test:443"]
        assert rows[lease(1).lease_id][6] == []
    finally:
        await reopened.close()


async def test_a_file_from_before_narrowing_gets_the_column(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    old = sqlite3.connect(path)
    with old:
        old.execute(
            "CREATE TABLE leases (id TEXT PRIMARY KEY, pool TEXT NOT NULL, sandboxes TEXT NOT NULL,"
            " ttl REAL NOT NULL, expires_wall REAL NOT NULL, labels TEXT NOT NULL)"
        )
        old.execute("INSERT INTO leases VALUES ('ls-old', 'p', '[\"sb-1\"]', 60.0, 1.0, '{}')")
    old.close()
    store = SqliteStateStore(path)
    await store.open()
    try:
        assert await store.load_leases() == [("ls-old", "p", ["sb-1"], 60.0, 1.0, {}, [])]
        await store.save_lease(lease(2))
        assert lease(2).lease_id in await stored_ids(store)
    finally:
        await store.close()
