"""Clean-ups a backend starts and does not wait for (killing an abandoned
command, removing a half-created container), finished when it closes."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

# How long close() lets clean-ups run before cancelling them: one stuck on
# an engine that stopped answering must not hang the control plane's exit.
CLOSE_GRACE_SECONDS = 10.0


class Background:
    """The backend's own tasks, tracked until they end."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Future[None]] = set()

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Future[None]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def close(self, grace: float = CLOSE_GRACE_SECONDS) -> None:
        """Waits up to ``grace`` seconds for every task, then cancels the rest."""
        tasks = set(self._tasks)
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=grace)
        for task in pending:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
