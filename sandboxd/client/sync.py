"""The blocking client, generated from the async one at run time: every
coroutine method of AsyncClient, Lease and Sandbox becomes a blocking call
run on a private event loop thread, async context managers become ordinary
ones, async iterators ordinary iterators. No second copy to keep in step.

    with Client("127.0.0.1:50051") as client:
        with client.acquire("default") as sb:
            print(sb.exec("echo hi").text)
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Awaitable, Iterator
from concurrent.futures import Future
from types import TracebackType
from typing import Any, TypeVar

from sandboxd.client.aio import AsyncClient, HeldLease, Lease, Sandbox

T = TypeVar("T")
_WRAPPED = (AsyncClient, Lease, Sandbox)


class _LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="sandboxd-client", daemon=True)
        self._thread.start()

    def run(self, awaitable: Awaitable[T]) -> T:
        async def runner() -> T:
            return await awaitable

        future: Future[T] = asyncio.run_coroutine_threadsafe(runner(), self.loop)
        return future.result()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        self.loop.close()


class SyncProxy:
    """Blocking view of an async object."""

    def __init__(self, target: Any, runner: _LoopThread) -> None:
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_runner", runner)

    def __repr__(self) -> str:
        return f"Sync{self._target!r}"

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if not callable(attr):
            return _wrap(attr, self._runner)
        if inspect.iscoroutinefunction(attr):

            def call_blocking(*args: Any, **kwargs: Any) -> Any:
                return _wrap(self._runner.run(attr(*args, **kwargs)), self._runner)
        else:

            def call_blocking(*args: Any, **kwargs: Any) -> Any:
                return _wrap(attr(*args, **kwargs), self._runner)

        call_blocking.__doc__ = attr.__doc__
        call_blocking.__name__ = name
        return call_blocking

    def __iter__(self) -> Iterator[Any]:
        return (_wrap(x, self._runner) for x in self._target)

    def __len__(self) -> int:
        return len(self._target)

    def __getitem__(self, i: int) -> Any:
        return _wrap(self._target[i], self._runner)


class _SyncHeld:
    def __init__(self, held: HeldLease, runner: _LoopThread) -> None:
        self._held = held
        self._runner = runner

    def __enter__(self) -> Any:
        return _wrap(self._runner.run(self._held.__aenter__()), self._runner)

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._runner.run(self._held.__aexit__(et, e, tb))


def _sync_iter(it: Any, runner: _LoopThread) -> Iterator[Any]:
    while True:
        try:
            item = runner.run(it.__anext__())
        except StopAsyncIteration:
            return
        yield _wrap(item, runner)


def _wrap(value: Any, runner: _LoopThread) -> Any:
    if isinstance(value, _WRAPPED):
        return SyncProxy(value, runner)
    if isinstance(value, HeldLease):
        return _SyncHeld(value, runner)
    if hasattr(value, "__anext__"):
        return _sync_iter(value, runner)
    if isinstance(value, list):
        return [_wrap(v, runner) for v in value]
    if isinstance(value, tuple):
        return tuple(_wrap(v, runner) for v in value)
    return value


class Client(SyncProxy):
    """Blocking twin of AsyncClient; same methods, same arguments."""

    def __init__(self, target: str, **kwargs: Any) -> None:
        runner = _LoopThread()

        async def make() -> AsyncClient:
            return AsyncClient(target, **kwargs)

        super().__init__(runner.run(make()), runner)

    def close(self) -> None:
        """Closes the channel, then stops the client's event-loop thread; the client is unusable after."""
        self._runner.run(self._target.close())
        self._runner.stop()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
