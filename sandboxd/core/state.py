"""Durable state of the control plane: pool specs and leases, so a restarted
server re-creates its pools and hands clients back the sandboxes they hold.

``StateStore`` is the port (a *state* store, as opposed to the snapshot blob
stores of sandboxd.stores); two adapters:

- ``SqliteStateStore`` (here): SQLite on a local volume. It fits one replica per
  engine (the Docker backend): nothing else could read the file anyway, and a
  local write costs microseconds. Writes go through a single worker thread so
  the event loop never blocks on disk.
- ``LedgerStateStore`` (sandboxd.core.ledger_state): the backend itself, for a
  backend that is a ``Ledger`` (Kubernetes: annotations on the Pods and a
  ConfigMap), so a standby replica with its own empty disk takes over what
  the leader held.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

from sandboxd.backends.base import Limits
from sandboxd.core.leases import Lease
from sandboxd.core.pools import PoolConfig
from sandboxd.core.sqlite import SqliteThread

_SCHEMA = """
CREATE TABLE IF NOT EXISTS pools (name TEXT PRIMARY KEY, spec TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS leases (
  id TEXT PRIMARY KEY, pool TEXT NOT NULL, sandboxes TEXT NOT NULL,
  ttl REAL NOT NULL, expires_wall REAL NOT NULL, labels TEXT NOT NULL
);
"""


PersistedLease = tuple[str, str, list[str], float, float, dict[str, str]]
"""lease id, pool key, sandbox ids, ttl, expiry (wall-clock seconds), labels."""


class StateStore(Protocol):
    """Where the control plane keeps pool specs and leases across restarts."""

    async def open(self) -> None:
        """Makes the store ready; called once, before any other method."""
        ...

    async def close(self) -> None:
        """Lets every write already asked for finish, then lets go of the store."""
        ...

    async def save_pool(self, config: PoolConfig) -> None:
        """Records a pool's spec under its internal key, replacing any there; durable on return."""
        ...

    async def delete_pool(self, name: str) -> None:
        """Forgets the spec of the pool with internal key ``name``; an unknown one is no error."""
        ...

    async def load_pools(self) -> list[PoolConfig]:
        """Every recorded pool spec, of every tenant, as it was saved."""
        ...

    async def save_lease(self, lease: Lease, handles: Sequence[str] = ()) -> None:
        """Records a new or extended lease; ``handles`` are the backend
        handles of its sandboxes (a store on the backend writes to them)."""
        ...

    async def delete_lease(self, lease_id: str) -> None:
        """Forgets a released or reclaimed lease; an unknown id is no error."""
        ...

    async def load_leases(self) -> list[PersistedLease]:
        """Every recorded lease, for a restarted server to adopt or reclaim."""
        ...


def pool_to_json(config: PoolConfig) -> str:
    """A pool spec as JSON text, every field included; ``pool_from_json`` reads it back."""
    return json.dumps(asdict(config))


def pool_from_json(text: str) -> PoolConfig:
    """The PoolConfig that ``pool_to_json`` wrote, its limits rebuilt as Limits."""
    spec = json.loads(text)
    spec["limits"] = Limits(**spec["limits"])
    return PoolConfig(**spec)


class SqliteStateStore:
    """The StateStore in a SQLite file (or in memory)."""

    def __init__(self, path: Path | None) -> None:
        """``path`` None keeps state in memory (tests, throw-away servers)."""
        self._sql = SqliteThread(path, "sandboxd-store")
        # Group commit: writes that arrive while one is being committed go
        # together in the next transaction, so 64 concurrent acquires cost a
        # few thread hand-offs instead of 64.
        self._pending: list[tuple[str, tuple[Any, ...], asyncio.Future[None]]] = []
        self._flusher: asyncio.Task[None] | None = None

    async def open(self) -> None:
        """Opens the database, creating the file and its tables when missing."""
        await self._sql.open(_SCHEMA)

    async def close(self) -> None:
        """Waits for the writes still queued to commit, then closes the database."""
        if self._flusher is not None:
            await asyncio.gather(self._flusher, return_exceptions=True)
        await self._sql.close()

    def _exec_many(self, statements: list[tuple[str, tuple[Any, ...]]]) -> None:
        db = self._sql.db
        with db:
            for sql, params in statements:
                db.execute(sql, params)

    async def _write(self, sql: str, params: tuple[Any, ...]) -> None:
        """Commits one statement, in order with every other write, and
        returns once it is durable."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append((sql, params, done))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.ensure_future(self._flush())
        await done

    async def _flush(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []
            try:
                await self._sql.run(self._exec_many, [(sql, params) for sql, params, _ in batch])
            except Exception as e:
                for *_, done in batch:
                    if not done.done():
                        done.set_exception(e)
                continue
            for *_, done in batch:
                if not done.done():
                    done.set_result(None)

    async def save_pool(self, config: PoolConfig) -> None:
        """Upserts the spec by internal key; returns once it is committed."""
        await self._write("INSERT OR REPLACE INTO pools VALUES (?, ?)", (config.name, pool_to_json(config)))

    async def delete_pool(self, name: str) -> None:
        """Deletes the spec's row; returns once that is committed."""
        await self._write("DELETE FROM pools WHERE name = ?", (name,))

    async def load_pools(self) -> list[PoolConfig]:
        """Every stored pool spec, read on the worker thread."""
        rows = await self._sql.run(self._query, "SELECT spec FROM pools")
        return [pool_from_json(spec_json) for (spec_json,) in rows]

    def _query(self, sql: str) -> list[tuple[Any, ...]]:
        return list(self._sql.db.execute(sql).fetchall())

    async def save_lease(self, lease: Lease, handles: Sequence[str] = ()) -> None:
        """Upserts the lease (``handles`` are not needed here); returns once it is committed."""
        await self._write(
            "INSERT OR REPLACE INTO leases VALUES (?, ?, ?, ?, ?, ?)",
            (
                lease.lease_id,
                lease.pool,
                json.dumps(lease.sandbox_ids),
                lease.ttl,
                lease.expires_wall,
                json.dumps(lease.labels),
            ),
        )

    async def delete_lease(self, lease_id: str) -> None:
        """Deletes the lease's row; returns once that is committed."""
        await self._write("DELETE FROM leases WHERE id = ?", (lease_id,))

    async def load_leases(self) -> list[PersistedLease]:
        """Every stored lease, read on the worker thread."""
        rows = await self._sql.run(
            self._query, "SELECT id, pool, sandboxes, ttl, expires_wall, labels FROM leases"
        )
        return [(r[0], r[1], json.loads(r[2]), r[3], r[4], json.loads(r[5])) for r in rows]
