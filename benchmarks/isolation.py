"""What gVisor costs next to runc, measured side by side in one run on Docker.

    python -m benchmarks.isolation            # about 3 minutes on 2 cores
    python -m benchmarks.isolation --repeat 3 # fewer samples

One in-process server on the local engine with two pools of the default
image, one per runtime, then for each runtime (medians of ``--repeat``
samples, in milliseconds):

- ``create_start``: the backend's create of one sandbox: container create and
  start and the first command (its health check); also
  ``create_start_gvisor_nokeeper``, the same for a pool with
  ``live_snapshots`` off (no keeper or relay: shells straight on
  ``runsc exec``), whose goal is at most twice runc's. The three take turns
  in one loop, before any pool runs;
- ``warm_acquire``: Acquire of a READY sandbox from a warm pool;
- ``session_exec``: ``true`` in a session, as the client sees it, once the
  pool has finished starting the acquired sandbox's replacement;
- ``session_exec_backend``: the same through the backend alone, in the
  server's process (no RPC): what the runtime costs a round trip, apart
  from the gRPC path sharing the host's cores with it;
- ``file_creates``: 2,000 empty files created and removed by one shell
  (syscall-heavy: each create is several syscalls that gVisor serves itself);
- ``python_tests``: a 40-test unittest module run by ``python3 -m unittest``
  (interpreter start, imports, small files);
- ``snapshot_50mb``: a snapshot of a 50 MB workspace of 200 files, their
  content new before each sample (a whole snapshot, not an incremental one),
  read through the sandbox under both runtimes so the two are comparable.

The last line of stdout is one JSON object with ``<metric>_runc_ms`` and
``<metric>_gvisor_ms`` pairs; it is also written to
benchmarks/results/isolation.json. Exits 2 when the engine has no gVisor
runtime registered (scripts/setup.sh test registers it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from sandboxd.app import build_app
from sandboxd.backends.base import GVISOR, RUNC, RUNTIMES, ExecSpec, Limits, SandboxSpec
from sandboxd.client import AsyncClient
from sandboxd.core.runtimes import fit_limits
from sandboxd.settings import load_settings

RESULTS_PATH = Path(__file__).resolve().parent / "results" / "isolation.json"

FILE_CREATES = (
    "mkdir -p fc && cd fc && for i in $(seq 2000); do : > f$i; done && rm -f f* && cd .. && rmdir fc"
)
PY_TESTS = "import json, unittest\n\n\nclass T(unittest.TestCase):\n" + "".join(
    f"    def test_{i}(self) -> None:\n"
    f"        with open('t{i}.json', 'w') as f:\n            json.dump({{'i': {i}}}, f)\n"
    f"        with open('t{i}.json') as f:\n            self.assertEqual(json.load(f)['i'], {i})\n"
    for i in range(40)
)
# 200 files of 250 KiB of random bytes (incompressible, like build outputs).
MAKE_50MB = "mkdir -p big && for i in $(seq 200); do head -c 256000 /dev/urandom > big/f$i; done"


async def _median_ms(fn: Callable[[], Awaitable[Any]], repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        await fn()
        samples.append((time.perf_counter() - t0) * 1000)
    return round(statistics.median(samples), 2)


async def _ready(client: AsyncClient, pool: str, n: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while (await client.get_pool(pool)).status.ready < n:
        if time.monotonic() > deadline:
            raise RuntimeError(f"pool {pool} did not warm {n} sandboxes in {timeout:.0f}s")
        await asyncio.sleep(0.1)  # a benchmark's poll interval, not a test's wait


async def _settled(client: AsyncClient, pool: str, timeout: float = 120.0) -> None:
    """Waits until the pool starts and stops nothing."""
    deadline = time.monotonic() + timeout
    while True:
        status = (await client.get_pool(pool)).status
        if status.creating == 0 and status.releasing == 0:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"pool {pool} did not settle in {timeout:.0f}s")
        await asyncio.sleep(0.1)  # a benchmark's poll interval, not a test's wait


async def create_starts(app: Any, image: str, repeat: int) -> dict[str, float]:
    """The backend's create of one sandbox (and its destroy, untimed) for
    runc, gVisor with the keeper and gVisor without it, taking turns in one
    loop before any pool runs: a change in the shared host's load falls on
    all three alike. Medians in milliseconds, by runtime ("nokeeper" for
    the last)."""
    backend = app.control.backend
    kinds = {RUNC: (RUNC, True), GVISOR: (GVISOR, True), "nokeeper": (GVISOR, False)}
    samples: dict[str, list[float]] = {kind: [] for kind in kinds}
    for _ in range(repeat):
        for kind, (runtime, live) in kinds.items():
            limits = fit_limits(runtime, app.control.resolve_limits(Limits()))
            spec = SandboxSpec(
                f"iso-{secrets.token_hex(4)}",
                "iso-bench",
                image,
                limits,
                runtime=runtime,
                live_snapshots=live,
            )
            t0 = time.perf_counter()
            handle = await backend.create(spec)
            samples[kind].append((time.perf_counter() - t0) * 1000)
            await backend.destroy(handle)
    return {kind: round(statistics.median(ms), 2) for kind, ms in samples.items()}


async def measure(runtime: str, client: AsyncClient, app: Any, image: str, repeat: int) -> dict[str, float]:
    """Every metric for ``runtime``, in milliseconds."""
    pool = f"iso-{runtime}"
    await client.create_pool(pool, image, min_ready=2, max_size=4, runtime=runtime)
    out: dict[str, float] = {}
    backend = app.control.backend

    async def warm_acquire() -> None:
        await _ready(client, pool, 2)
        t0 = time.perf_counter()
        lease = await client.lease(pool, timeout=60)
        elapsed = time.perf_counter() - t0
        await lease.release()
        acquire_samples.append(elapsed * 1000)

    acquire_samples: list[float] = []
    for _ in range(repeat):
        await warm_acquire()
    out["warm_acquire"] = round(statistics.median(acquire_samples), 1)

    await _ready(client, pool, 1)
    async with client.acquire(pool, timeout=60) as sb:

        async def session_exec() -> None:
            assert (await sb.exec("true", session="s")).ok

        await session_exec()
        # The acquire made the pool start a replacement: a sandbox start (a
        # gVisor one above all) takes a core of this host for a while, and the
        # round trip measured beside it would be the start's, not the exec's.
        await _settled(client, pool)
        out["session_exec"] = await _median_ms(session_exec, max(repeat, 20))
        (handle,) = app.control.registry.handles([sb.id])

        async def session_exec_backend() -> None:
            async for _ in backend.exec(handle, ExecSpec(shell="true", session="bench-backend")):
                pass

        await session_exec_backend()
        out["session_exec_backend"] = await _median_ms(session_exec_backend, max(repeat, 20))

        async def file_creates() -> None:
            r = await sb.exec(FILE_CREATES, timeout=120)
            assert r.ok, r

        out["file_creates"] = await _median_ms(file_creates, repeat)
        await sb.write_file("test_bench.py", PY_TESTS)

        async def python_tests() -> None:
            r = await sb.exec("python3 -m unittest -q test_bench 2>&1", timeout=120)
            assert r.ok, r

        out["python_tests"] = await _median_ms(python_tests, repeat)
        snapshot_samples = []
        for _ in range(repeat):
            # Fresh random content each time (untimed), so every sample is a
            # whole 50 MB snapshot rather than an incremental one.
            assert (await sb.exec(MAKE_50MB, timeout=120)).ok
            t0 = time.perf_counter()
            snap = await sb.snapshot()
            snapshot_samples.append((time.perf_counter() - t0) * 1000)
            await client.delete_snapshot(snap.id)
        out["snapshot_50mb"] = round(statistics.median(snapshot_samples), 1)
    await client.delete_pool(pool, force=True)
    return out


async def run(repeat: int) -> dict[str, Any]:
    """Both runtimes measured in one server; the report as written."""
    from sandboxd.images.build import ensure_default_image

    image = ensure_default_image(log=lambda _: None)
    with tempfile.TemporaryDirectory() as state:
        settings = load_settings(
            None,
            {
                "instance_id": "iso-" + secrets.token_hex(4),
                "state_dir": state,
                "server.port": 0,
                # Snapshots read through the sandbox under both runtimes.
                "backend.host_workspaces": False,
            },
        )
        app = build_app(settings)
        await app.start()
        try:
            async with AsyncClient(app.address) as client:
                if GVISOR not in await app.control.backend.runtimes():  # type: ignore[attr-defined]
                    raise SystemExit(2)
                starts = await create_starts(app, image, repeat)
                results = {rt: await measure(rt, client, app, image, repeat) for rt in RUNTIMES}
        finally:
            await app.stop(grace=1)
    report: dict[str, Any] = {"benchmark": "isolation", "repeat": repeat}
    for rt in RUNTIMES:
        report[f"create_start_{rt}_ms"] = starts[rt]
    report["create_start_ratio"] = round(starts[GVISOR] / max(starts[RUNC], 0.1), 2)
    # Without the keeper, beside runc's create in the same loop (goal: at most 2x).
    report["create_start_gvisor_nokeeper_ms"] = starts["nokeeper"]
    report["create_start_nokeeper_ratio"] = round(starts["nokeeper"] / max(starts[RUNC], 0.1), 2)
    for metric in results[RUNC]:
        for rt in RUNTIMES:
            report[f"{metric}_{rt}_ms"] = results[rt][metric]
        report[f"{metric}_ratio"] = round(results[GVISOR][metric] / max(results[RUNC][metric], 0.1), 2)
    report["host"] = {"cpus": os.cpu_count(), "kernel": platform.release(), "load_1m": os.getloadavg()[0]}
    return report


def main(argv: list[str] | None = None) -> int:
    """Runs the benchmark, prints the report's JSON last and writes it to RESULTS_PATH."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.isolation", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--repeat", type=int, default=7, help="samples per metric (medians are reported)")
    parser.add_argument("--output", type=Path, default=RESULTS_PATH)
    args = parser.parse_args(argv)
    try:
        report = asyncio.run(run(args.repeat))
    except SystemExit as e:
        if e.code == 2:
            print(
                "the engine has no gVisor runtime (runsc) registered; run scripts/setup.sh test",
                file=sys.stderr,
            )
        raise
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
