"""Per-task images on this host: a SWE-like scene with N task images in a
local registry (Debian's docker-registry on 127.0.0.1), each the sandbox
image (the shared base) plus a layer of its own (a checkout and its
dependencies: random, incompressible bytes), GRPO groups of 8 per task, and
synchronous RL steps whose slots come from the rollout queue. Each step runs
G tasks (G groups); a training phase of T seconds comes between steps.

Drivers, one after another, each starting with no task image on the engine
(except the floor):

- ``prefetch``: sandboxd, the generator asking the rollout queue for the next
  step's slots with their tasks' images at the start of each training phase;
  the queue announces them to the pool, which pulls them ahead and warms
  sandboxes of them within its capacity (the image cache keeps the disk
  within its budget, evicting what the past steps used);
- ``ondemand``: sandboxd, the same slots without images: every acquire by
  image pulls and starts on demand;
- ``naive``: ``docker run`` per rollout, pulling on demand;
- ``floor``: as ``prefetch``, with every task image already on the engine.

A step's time runs from its first acquire to its last release. Keys:
``step_s`` (prefetch), ``ondemand_step_s``, ``naive_step_s``,
``floor_step_s`` (mean over steps); ``pull_wait_share``: the part of the
prefetch step beyond the floor's, (step_s - floor_step_s) / step_s (what
pulls still cost it); ``cache_hit_ratio``: acquires (groups) of the
prefetch driver whose image was on the engine when asked for;
``disk_high_water_bytes``: the most the image cache held during the
prefetch driver, its images sharing one base counted once (sampled every
0.2 s); ``disk_budget_bytes``: the cache's budget, smaller than all the
images together; ``errors``: failed acquires, execs or runs, all drivers.

    python -m benchmarks.images            # ~4-6 minutes on 2 cores
    python -m benchmarks.images --quick    # a smoke run

It writes benchmarks/results/images.json (printed as the last line) and
plots pulls, cache bytes and warm sandboxes per image over time (prefetch
driver) to benchmarks/results/images.png.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import itertools
import json
import os
import platform
import secrets
import statistics
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import docker

from sandboxd.app import App, build_app
from sandboxd.client import AsyncClient
from sandboxd.client.rollouts import RolloutClient, trajectory
from sandboxd.images.build import ensure_default_image
from sandboxd.settings import load_settings
from tests.registry import Registry, run_registry

RESULTS = Path(__file__).resolve().parent / "results"
JSON_PATH = RESULTS / "images.json"
PNG_PATH = RESULTS / "images.png"
MB = 1 << 20
LABEL = "sandboxd-bench-images"


@dataclass(frozen=True)
class Config:
    steps: int = 3
    groups: int = 2
    """G: tasks (groups) per step; N = steps x G task images."""
    group_size: int = 8
    unique_mb: tuple[int, ...] = (40, 60, 50, 40, 60, 50)
    """Size of each task image's own layer (cycled over the N images)."""
    train_seconds: float = 15.0
    rollout_seconds: float = 2.0
    seed: int = 20261204

    @classmethod
    def quick(cls) -> Config:
        return cls(
            steps=2, groups=1, group_size=4, unique_mb=(30, 30), train_seconds=6.0, rollout_seconds=1.0
        )

    @property
    def images(self) -> int:
        return self.steps * self.groups


def log(msg: str) -> None:
    print(f"[images] {msg}", file=sys.stderr, flush=True)


# -- the scene ------------------------------------------------------------------------


def publish(engine: docker.DockerClient, registry: Registry, base: str, cfg: Config) -> list[tuple[str, int]]:
    """Builds the N task images on ``base``, pushes them, removes them from the
    engine; returns (reference, own layer bytes) of each."""
    out: list[tuple[str, int]] = []
    for i in range(cfg.images):
        size = cfg.unique_mb[i % len(cfg.unique_mb)] * MB
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            files = {
                "Dockerfile": f"FROM {base}\nCOPY task /opt/task/\n".encode(),
                "task/id": f"task-{i}\n".encode(),
                "task/repo.bin": os.urandom(size),
            }
            for name, data in files.items():
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        buf.seek(0)
        built, _ = engine.images.build(fileobj=buf, custom_context=True, rm=True, labels={LABEL: "1"})
        repo = registry.reference(f"swe/task-{i}")
        built.tag(repo, "v1")
        for event in engine.api.push(repo, "v1", stream=True, decode=True):
            if "error" in event:
                raise RuntimeError(f"push of {repo}: {event['error']}")
        engine.images.remove(f"{repo}:v1")
        out.append((f"{repo}:v1", size))
        log(f"pushed {repo}:v1 (+{size // MB} MB)")
    return out


def clear(engine: docker.DockerClient, refs: list[str]) -> None:
    for ref in refs:
        with contextlib.suppress(docker.errors.ImageNotFound, docker.errors.APIError):
            engine.images.remove(ref, force=True)


@contextlib.asynccontextmanager
async def server(state: Path, budget: int) -> Any:
    settings = load_settings(
        None,
        {
            "instance_id": "bench-img-" + secrets.token_hex(3),
            "state_dir": str(state),
            "server.port": 0,
            "images.cache_bytes": budget,
            "images.evict_interval_seconds": 5.0,
        },
    )
    app = build_app(settings)
    await app.start()
    try:
        yield app
    finally:
        await app.stop(grace=1)


@dataclass
class Run:
    steps: list[float] = field(default_factory=list)
    errors: int = 0
    hits: int = 0
    asks: int = 0
    series: list[dict[str, Any]] = field(default_factory=list)
    high_water: int = 0


async def sample(app: App, run: Run, began: float, stop: asyncio.Event) -> None:
    """Cache bytes, pulls and warm sandboxes per image, every 0.2 s."""
    cache = app.control.images
    assert cache is not None
    while not stop.is_set():
        pool = app.control.pools.get(next(iter(app.control.pools), ""))
        used = int(cache.gauges()["cache_bytes"])
        run.high_water = max(run.high_water, used)
        run.series.append(
            {
                "t": round(time.monotonic() - began, 2),
                "cache_bytes": used,
                "pulling": sum(1 for p in cache.progress() if p.state in ("queued", "pulling")),
                "pulled": sum(1 for p in cache.progress() if p.state == "done"),
                "ready": {i: c[0] for i, c in pool.image_counts().items() if c[0]} if pool else {},
            }
        )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.2)


async def rollout_group(client: AsyncClient, app: App, cfg: Config, image: str, run: Run) -> list[Any]:
    cache = app.control.images
    run.asks += 1
    if cache is not None and cache.present(image):
        run.hits += 1
    trajectories = []
    try:
        async with client.acquire_group("swe", cfg.group_size, image=image, timeout=300) as group:
            cmd = ["sh", "-c", f"cat /opt/task/id; sleep {cfg.rollout_seconds}"]
            results = await asyncio.gather(*(sb.exec(cmd) for sb in group))
            for k, (sb, r) in enumerate(zip(group, results, strict=True)):
                if not r.ok or not r.text.startswith("task-"):
                    run.errors += 1
                trajectories.append(
                    trajectory(f"t{k}", reward=float(k % 2), segments=[(0, 4)], sandbox_id=sb.id)
                )
    except Exception as e:  # counted, and the run goes on: the benchmark reports errors
        log(f"group of {image} failed: {e}")
        run.errors += 1
    return trajectories


async def sandboxd_driver(
    name: str, cfg: Config, base: str, tasks: list[str], budget: int, state: Path, *, announce: bool
) -> Run:
    run = Run()
    async with server(state / name, budget) as app, AsyncClient(app.address) as client:
        rq = RolloutClient(client)
        size = cfg.groups * cfg.group_size
        # A template: the base as its own image, every task image by acquire.
        await client.create_pool("swe", base, max_size=2 * size, max_ready=2 * size, images=["*"])
        await rq.configure(
            "run", batch_groups=cfg.groups, group_size=cfg.group_size, max_staleness=cfg.steps, pool="swe"
        )
        stop = asyncio.Event()
        began = time.monotonic()
        sampler = asyncio.create_task(sample(app, run, began, stop))
        try:
            for step in range(cfg.steps):
                images = tasks[step * cfg.groups : (step + 1) * cfg.groups]
                # The training phase: the generator asks for the next step's slots.
                slots = await rq.request_slots("run", cfg.groups, images=images if announce else ())
                await asyncio.sleep(cfg.train_seconds)  # the trainer's step, simulated
                t0 = time.monotonic()
                groups = await asyncio.gather(
                    *(rollout_group(client, app, cfg, image, run) for image in images)
                )
                run.steps.append(time.monotonic() - t0)
                for slot, trajs in zip(slots, groups, strict=True):
                    if trajs:
                        with contextlib.suppress(Exception):
                            await rq.submit("run", slot.group_id, trajs)
                log(f"{name} step {step}: {run.steps[-1]:.2f}s")
        finally:
            stop.set()
            await sampler
    return run


async def naive_driver(cfg: Config, tasks: list[str], engine: docker.DockerClient) -> Run:
    run = Run()

    def one(image: str, k: int) -> None:
        try:
            out = engine.containers.run(
                image,
                ["sh", "-c", f"cat /opt/task/id; sleep {cfg.rollout_seconds}"],
                remove=True,
                labels={LABEL: "1"},
                network_disabled=True,
            )
            if not out.startswith(b"task-"):
                run.errors += 1
        except Exception as e:  # counted: the benchmark reports errors
            log(f"docker run of {image} failed: {e}")
            run.errors += 1

    loop = asyncio.get_running_loop()
    # One thread per rollout: every docker run of a step at once, as sandboxes are.
    with ThreadPoolExecutor(cfg.groups * cfg.group_size) as threads:
        for step in range(cfg.steps):
            images = tasks[step * cfg.groups : (step + 1) * cfg.groups]
            await asyncio.sleep(cfg.train_seconds)
            t0 = time.monotonic()
            await asyncio.gather(
                *(
                    loop.run_in_executor(threads, one, image, k)
                    for image in images
                    for k in range(cfg.group_size)
                )
            )
            run.steps.append(time.monotonic() - t0)
            log(f"naive step {step}: {run.steps[-1]:.2f}s")
    return run


# -- the plot -------------------------------------------------------------------------


def plot(series: list[dict[str, Any]], budget: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s["t"] for s in series]
    fig, axes = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    axes[0].plot(t, [s["pulling"] for s in series], label="pulls in flight")
    axes[0].plot(t, [s["pulled"] for s in series], label="pulls done (recent)")
    axes[0].set_ylabel("pulls")
    axes[0].legend(loc="upper left")
    axes[1].plot(t, [s["cache_bytes"] / MB for s in series], label="image cache")
    axes[1].axhline(budget / MB, color="red", linestyle="--", label="budget")
    axes[1].set_ylabel("MB")
    axes[1].legend(loc="upper left")
    images = sorted({i for s in series for i in s["ready"]})
    for image in images:
        axes[2].plot(t, [s["ready"].get(image, 0) for s in series], label=image.rsplit("/", 1)[-1])
    axes[2].set_ylabel("warm sandboxes")
    axes[2].set_xlabel("seconds (prefetch driver)")
    axes[2].legend(loc="upper left", fontsize="small", ncol=3)
    fig.suptitle("Per-task images: queue-driven prefetch")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


# -- the run --------------------------------------------------------------------------


@contextlib.contextmanager
def scene(cfg: Config, engine: docker.DockerClient, base: str) -> Iterator[tuple[list[str], list[int], Path]]:
    with (
        tempfile.TemporaryDirectory(prefix="bench-images-") as tmp,
        run_registry(Path(tmp) / "registry") as reg,
    ):
        published = publish(engine, reg, base, cfg)
        try:
            yield [r for r, _ in published], [s for _, s in published], Path(tmp)
        finally:
            clear(engine, [r for r, _ in published])
            for c in engine.containers.list(all=True, filters={"label": f"{LABEL}=1"}):
                with contextlib.suppress(docker.errors.APIError):
                    c.remove(force=True)


async def main(cfg: Config) -> dict[str, Any]:
    engine = docker.from_env()
    base = ensure_default_image(log=lambda line: log(line))
    base_bytes = int(engine.images.get(base).attrs["Size"])
    with scene(cfg, engine, base) as (tasks, sizes, tmp):
        # Room for two steps' images (the one running, the one announced) and the
        # base, well short of all of them: what past steps used must go.
        per_step = [sum(sizes[s * cfg.groups : (s + 1) * cfg.groups]) for s in range(cfg.steps)]
        two = max(a + b for a, b in itertools.pairwise(per_step)) if cfg.steps > 1 else per_step[0]
        budget = base_bytes + int(two * 1.1)
        everything = base_bytes + sum(sizes)
        log(
            f"{len(tasks)} task images, {sum(sizes) // MB} MB of own layers on a {base_bytes // MB} MB base; "
            f"budget {budget // MB} MB of {everything // MB} MB"
        )
        prefetch = await sandboxd_driver("prefetch", cfg, base, tasks, budget, tmp, announce=True)
        clear(engine, tasks)
        ondemand = await sandboxd_driver("ondemand", cfg, base, tasks, budget, tmp, announce=False)
        clear(engine, tasks)
        naive = await naive_driver(cfg, tasks, engine)
        for ref in tasks:
            engine.images.pull(ref)
        floor = await sandboxd_driver("floor", cfg, base, tasks, budget * 4, tmp, announce=True)
    step_s = statistics.mean(prefetch.steps)
    floor_s = statistics.mean(floor.steps)
    result = {
        "step_s": round(step_s, 3),
        "ondemand_step_s": round(statistics.mean(ondemand.steps), 3),
        "naive_step_s": round(statistics.mean(naive.steps), 3),
        "floor_step_s": round(floor_s, 3),
        "pull_wait_share": round(max(0.0, step_s - floor_s) / step_s, 3),
        "cache_hit_ratio": round(prefetch.hits / max(1, prefetch.asks), 3),
        "disk_high_water_bytes": prefetch.high_water,
        "disk_budget_bytes": budget,
        "all_images_bytes": everything,
        "errors": prefetch.errors + ondemand.errors + naive.errors + floor.errors,
        "steps": {
            "prefetch": [round(s, 3) for s in prefetch.steps],
            "ondemand": [round(s, 3) for s in ondemand.steps],
            "naive": [round(s, 3) for s in naive.steps],
            "floor": [round(s, 3) for s in floor.steps],
        },
        "config": asdict(cfg),
        "host": {"cpus": os.cpu_count(), "platform": platform.platform()},
    }
    goals = {
        "step_s <= 1.25 * floor_step_s": step_s <= 1.25 * floor_s,
        "naive_step_s >= 2 * step_s": result["naive_step_s"] >= 2 * step_s,
        "disk_high_water_bytes <= disk_budget_bytes < all images": prefetch.high_water <= budget < everything,
        "errors == 0": result["errors"] == 0,
    }
    result["goals"] = goals
    for name, value in result.items():
        if name not in ("steps", "config", "host", "goals"):
            log(f"{name:24} {value}")
    for goal, met in goals.items():
        log(f"goal {goal:55} {'met' if met else 'NOT MET'}")
    RESULTS.mkdir(exist_ok=True)
    plot(prefetch.series, budget, PNG_PATH)
    return result


def run_cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    args = parser.parse_args()
    cfg = Config.quick() if args.quick else Config()
    result = asyncio.run(main(cfg))
    if not args.quick:
        JSON_PATH.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    run_cli()
