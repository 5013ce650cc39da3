"""Shared helpers for the unit tier: an in-memory control plane (FakeBackend,
in-memory or on-disk SqliteStateStore, system or fake clock), an in-process gRPC
server, a deadline-bounded polling helper, and a guard that fails any test
leaving asyncio tasks behind."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pytest

from sandboxd.app import App, build_app
from sandboxd.backends.base import ExecResult, Limits, OutputChunk
from sandboxd.backends.fake import FakeBackend
from sandboxd.client import AsyncClient
from sandboxd.clock import Clock, FakeClock, SystemClock
from sandboxd.core.control import ControlPlane, ExecRequest
from sandboxd.core.leases import Lease
from sandboxd.core.lifecycle import SandboxRecord
from sandboxd.core.pools import PoolConfig, WarmPool
from sandboxd.core.state import SqliteStateStore
from sandboxd.settings import Settings, load_settings
from tests.unit.e2b_app import e2b_http  # noqa: F401  (registers the fixture)

IMAGE = "sandboxd/unit:latest"
UNKNOWN_LEASE = "ls-" + "0" * 24
UNKNOWN_SANDBOX = "sb-" + "0" * 12

# -- polling ------------------------------------------------------------------

_POLL_PAUSE_SECONDS = 0.002


async def _pause_between_polls() -> None:
    """The only sleep of the unit tier: a short pause between two looks at a
    condition inside ``wait_for``; never used to wait for a condition itself."""
    await asyncio.sleep(_POLL_PAUSE_SECONDS)


async def wait_for(
    predicate: Callable[[], bool],
    timeout: float = 5.0,
    what: str = "",
) -> None:
    """Polls ``predicate`` until it holds; fails the test at the deadline."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            raise AssertionError(f"condition not met within {timeout:g}s: {what or predicate!r}")
        await _pause_between_polls()


# -- task-leak guard ----------------------------------------------------------


def pending_tasks_since(before: Iterable[asyncio.Task[Any]]) -> list[asyncio.Task[Any]]:
    """Tasks of the running loop that are new since ``before`` and not done
    (the caller's own task excluded)."""
    known = set(before)
    current = asyncio.current_task()
    return [t for t in asyncio.all_tasks() if t not in known and t is not current and not t.done()]


@pytest.fixture(autouse=True)
async def no_task_leaks() -> AsyncIterator[None]:
    """Fails a test that leaves asyncio tasks pending. Autouse fixtures are set
    up first and torn down last, so this runs after apps and control planes
    the test used have been stopped."""
    before = asyncio.all_tasks()
    yield
    try:
        await wait_for(lambda: not pending_tasks_since(before), timeout=2.0, what="leftover tasks to finish")
    except AssertionError:
        leftover = pending_tasks_since(before)
        for task in leftover:
            task.cancel()
        await asyncio.gather(*leftover, return_exceptions=True)
        pytest.fail(f"test left {len(leftover)} asyncio task(s) pending: {leftover!r}")


# -- settings -----------------------------------------------------------------


def make_settings(**overrides: Any) -> Settings:
    """Settings for tests; keyword names use '__' for the dots of
    ``load_settings`` overrides (pools__max_starting=2)."""
    base: dict[str, Any] = {
        "instance_id": "unit",
        "backend.kind": "fake",
        "server.host": "127.0.0.1",
        "server.port": 0,
        "server.grace_seconds": 0.5,
    }
    base.update({k.replace("__", "."): v for k, v in overrides.items()})
    return load_settings(overrides=base)


# -- control plane harness ------------------------------------------------------


@dataclass
class Harness:
    control: ControlPlane
    backend: FakeBackend
    clock: Clock
    settings: Settings
    stopped: bool = False
    _extra: dict[str, Any] = field(default_factory=dict)

    @property
    def fake_clock(self) -> FakeClock:
        assert isinstance(self.clock, FakeClock)
        return self.clock

    async def pool(
        self,
        name: str = "p",
        *,
        min_ready: int = 0,
        max_size: int = 8,
        image: str = IMAGE,
        limits: Limits | None = None,
        env: dict[str, str] | None = None,
        labels: dict[str, str] | None = None,
    ) -> WarmPool:
        return await self.control.create_pool(
            PoolConfig(name, image, min_ready, max_size, limits or Limits(), env or {}, labels or {})
        )

    async def warm_pool(
        self, name: str = "p", *, min_ready: int = 2, max_size: int = 8, **kw: Any
    ) -> WarmPool:
        """A pool with ``min_ready`` READY sandboxes and nothing in flight."""
        pool = await self.pool(name, min_ready=min_ready, max_size=max_size, **kw)
        await wait_for(lambda: pool.ready >= min_ready and pool.creating == 0, what=f"{name} warm")
        return pool

    async def acquire(
        self,
        pool: str = "p",
        n: int = 1,
        *,
        min_n: int = 0,
        labels: dict[str, str] | None = None,
        ttl: float = 0.0,
        timeout: float = 5.0,
    ) -> tuple[Lease, list[SandboxRecord]]:
        return await self.control.acquire(pool, n, min_n, labels or {}, ttl, timeout, None)

    async def leased(self, pool: str = "p", **pool_kw: Any) -> tuple[Lease, SandboxRecord]:
        """Creates pool ``pool`` and leases one sandbox from it."""
        await self.pool(pool, **pool_kw)
        lease, records = await self.acquire(pool)
        return lease, records[0]

    async def exec(
        self, sandbox_id: str, shell: str | None = None, **kw: Any
    ) -> tuple[ExecResult, bytes, bytes]:
        """Runs an exec through the core; returns (result, stdout, stderr)."""
        rec, spec = self.control.prepare_exec(ExecRequest(sandbox_id=sandbox_id, shell=shell, **kw))
        out: dict[int, list[bytes]] = {1: [], 2: []}
        result: ExecResult | None = None
        async for event in self.control.exec(rec, spec):
            if isinstance(event, OutputChunk):
                out[event.stream].append(event.data)
            else:
                assert result is None, "more than one result"
                result = event
        assert result is not None, "exec produced no result"
        return result, b"".join(out[1]), b"".join(out[2])

    async def stop(self) -> None:
        if not self.stopped:
            self.stopped = True
            await self.control.stop()

    async def crash(self) -> None:
        """Stops the control plane the way a crash would: background work ends,
        nothing is destroyed on the backend, the store is left as it was."""
        self.stopped = True
        control = self.control
        tasks: list[asyncio.Task[Any]] = []
        if control._reaper is not None:
            tasks.append(control._reaper)
        if control.reconciler.task is not None:
            tasks.append(control.reconciler.task)
        for pool in control.pools.values():
            if pool._loop_task is not None:
                tasks.append(pool._loop_task)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        # What was already under way (creates, destroys) finishes, as it would
        # on the engine even if the server died.
        for pool in control.pools.values():
            await pool.drain()
        await control.store.close()


class MakeControl(Protocol):
    async def __call__(
        self,
        *,
        backend: FakeBackend | None = None,
        clock: Clock | None = None,
        store_path: Path | None = None,
        **overrides: Any,
    ) -> Harness: ...


@pytest.fixture
async def make_control(no_task_leaks: None) -> AsyncIterator[MakeControl]:
    """Builds and starts control planes; stops those still running at teardown."""
    made: list[Harness] = []

    async def make(
        *,
        backend: FakeBackend | None = None,
        clock: Clock | None = None,
        store_path: Path | None = None,
        **overrides: Any,
    ) -> Harness:
        settings = make_settings(**overrides)
        backend = backend if backend is not None else FakeBackend()
        clock = clock if clock is not None else SystemClock()
        control = ControlPlane(settings, backend, SqliteStateStore(store_path), clock)
        await control.start()
        h = Harness(control, backend, clock, settings)
        made.append(h)
        return h

    yield make
    for h in reversed(made):
        await h.stop()


@pytest.fixture
async def h(make_control: MakeControl) -> Harness:
    """A started control plane on a FakeBackend with the system clock."""
    return await make_control()


@pytest.fixture
async def fh(make_control: MakeControl) -> Harness:
    """A started control plane on a FakeBackend with a FakeClock; the background
    reaper is parked so only explicit ``reap_expired`` calls reclaim leases."""
    return await make_control(clock=FakeClock(), leases__reap_interval_seconds=3600.0)


# -- in-process gRPC server -----------------------------------------------------


class MakeApp(Protocol):
    async def __call__(self, *, backend: FakeBackend | None = None, **overrides: Any) -> App: ...


@pytest.fixture
async def make_app(no_task_leaks: None) -> AsyncIterator[MakeApp]:
    apps: list[App] = []

    async def make(*, backend: FakeBackend | None = None, **overrides: Any) -> App:
        app = build_app(make_settings(**overrides), backend=backend or FakeBackend(), persist=False)
        await app.start()
        apps.append(app)
        return app

    yield make
    for app in reversed(apps):
        await app.stop(grace=0.5)


@pytest.fixture
async def app(make_app: MakeApp) -> App:
    return await make_app()


@pytest.fixture
async def client(app: App) -> AsyncIterator[AsyncClient]:
    c = AsyncClient(app.address)
    await c.wait_ready(5.0)
    yield c
    await c.close()
