"""Durable rollout-queue state in SQLite: each run's configuration and
counters, its running, queued and parked groups, and its unacknowledged
batches, so a restarted server loses nothing (delivered batches come back
for redelivery). Writes go through one worker thread, like SqliteStateStore."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from sandboxd.core.sqlite import SqliteThread

_SCHEMA = """
CREATE TABLE IF NOT EXISTS rollout_runs (key TEXT PRIMARY KEY, config TEXT NOT NULL, state TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS rollout_groups (id TEXT PRIMARY KEY, run TEXT NOT NULL, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS rollout_batches (
  id TEXT PRIMARY KEY, run TEXT NOT NULL, seq INTEGER NOT NULL, body TEXT NOT NULL
);
"""

Row = dict[str, Any]


class RolloutStore:
    """Each run's queue state in one SQLite file, so a restarted server redelivers what was unacked."""

    def __init__(self, path: Path | None) -> None:
        """``path`` None keeps state in memory."""
        self._sql = SqliteThread(path, "sandboxd-rollouts")
        self._seq = 0

    async def open(self) -> None:
        """Opens the database (tables created when missing); new batches sort after every stored one."""
        await self._sql.open(_SCHEMA, self._read_seq)

    def _read_seq(self, db: sqlite3.Connection) -> None:
        row = db.execute("SELECT COALESCE(MAX(seq), 0) FROM rollout_batches").fetchone()
        self._seq = int(row[0])

    async def close(self) -> None:
        """Closes the database once the writes already asked for have run."""
        await self._sql.close()

    async def write(
        self,
        run_key: str,
        config: Row,
        state: Row,
        groups: dict[str, Row | None],
        batches: dict[str, Row | None],
    ) -> None:
        """One transaction: the run row, then groups and batches (None deletes)."""
        batch_rows = []
        for batch_id, body in batches.items():
            self._seq += 1
            batch_rows.append((batch_id, body, self._seq))
        await self._sql.run(self._write_sync, run_key, config, state, groups, batch_rows)

    def _write_sync(
        self,
        run_key: str,
        config: Row,
        state: Row,
        groups: dict[str, Row | None],
        batches: list[tuple[str, Row | None, int]],
    ) -> None:
        with self._sql.db as db:
            db.execute(
                "INSERT OR REPLACE INTO rollout_runs VALUES (?, ?, ?)",
                (run_key, json.dumps(config), json.dumps(state)),
            )
            for gid, body in groups.items():
                if body is None:
                    db.execute("DELETE FROM rollout_groups WHERE id = ?", (gid,))
                else:
                    db.execute(
                        "INSERT OR REPLACE INTO rollout_groups VALUES (?, ?, ?)",
                        (gid, run_key, json.dumps(body)),
                    )
            for bid, bbody, seq in batches:
                if bbody is None:
                    db.execute("DELETE FROM rollout_batches WHERE id = ?", (bid,))
                    continue
                # Keep the first sequence number so redelivery order survives updates.
                old = db.execute("SELECT seq FROM rollout_batches WHERE id = ?", (bid,)).fetchone()
                db.execute(
                    "INSERT OR REPLACE INTO rollout_batches VALUES (?, ?, ?, ?)",
                    (bid, run_key, old[0] if old else seq, json.dumps(bbody)),
                )

    async def load(self) -> list[tuple[str, Row, Row, list[Row], list[Row]]]:
        """(run key, config, state, groups, batches in delivery order) per run."""
        return list(await self._sql.run(self._load_sync))

    def _load_sync(self) -> list[tuple[str, Row, Row, list[Row], list[Row]]]:
        db = self._sql.db
        out = []
        for key, config, state in db.execute("SELECT key, config, state FROM rollout_runs").fetchall():
            groups = [
                json.loads(b) for (b,) in db.execute("SELECT body FROM rollout_groups WHERE run = ?", (key,))
            ]
            batches = [
                json.loads(b)
                for (b,) in db.execute("SELECT body FROM rollout_batches WHERE run = ? ORDER BY seq", (key,))
            ]
            out.append((key, json.loads(config), json.loads(state), groups, batches))
        return out
