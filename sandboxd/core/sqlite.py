"""One SQLite connection owned by one worker thread, for the control plane's
stores (pools and leases, snapshot catalog, rollout queue): every statement
runs on that thread, never on the event loop, and in the order it was asked."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any


class SqliteThread:
    """One connection on one worker thread: statements never run on the event loop, and run in order."""

    def __init__(self, path: Path | None, name: str) -> None:
        """``path`` None keeps the database in memory (tests, throw-away servers)."""
        self._path = path
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._db: sqlite3.Connection | None = None

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` run on the worker, after everything asked for before it."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def open(self, schema: str, then: Callable[[sqlite3.Connection], None] | None = None) -> None:
        """Opens (creating it and its directory) with WAL and ``schema``;
        ``then`` runs on the worker with the connection before it is used."""
        await self.run(self._open_sync, schema, then)

    def _open_sync(self, schema: str, then: Callable[[sqlite3.Connection], None] | None) -> None:
        if self._path is not None:
            self._path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(str(self._path) if self._path else ":memory:", check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.executescript(schema)
        if then is not None:
            then(db)
        self._db = db

    @property
    def db(self) -> sqlite3.Connection:
        """The connection; only for code running on the worker."""
        assert self._db is not None, "database not open"
        return self._db

    async def close(self) -> None:
        """Closes the connection after what was asked before, then stops the worker; no ``run`` after."""
        if self._db is not None:
            await self.run(self._db.close)
            self._db = None
        self._executor.shutdown(wait=True)
