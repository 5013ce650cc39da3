"""The scene on sandboxd: announce, warm, step, on an engine of its own.

As a new user would try it: a pool with ``max_ready = max_size = rollouts``,
the demand announced and prewarmed (waiting, bounded), then every group of
the step acquires at once, runs its turns in a session per sandbox and
releases. Every call has a deadline; a call the server has not answered a
grace period after it is *hung*. Typed answers (RESOURCE_EXHAUSTED,
DEADLINE_EXCEEDED from the server, ...) count as refusals with their reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import Counter
from collections.abc import Awaitable
from typing import Any, TypeVar

import docker
import grpc.aio

from benchmarks.load.server import ServerProcess
from benchmarks.scale.config import Scene, turn_command
from benchmarks.scale.engine import Engine
from benchmarks.scale.probe import LatencyProbe
from sandboxd import errors
from sandboxd.backends.base import LABEL_INSTANCE
from sandboxd.client import AsyncClient, Sandbox
from sandboxd.v1 import common_pb2

T = TypeVar("T")
POOL = "scale"
SESSION = "agent"
GRACE_S = 15.0
"""How long past its deadline a call may take to answer before it counts as hung."""
CLIENT_DEADLINE = "Deadline Exceeded"
"""grpc's own text when the client's deadline ran out: the server never answered."""


class Hung(Exception):
    """A call unanswered past its deadline."""


class Tally:
    def __init__(self) -> None:
        self.admitted = 0
        self.refused = 0
        self.hung = 0
        self.completed = 0
        self.failed = 0
        self.reasons: Counter[str] = Counter()
        self.samples: dict[str, str] = {}
        self.acquire_s: list[float] = []

    def note(self, key: str, message: str) -> None:
        self.reasons[key] += 1
        self.samples.setdefault(key, message[:300])


async def bounded(call: Awaitable[T], deadline: float) -> T:
    """``call`` with the client's own limit ``deadline + GRACE_S``; Hung when
    it is not answered by then or the RPC's deadline ran out unanswered."""
    try:
        return await asyncio.wait_for(call, deadline + GRACE_S)
    except TimeoutError as e:
        raise Hung(f"no answer {deadline + GRACE_S:g}s after the call") from e
    except errors.DeadlineExceeded as e:
        cause = e.__cause__
        if isinstance(cause, grpc.aio.AioRpcError) and cause.details() == CLIENT_DEADLINE:
            raise Hung("the RPC's deadline ran out without an answer from the server") from e
        raise


class Watcher:
    """Pool state twice a second from the WatchPool stream."""

    def __init__(self, client: AsyncClient, origin: float) -> None:
        self.client = client
        self.origin = origin
        self.samples: list[dict[str, Any]] = []
        self.errors = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="scale-watch")

    async def _loop(self) -> None:
        while True:
            try:
                async for update in self.client.watch_pools(POOL, interval=0.5):
                    t = round(time.perf_counter() - self.origin, 3)
                    for p in update.pools:
                        self.samples.append({
                            "t": t, "ready": p.ready, "leased": p.leased, "starting": p.starting,
                            "waiting": p.waiting, "in_doubt": p.in_doubt,
                            "degraded": bool(p.engine_degraded), "start_window": p.start_window,
                            "startup_s": round(p.startup_seconds, 3),
                            "oldest_wait_s": round(p.oldest_wait_seconds, 3),
                        })  # fmt: skip
            except errors.SandboxdError:
                self.errors += 1
                await asyncio.sleep(0.5)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def degraded_seconds(self) -> float:
        total = 0.0
        for a, b in itertools.pairwise(self.samples):
            if a["degraded"]:
                total += b["t"] - a["t"]
        return round(total, 3)


async def _trajectory(box: Sandbox, scene: Scene, tally: Tally) -> None:
    for turn in range(1, scene.turns + 1):
        try:
            r = await bounded(
                box.exec(turn_command(turn, session=True), session=SESSION, timeout=scene.exec_timeout_s),
                scene.exec_timeout_s,
            )
        except Hung as e:
            tally.hung += 1
            tally.note("exec:hung", str(e))
            tally.failed += 1
            return
        except errors.SandboxdError as e:
            tally.note(f"exec:{type(e).__name__}", str(e))
            tally.failed += 1
            return
        if not r.ok or r.text.split() != [str(turn)]:
            tally.note("exec:wrong", f"turn {turn}: {r.outcome} {r.exit_code} {r.text[-100:]!r}")
            tally.failed += 1
            return
    tally.completed += 1


async def _group(client: AsyncClient, scene: Scene, g: int, tally: Tally, go: asyncio.Event) -> None:
    await go.wait()
    t0 = time.perf_counter()
    try:
        lease = await bounded(
            client.lease(
                POOL, scene.group, labels={"group": str(g)},
                lease_ttl=scene.step_bound_s + 120, timeout=scene.acquire_timeout_s,
            ),
            scene.acquire_timeout_s,
        )  # fmt: skip
    except Hung as e:
        tally.hung += 1
        tally.note("acquire:hung", str(e))
        return
    except errors.SandboxdError as e:
        tally.refused += scene.group
        tally.note(f"acquire:{type(e).__name__}", str(e))
        return
    tally.acquire_s.append(time.perf_counter() - t0)
    tally.admitted += len(lease.sandboxes)
    try:
        await asyncio.gather(*(_trajectory(b, scene, tally) for b in lease.sandboxes))
    finally:
        try:
            await bounded(asyncio.shield(client.release(lease.id)), 60.0)
        except Hung as e:
            tally.hung += 1
            tally.note("release:hung", str(e))
        except errors.SandboxdError as e:
            tally.note(f"release:{type(e).__name__}", str(e))


async def _settled(client: AsyncClient, until: float) -> None:
    """Polls the pool until it has READY sandboxes and none is being created,
    or until ``until`` (perf_counter seconds)."""
    while time.perf_counter() < until:
        status = (await client.get_pool(POOL)).status
        if status.ready and not status.creating:
            return
        await asyncio.sleep(0.5)


async def run_sandboxd(
    scene: Scene, image: str, host: docker.DockerClient, log: Any, out: dict[str, Any], recycle: str = "off"
) -> None:
    """The whole sandboxd side on its own engine, its results into ``out`` as
    they come (a run cut short still reports what it saw); always tears down.
    ``recycle`` is the pool's setting ("off": every released sandbox is destroyed)."""
    engine = Engine("sandboxd")
    origin = time.perf_counter()
    tally = Tally()
    server: ServerProcess | None = None
    watcher: Watcher | None = None
    probe: LatencyProbe | None = None
    groups: list[asyncio.Task[None]] = []
    try:
        await asyncio.to_thread(engine.start)
        out["engine_start_s"] = engine.start_s
        out["image_load"] = await asyncio.to_thread(engine.load_image, image, host)
        log(f"sandboxd: engine up in {engine.start_s:.1f}s, image in {out['image_load']['seconds']:.1f}s")
        probe = LatencyProbe(engine.url, origin).__enter__()
        server = ServerProcess(env={"DOCKER_HOST": engine.url})
        out["server_start_s"] = round(await server.wait_healthy(), 3)
        async with AsyncClient(server.address) as client:
            pre = await client.preflight(concurrent=scene.rollouts, image=image)
            out["preflight"] = {
                "ok": pre.ok,
                "problems": [p.message for p in pre.problems],
                "predicted_warm_s": round(pre.predicted_warm_seconds, 1),
            }
            log(f"sandboxd: preflight {'ok' if pre.ok else '; '.join(out['preflight']['problems'])}")
            out["recycle"] = recycle
            await client.create_pool(
                POOL, image, min_ready=0, max_ready=scene.rollouts, max_size=scene.rollouts, recycle=recycle
            )
            watcher = Watcher(client, origin)
            watcher.start()
            # Announce, then warm: what the trainer knows before the step.
            await client.set_demand(POOL, scene.rollouts, in_seconds=scene.warm_bound_s, source="trainer")
            w0 = time.perf_counter()
            out["warm_start_t"] = round(w0 - origin, 3)
            try:
                await bounded(
                    client.prewarm(POOL, scene.rollouts, wait=True, timeout=scene.warm_bound_s),
                    scene.warm_bound_s + 5,
                )
                out["warm_answer"] = "OK"
            except Hung as e:
                tally.hung += 1
                out["warm_answer"] = f"hung: {e}"
            except errors.ResourceExhausted as e:
                # Refused at once: more than the host holds. The announcement
                # stands, so the pool warms what fits; the step starts when
                # nothing more is starting (or at the warm bound).
                out["warm_answer"] = f"{type(e).__name__}: {str(e)[:300]}"
                await _settled(client, w0 + scene.warm_bound_s)
            except errors.SandboxdError as e:
                out["warm_answer"] = f"{type(e).__name__}: {str(e)[:300]}"
            warm_s = time.perf_counter() - w0
            status = (await client.get_pool(POOL)).status
            out["warm_s"] = round(warm_s, 3)
            out["warm_ready"] = status.ready
            out["warm_rate_per_s"] = round(status.ready / warm_s, 3) if warm_s else None
            log(f"sandboxd: {status.ready} READY after {warm_s:.1f}s ({out['warm_answer'][:120]})")
            go = asyncio.Event()
            groups += [
                asyncio.create_task(_group(client, scene, g, tally, go))
                for g in range(scene.rollouts // scene.group)
            ]
            await asyncio.sleep(0)
            s0 = time.perf_counter()
            out["step_start_t"] = round(s0 - origin, 3)
            go.set()
            _, pending = await asyncio.wait(groups, timeout=scene.step_bound_s + 2 * GRACE_S)
            for t in pending:  # past every deadline and its grace: the harness's bound, counted as hung
                t.cancel()
                tally.hung += 1
                tally.note("step:hung", "group still running at the step's bound")
            await asyncio.gather(*pending, return_exceptions=True)
            out["step_s"] = round(time.perf_counter() - s0, 3)
            log(f"sandboxd: step {out['step_s']:.1f}s, {tally.admitted} admitted, {tally.refused} refused")
            leased = await client.list_sandboxes(state=common_pb2.SandboxState.SANDBOX_STATE_LEASED)
            out["left_leased"] = len(leased)
            # The last groups' sandboxes are still being reset: counted once settled.
            status = (await client.get_pool(POOL)).status
            settle_until = time.perf_counter() + 30
            while status.releasing and time.perf_counter() < settle_until:
                await asyncio.sleep(0.2)
                status = (await client.get_pool(POOL)).status
            out["recycled"] = status.recycled_total
            out["reset_p50_ms"] = round(status.reset_p50_seconds * 1000, 1)
            out["create_p50_ms"] = round(status.create_p50_seconds * 1000, 1)
            await watcher.stop()
            d0 = time.perf_counter()
            try:
                await bounded(client.delete_pool(POOL, force=True), scene.teardown_bound_s)
            except (Hung, errors.SandboxdError) as e:
                out["delete_pool_error"] = f"{type(e).__name__}: {e}"
            out["delete_pool_s"] = round(time.perf_counter() - d0, 3)
    except Exception as e:
        out["failure"] = f"{type(e).__name__}: {e}"
        log(f"sandboxd side failed: {out['failure']}")
    finally:
        cut = [t for t in groups if not t.done()]
        for t in cut:  # the run's budget ended before these did
            t.cancel()
        await asyncio.gather(*cut, return_exceptions=True)
        out["cut_by_budget"] = len(cut) * scene.group
        if watcher is not None:
            await watcher.stop()
        if server is not None:
            out["server_exit_code"] = await asyncio.to_thread(server.stop, scene.teardown_bound_s)
            if out["server_exit_code"] != 0 or out.get("failure"):
                out["server_log_tail"] = server.log_tail(15)
        out["orphans"] = await asyncio.to_thread(_orphans, engine, server)
        if probe is not None:
            probe.__exit__()
        out["engine_close"] = await asyncio.to_thread(engine.close)
        _finish(out, tally, watcher, probe)


def _finish(out: dict[str, Any], tally: Tally, watcher: Watcher | None, probe: LatencyProbe | None) -> None:
    out.update({
        "admitted": tally.admitted, "refused": tally.refused, "hung": tally.hung,
        "completed": tally.completed, "failed": tally.failed, "reasons": dict(tally.reasons),
        "reason_samples": tally.samples,
        "acquire_p50_s": _pct(tally.acquire_s, 0.5), "acquire_max_s": _pct(tally.acquire_s, 1.0),
        "engine_degraded_s": watcher.degraded_seconds() if watcher else None,
        "engine_latency": probe.summary() if probe else None,
    })  # fmt: skip
    out["series"] = {
        "pool": watcher.samples if watcher else [],
        "engine_latency": probe.samples if probe else [],
    }


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return round(s[min(len(s) - 1, int(q * len(s)))], 3)


def _orphans(engine: Engine, server: ServerProcess | None) -> int:
    """Containers of the stopped server still on the engine; from its disk when it does not answer."""
    if engine.proc is None:
        return 0
    try:
        c = engine.client(timeout=30)
        try:
            flt = {"label": f"{LABEL_INSTANCE}={server.instance}"} if server else {}
            return len(c.containers.list(all=True, filters=flt))
        finally:
            c.close()
    except Exception:
        return engine.container_dirs()
