"""The images sandboxd put on the engine (pulled or built), kept in SQLite so
a restarted server knows which images are its own to remove: the cache never
removes an image it has no entry for."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sandboxd.core.sqlite import SqliteThread

PULLED = "pulled"
BUILT = "built"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS images (
  reference TEXT PRIMARY KEY, image_id TEXT NOT NULL, how TEXT NOT NULL,
  size INTEGER NOT NULL, last_used REAL NOT NULL
);
"""


@dataclass
class Entry:
    """One image sandboxd put on the engine, under the reference it used."""

    reference: str
    image_id: str
    how: str
    """PULLED or BUILT."""
    size: int
    last_used: float
    """Wall-clock seconds of the last ensure or use (least recently used goes first)."""


class ImageLedger:
    """Entries by reference; every write goes through one worker thread."""

    def __init__(self, path: Path | None) -> None:
        """``path`` None keeps the ledger in memory (tests, throw-away servers)."""
        self._db = SqliteThread(path, "sandboxd-images")

    async def open(self) -> list[Entry]:
        """Opens the ledger and returns every entry in it."""
        await self._db.open(_SCHEMA)
        rows = await self._db.run(
            lambda: self._db.db.execute(
                "SELECT reference, image_id, how, size, last_used FROM images"
            ).fetchall()
        )
        return [Entry(*row) for row in rows]

    async def save(self, entries: list[Entry]) -> None:
        """Writes (inserts or replaces) ``entries``."""
        if not entries:
            return
        rows = [(e.reference, e.image_id, e.how, e.size, e.last_used) for e in entries]

        def write() -> None:
            with self._db.db:
                self._db.db.executemany("INSERT OR REPLACE INTO images VALUES (?, ?, ?, ?, ?)", rows)

        await self._db.run(write)

    async def delete(self, reference: str) -> None:
        """Forgets ``reference``."""

        def write() -> None:
            with self._db.db:
                self._db.db.execute("DELETE FROM images WHERE reference = ?", (reference,))

        await self._db.run(write)

    async def close(self) -> None:
        """Closes the database; no call after."""
        await self._db.close()
