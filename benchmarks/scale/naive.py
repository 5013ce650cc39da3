"""The naive baseline of the scene: every rollout a ``docker run`` at once.

Per rollout: ``docker run -d --network none --init <image> sleep infinity``,
the same turns as ``docker exec``s (no sessions: each turn is told its
number), ``docker rm -f``. All rollouts start together (the step's
concurrency), each in a thread of its own with the SDK's 60 s call timeout.
The burst has a bound; rollouts unfinished then are errors, and the engine
(its own, see engine.py) is killed with whatever it still holds.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import docker

from benchmarks.scale.config import Scene, turn_command
from benchmarks.scale.engine import Engine
from benchmarks.scale.probe import LatencyProbe

LABEL = "sandboxd.scale.naive"


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = 0
        self.done = 0
        self.failed = 0
        self.reasons: Counter[str] = Counter()
        self.samples: dict[str, str] = {}

    def fail(self, key: str, message: str) -> None:
        """The rollout failed (once per rollout)."""
        with self.lock:
            self.failed += 1
        self.note(key, message)

    def note(self, key: str, message: str) -> None:
        with self.lock:
            self.reasons[key] += 1
            self.samples.setdefault(key, message[:300])


def _rollout(
    engine: docker.DockerClient, image: str, scene: Scene, st: _State, stop: threading.Event
) -> None:
    box = None
    started = False
    try:
        box = engine.containers.run(
            image, ["sleep", "infinity"], detach=True, network_mode="none", init=True, labels={LABEL: "1"}
        )
        started = True
        with st.lock:
            st.running += 1
        for turn in range(1, scene.turns + 1):
            if stop.is_set():
                return
            r = box.exec_run(["bash", "-c", turn_command(turn, session=False)])
            if r.exit_code != 0 or r.output.split() != [str(turn).encode()]:
                st.fail("exec:wrong", f"turn {turn}: exit {r.exit_code} {r.output[-100:]!r}")
                return
        box.remove(force=True)
        box = None
        with st.lock:
            st.done += 1
    except Exception as e:
        st.fail(type(e).__name__, str(e))
    finally:
        if started:
            with st.lock:
                st.running -= 1
        if box is not None and not stop.is_set():
            try:
                box.remove(force=True)
            except Exception as e:
                st.note(f"remove:{type(e).__name__}", str(e))


async def run_naive(
    scene: Scene, image: str, host: docker.DockerClient, log: Any, out: dict[str, Any]
) -> None:
    """The burst on its own engine, its results into ``out``; always kills that engine afterwards."""
    engine = Engine("naive")
    origin = time.perf_counter()
    st = _State()
    stop = threading.Event()
    timeline: list[dict[str, Any]] = []
    probe: LatencyProbe | None = None
    pool = ThreadPoolExecutor(scene.rollouts, thread_name_prefix="naive")
    try:
        await asyncio.to_thread(engine.start)
        out["engine_start_s"] = engine.start_s
        out["image_load"] = await asyncio.to_thread(engine.load_image, image, host)
        log(f"naive: engine up in {engine.start_s:.1f}s, image in {out['image_load']['seconds']:.1f}s")
        probe = LatencyProbe(engine.url, origin).__enter__()
        client = engine.client(timeout=60, pool=scene.rollouts)
        loop = asyncio.get_running_loop()
        s0 = time.perf_counter()
        out["step_start_t"] = round(s0 - origin, 3)
        for _ in range(scene.rollouts):
            loop.run_in_executor(pool, _rollout, client, image, scene, st, stop)
        deadline = s0 + scene.naive_bound_s
        while time.perf_counter() < deadline:
            with st.lock:
                timeline.append({
                    "t": round(time.perf_counter() - origin, 3), "running": st.running,
                    "done": st.done, "failed": st.failed,
                })  # fmt: skip
            if st.done + st.failed >= scene.rollouts:
                break
            await asyncio.sleep(0.5)
        out["step_s"] = round(time.perf_counter() - s0, 3)
        with st.lock:
            out["done"], out["failed"] = st.done, st.failed
        unfinished = scene.rollouts - out["done"] - out["failed"]
        out["stopped_by"] = "bound" if unfinished else "completed"
        out["unfinished"] = unfinished
        stop.set()
        # What the engine holds when the burst ends (it may not answer: then from its disk).
        out["containers_left"] = engine.container_dirs()
        log(f"naive: {st.done} done, {st.failed} failed, {unfinished} unfinished after {out['step_s']:.1f}s")
    except Exception as e:
        out["failure"] = f"{type(e).__name__}: {e}"
        log(f"naive side failed: {out['failure']}")
    finally:
        stop.set()
        if probe is not None:
            probe.__exit__()
        out["engine_close"] = await asyncio.to_thread(engine.close)
        pool.shutdown(wait=False, cancel_futures=True)
        out.setdefault("done", st.done)
        out.setdefault("failed", st.failed)
        out.update({
            "errors": scene.rollouts - out["done"],
            "reasons": dict(st.reasons), "reason_samples": st.samples,
            "engine_latency": probe.summary() if probe else None,
        })  # fmt: skip
        out["series"] = {"state": timeline, "engine_latency": probe.samples if probe else []}
