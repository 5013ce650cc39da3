"""Warm sandboxes for ``/run_code``: a reserve prepared before requests come,
and reuse between requests only when it is provably safe.

A container start costs hundreds of milliseconds (seconds under a burst), a
short program tens. So the server holds a *reserve* of sandboxes already
leased and already inspected (their baseline, below), sized to the most
requests it had in flight at once in the last ``demand_window`` seconds and
never below ``reserve``: a burst that fits takes them without waiting for a
lease, an inspection or a container start. A sandbox that served a request
serves the next under these rules (sandboxd.adapters.sandboxfusion_probes
has the steps):

- each request runs in a fresh directory ``/tmp/sf-<random>`` (``w/`` its
  cwd, ``h/`` its HOME, mode 0700), and each of its commands in a Landlock
  domain of its own, from which nothing can ptrace or signal the steps below;
- after the answer (before it, when the request fetches files), a step from
  outside the domain kills every process of the sandbox's user but the
  sandbox's own, deletes the directory and digests every writable mount;
- reuse only if that digest is the one the sandbox had when it came, no
  process is left, and every command of the request ended by exiting (not by
  a time-out, an output cap, a memory or pid limit);
- anything else, every sandbox after ``max_uses`` requests, and every sandbox
  whose kernel has no Landlock scopes (nothing would keep a leftover process
  from subverting the clean-up), is released, which destroys it. Sandboxes
  are kept per memory limit, because the limit is fixed when a sandbox is
  acquired; a request never gets less than it asked for, nor more than the
  pool's limit (above it, it is refused).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from collections import deque
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sandboxd import errors
from sandboxd.adapters.sandboxfusion_leases import HeldLeases
from sandboxd.adapters.sandboxfusion_probes import LANDLOCK_ABI, baseline_command, clean_command
from sandboxd.client import AsyncClient, Lease, Sandbox

__all__ = ["CLEAN_OUTCOMES", "Slot", "StepFailed", "WarmSandboxes", "WarmStats", "run_step"]

log = logging.getLogger(__name__)

# Outcomes after which nothing of the request can outlive the clean-up.
CLEAN_OUTCOMES = frozenset({"EXITED"})
# Seconds the service's own steps (set-up, checks, clean-up) may take in a sandbox.
STEP_TIMEOUT = 30.0
# Fetched files come back in a step's stdout, base64-encoded (the server caps
# one exec's output at 32 MiB).
_STEP_OUTPUT = 32 << 20
# How long the reserve's own acquires wait, and the pause after one failed.
_FILL_TIMEOUT = 60.0
_FILL_BACKOFF = 2.0
# Seconds between the reserve's looks at demand when nothing else wakes it.
_FILL_TICK = 5.0


class StepFailed(Exception):
    """A service step in the sandbox failed: the request answers SandboxError."""


async def run_step(sandbox: Sandbox, argv: list[str], stdin: str = "") -> dict[str, Any]:
    """Runs one of the service's steps and returns its JSON answer; StepFailed if it did not exit 0."""
    result = await sandbox.exec(argv, timeout=STEP_TIMEOUT, stdin=stdin, output_limit=_STEP_OUTPUT, cwd="/")
    if result.outcome != "EXITED" or result.exit_code != 0:
        raise StepFailed(
            result.detail
            or f"sandbox step ended {result.outcome} {result.exit_code}: "
            f"{result.stderr.decode(errors='replace')[-500:]}"
        )
    try:
        out: dict[str, Any] = json.loads(result.stdout)
    except ValueError as e:
        raise StepFailed("sandbox step answered no JSON") from e
    return out


@dataclass(eq=False)
class Slot:
    """A warm sandbox held under its own lease."""

    lease: Lease
    sandbox: Sandbox
    memory_bytes: int
    reusable: bool = False
    """Whether its kernel confines requests so that the clean-up can be trusted."""
    baseline: str = ""
    infra: list[str] = field(default_factory=list)
    """The sandbox's own processes (pid:start time), found before any request."""
    uses: int = 0
    heartbeat_at: float = field(default_factory=time.monotonic)

    def new_top(self) -> str:
        """A fresh per-request directory name."""
        return f"/tmp/sf-{secrets.token_hex(8)}"


@dataclass
class WarmStats:
    """What the server did to serve requests: the numbers behind its latency."""

    leased: int = 0
    """Sandboxes leased from the pool (by the reserve or by a request)."""
    prepared: int = 0
    """Sandboxes inspected for their baseline."""
    reused: int = 0
    """Requests served by a sandbox that served one before."""
    from_reserve: int = 0
    """Requests that found a prepared sandbox waiting."""
    waited: int = 0
    """Requests that found none and waited for a lease or a sandbox given back."""
    destroyed: int = 0
    check_failed: int = 0
    """Sandboxes destroyed because the clean-up after a request found something left."""


class WarmSandboxes:
    """Leases sandboxes from ``pool``, keeps a reserve prepared, and keeps the clean ones
    for reuse (see the module docstring)."""

    def __init__(
        self,
        client: AsyncClient,
        pool: str,
        *,
        max_uses: int = 50,
        max_idle: int = 64,
        lease_ttl: float = 120.0,
        reserve: int = 0,
        demand_window: float = 300.0,
        tools: Sequence[str] = (),
    ) -> None:
        self.client = client
        self.pool = pool
        self.max_uses = max_uses
        self.max_idle = max_idle
        self.lease_ttl = lease_ttl
        self.reserve = reserve
        self.demand_window = demand_window
        self.tools = tuple(tools)
        """Binaries whose presence each image is checked for, once (see ``has_tool``)."""
        self._present: dict[str, frozenset[str]] = {}
        # The image of the pool's sandboxes, as the last one prepared told.
        self._image = ""
        self.stats = WarmStats()
        self._idle: dict[int, list[Slot]] = {}
        self._held: set[Slot] = set()
        self._preparing: dict[int, int] = {}
        self._recycling: dict[int, int] = {}
        self._waiters: dict[int, list[asyncio.Future[Slot]]] = {}
        self._tasks: set[asyncio.Future[Any]] = set()
        self._leases = HeldLeases(pool)
        # (monotonic time, requests in flight) per memory limit, newest last.
        self._demand: dict[int, deque[tuple[float, int]]] = {}
        self._ceiling: int | None = None
        self._closed = False
        self._started = False
        self._warned = False
        self._wake = asyncio.Event()

    @property
    def reused(self) -> int:
        """Requests served by a sandbox that served one before."""
        return self.stats.reused

    @property
    def destroyed(self) -> int:
        """Sandboxes released (and so destroyed)."""
        return self.stats.destroyed

    def in_use(self) -> list[str]:
        """Ids of the sandboxes serving a request now."""
        return [slot.sandbox.id for slot in self._held]

    def idle(self, memory_bytes: int = 0) -> int:
        """Prepared sandboxes waiting for a request with this memory limit."""
        return len(self._idle.get(memory_bytes, []))

    def idle_used(self, memory_bytes: int = 0) -> int:
        """Of those, the ones that served a request before (cleaned and kept)."""
        return sum(1 for slot in self._idle.get(memory_bytes, []) if slot.uses)

    def start(self) -> None:
        """Starts the heartbeats and the reserve (idempotent; needs a running loop)."""
        if self._started:
            return
        self._started = True
        self._spawn(self._heartbeats())
        self._spawn(self._fill())

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def memory_ceiling(self) -> int:
        """The pool's memory limit in bytes, the most a request's sandbox can have
        (looked up once; 0 while unknown)."""
        if self._ceiling is None:
            try:
                pool = await self.client.get_pool(self.pool)
            except errors.SandboxdError:
                return 0
            self._ceiling = int(pool.spec.limits.memory_bytes)
        return self._ceiling

    def _note_demand(self, memory_bytes: int) -> None:
        in_flight = sum(1 for s in self._held if s.memory_bytes == memory_bytes)
        samples = self._demand.setdefault(memory_bytes, deque())
        now = time.monotonic()
        samples.append((now, in_flight))
        while samples and samples[0][0] < now - self.demand_window:
            samples.popleft()

    def target(self, memory_bytes: int) -> int:
        """How many sandboxes the server holds for this memory limit: the most requests in
        flight at once lately, at least ``reserve`` for the pool's own limit."""
        now = time.monotonic()
        samples = self._demand.get(memory_bytes, deque())
        peak = max((n for t, n in samples if t >= now - self.demand_window), default=0)
        floor = self.reserve if memory_bytes == 0 else 0
        return min(self.max_idle, max(floor, peak))

    async def take(self, memory_bytes: int, timeout: float) -> Slot:
        """A clean sandbox with this memory limit (0 = the pool's): a kept one, one another
        request gives back while this waits, or a new lease, whichever comes first."""
        self.start()
        idle = self._idle.get(memory_bytes)
        if idle:
            # One that served before first (the latest of those): the fresh ones stay the reserve.
            used = [i for i, s in enumerate(idle) if s.uses]
            slot = self._hold(idle.pop(used[-1] if used else -1))
            if slot.uses:
                self.stats.reused += 1
            else:
                self.stats.from_reserve += 1
            self._note_demand(memory_bytes)
            self._wake.set()
            return slot
        self.stats.waited += 1
        # With the pool at its size, a new lease waits for a release that a
        # kept sandbox never makes: so a sandbox given back meanwhile serves too.
        handed: asyncio.Future[Slot] = asyncio.get_running_loop().create_future()
        waiters = self._waiters.setdefault(memory_bytes, [])
        waiters.append(handed)
        leasing = asyncio.create_task(self._lease(memory_bytes, timeout))
        self._tasks.add(leasing)
        leasing.add_done_callback(self._tasks.discard)
        try:
            await asyncio.wait({handed, leasing}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            leasing.cancel()
            leasing.add_done_callback(self._adopt)
            if handed.done():
                self._offer(handed.result())
            raise
        finally:
            if handed in waiters:
                waiters.remove(handed)
        if handed.done():
            leasing.cancel()
            # A lease granted as it was cancelled is kept for the next request.
            leasing.add_done_callback(self._adopt)
            slot = self._hold(handed.result())
            if slot.uses:
                self.stats.reused += 1
        else:
            handed.cancel()
            slot = self._hold(leasing.result())
        self._note_demand(memory_bytes)
        self._wake.set()
        return slot

    async def _lease(self, memory_bytes: int, timeout: float) -> Slot:
        limits = {"memory_bytes": memory_bytes} if memory_bytes else None
        self._preparing[memory_bytes] = self._preparing.get(memory_bytes, 0) + 1
        try:
            lease = await self.client.lease(
                self.pool, lease_ttl=self.lease_ttl, timeout=timeout, limits=limits
            )
        except BaseException:
            self._preparing[memory_bytes] -= 1
            raise
        self._leases.own(lease)
        self.stats.leased += 1
        slot = Slot(lease, lease[0], memory_bytes)
        prepared = asyncio.ensure_future(self._prepared(slot))
        self._tasks.add(prepared)
        prepared.add_done_callback(self._tasks.discard)
        # A callback, not the coroutine's own except: close() may cancel the task
        # before its first step, and then none of its code runs.
        prepared.add_done_callback(lambda task: self._after_preparing(slot, task))
        try:
            return await asyncio.shield(prepared)
        except asyncio.CancelledError:
            # Granted, it is worth keeping: a container start was spent on it.
            prepared.add_done_callback(self._adopt)
            raise

    async def _prepared(self, slot: Slot) -> Slot:
        await self._prepare(slot)
        return slot

    def _after_preparing(self, slot: Slot, task: asyncio.Future[Slot]) -> None:
        self._preparing[slot.memory_bytes] -= 1
        if task.cancelled() or task.exception() is not None:
            self._release_later(slot)

    def has_tool(self, tool: str, image: str = "") -> bool | None:
        """Whether sandboxes of ``image`` (default: the pool's, as last seen) have
        ``tool`` on their PATH; None while no sandbox of it has been prepared."""
        present = self._present.get(image or self._image)
        return None if present is None else tool in present

    async def _prepare(self, slot: Slot) -> None:
        """Takes the sandbox's baseline and whether its kernel can confine requests;
        the first sandbox of an image also tells which of ``tools`` the image has."""
        image = slot.sandbox.info.image
        known = image in self._present
        base = await run_step(slot.sandbox, baseline_command(() if known else self.tools))
        if not known:
            self._present[image] = frozenset(base.get("tools") or ())
        self._image = image
        slot.reusable = int(base["landlock"]) >= LANDLOCK_ABI and not base["unreadable"]
        slot.baseline, slot.infra = base["digest"], list(base["infra"])
        self.stats.prepared += 1
        if not slot.reusable and not self._warned:
            self._warned = True
            log.warning(
                "sandboxes of pool %s are used once each: no Landlock scopes to confine requests", self.pool
            )

    def _hold(self, slot: Slot) -> Slot:
        self._held.add(slot)
        return slot

    def _adopt(self, task: asyncio.Task[Slot]) -> None:
        if not task.cancelled() and task.exception() is None:
            self._offer(task.result())

    def _offer(self, slot: Slot) -> None:
        # A waiting request first; else kept, up to max_idle.
        for waiter in self._waiters.get(slot.memory_bytes, []):
            if not waiter.done():
                waiter.set_result(slot)
                return
        idle = self._idle.setdefault(slot.memory_bytes, [])
        if self._closed or len(idle) >= self.max_idle:
            self._release_later(slot)
            return
        idle.append(slot)

    def put_back(self, slot: Slot) -> None:
        """Returns a sandbox that ran nothing of its request: kept as it was."""
        self._held.discard(slot)
        self._offer(slot)
        self._wake.set()

    def give_back(self, slot: Slot, *, clean: bool, top: str, cleaned: bool = False) -> None:
        """After a request in ``top``: keeps ``slot`` if ``clean``, if its clean-up (done
        here unless ``cleaned``: the request's own found nothing left) passes and it is
        under its use count; else destroys it. Both happen in the background."""
        self._held.discard(slot)
        slot.uses += 1
        if clean and slot.reusable and not self._closed and slot.uses < self.max_uses:
            if cleaned:
                self._offer(slot)
            else:
                self._recycling[slot.memory_bytes] = self._recycling.get(slot.memory_bytes, 0) + 1
                self._spawn(self._recycle(slot, top))
        else:
            self._release_later(slot)
        self._wake.set()

    async def _recycle(self, slot: Slot, top: str) -> None:
        kept = False
        try:
            after = await run_step(slot.sandbox, clean_command(top, [], slot.infra))
            kept = self.passes(slot, after)
            if not kept:
                log.debug("sandbox %s is not as it came: %s", slot.sandbox.id, after)
        except (errors.SandboxdError, StepFailed, KeyError, ValueError) as e:
            log.debug("sandbox %s fails its clean-up: %s", slot.sandbox.id, e)
        finally:
            self._recycling[slot.memory_bytes] -= 1
            if kept:
                self._offer(slot)
            else:
                self.stats.check_failed += not self._closed
                # Tracked, not awaited: close() cancels this task and then waits
                # for the releases (a shielded await would orphan this one).
                self._release_later(slot)

    @staticmethod
    def passes(slot: Slot, after: dict[str, Any]) -> bool:
        """Whether a clean-up's answer leaves ``slot`` as it came."""
        return bool(
            after.get("survivors") == 0 and after.get("removed") and after.get("digest") == slot.baseline
        )

    def _release_later(self, slot: Slot) -> None:
        # Once per lease, retried, never cancelled: close() waits for these.
        if self._leases.release(slot.lease):
            self.stats.destroyed += 1

    async def _fill(self) -> None:
        # Keeps as many sandboxes as target() asks for each memory limit in
        # use: leases and prepares the missing ones, releases idle surplus.
        while not self._closed:
            for key in {0, *self._demand}:
                have = (
                    len(self._idle.get(key, []))
                    + self._preparing.get(key, 0)
                    + self._recycling.get(key, 0)
                    + sum(1 for s in self._held if s.memory_bytes == key)
                )
                want = self.target(key)
                for _ in range(want - have):
                    self._spawn(self._refill(key))
                surplus = self._idle.get(key, [])[: max(0, have - want)]
                for slot in surplus:
                    self._idle[key].remove(slot)
                    self._release_later(slot)
                samples = self._demand.get(key)
                while samples and samples[0][0] < time.monotonic() - self.demand_window:
                    samples.popleft()
                if key and samples is not None and not samples and not have:
                    del self._demand[key]
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), _FILL_TICK)

    async def _refill(self, memory_bytes: int) -> None:
        try:
            slot = await self._lease(memory_bytes, _FILL_TIMEOUT)
        except (errors.SandboxdError, StepFailed) as e:
            log.debug("reserve of pool %s: %s", self.pool, e)
            await asyncio.sleep(_FILL_BACKOFF)
            self._wake.set()
            return
        self._offer(slot)

    async def _heartbeats(self) -> None:
        # Idle sandboxes are held only by this process: keep their leases alive.
        while not self._closed:
            await asyncio.sleep(self.lease_ttl / 3)
            now = time.monotonic()
            for slot in [s for group in self._idle.values() for s in group] + list(self._held):
                if now - slot.heartbeat_at < self.lease_ttl / 3:
                    continue
                try:
                    await slot.lease.heartbeat(self.lease_ttl)
                    slot.heartbeat_at = now
                except errors.SandboxdError as e:
                    # Gone, or not kept alive: an idle one is let go (released, since
                    # a lease the server could not extend may still be in force); a
                    # held one fails its request on its own and is released after it.
                    log.debug("sandbox %s: heartbeat failed: %s", slot.sandbox.id, e)
                    group = self._idle.get(slot.memory_bytes, [])
                    if slot in group:
                        group.remove(slot)
                        self._release_later(slot)

    async def close(self) -> None:
        """Stops the heartbeats and the reserve and releases every sandbox leased, kept
        or not; returns once every release has been answered."""
        self._closed = True
        self._wake.set()
        # Cancelled, the acquires, preparations and clean-ups release what they
        # hold; one may start another (a lease granted as it was cancelled).
        while self._tasks:
            tasks = list(self._tasks)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        for group in self._idle.values():
            for slot in group:
                self._release_later(slot)
        self._idle.clear()
        # An acquire cancelled above as the server granted it is released by the
        # client, by its request id, in the background.
        await self.client.wait_background()
        # Also those of requests still running (past the HTTP server's shutdown
        # wait) and of tasks cancelled before their first step.
        self.stats.destroyed += await self._leases.close()
