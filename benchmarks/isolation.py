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
  ``runsc exec``), whose goal is at most twice runc's; and
  ``create_start_runc_writable`` and ``create_start_gvisor_writable``, the
  same for a pool with ``root="writable"`` (a bounded tmpfs mounted over the
  container's layer directory between create and start). The five take
  turns in one loop, before any pool runs;
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
  read through the sandbox under both runtimes so the two are comparable;
- ``root_write_50mb``: one 50 MB file written (and removed, untimed) by one
  shell into the workspace of a read-only pool, and as
  ``root_write_50mb_<runtime>_writable`` into /var/tmp (the image's root
  filesystem) of a writable-root pool of the same runtime, the two
  sandboxes taking turns.

The last line of stdout is one JSON object with ``<metric>_runc_ms`` and
``<metric>_gvisor_ms`` pairs (``<metric>_<runtime>_writable_ms`` for the
writable roots); it is also written to
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
from sandboxd.core.root_setting import ROOT_READ_ONLY, ROOT_WRITABLE
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
# One process writing: zeros, as a tmpfs stores them like any bytes and
# /dev/urandom's own cost would hide the write's.
WRITE_50MB = "head -c 50M /dev/zero > {path}"
WRITE_DIRS = {ROOT_READ_ONLY: "/workspace", ROOT_WRITABLE: "/var/tmp"}


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
    runc, gVisor with the keeper, gVisor without it and both runtimes with
    a writable root, taking turns in one loop before any pool runs: a
    change in the shared host's load falls on all five alike. Medians in
    milliseconds, by runtime ("nokeeper", "<runtime>_writable" for the
    others)."""
    backend = app.control.backend
    kinds = {
        RUNC: (RUNC, True, False),
        GVISOR: (GVISOR, True, False),
        "nokeeper": (GVISOR, False, False),
        f"{RUNC}_writable": (RUNC, True, True),
        f"{GVISOR}_writable": (GVISOR, True, True),
    }
    samples: dict[str, list[float]] = {kind: [] for kind in kinds}
    for _ in range(repeat):
        for kind, (runtime, live, writable) in kinds.items():
            limits = fit_limits(runtime, app.control.resolve_limits(Limits()))
            spec = SandboxSpec(
                f"iso-{secrets.token_hex(4)}",
                "iso-bench",
                image,
                limits,
                runtime=runtime,
                live_snapshots=live,
                writable_root=writable,
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


async def root_writes(runtime: str, client: AsyncClient, image: str, repeat: int) -> dict[str, float]:
    """50 MB written by one shell into the workspace of a read-only pool's
    sandbox and into the root of a writable-root pool's, both of
    ``runtime``, taking turns; medians in milliseconds by root setting."""
    pools = {root: f"iso-{runtime}-{root}" for root in WRITE_DIRS}
    for root, pool in pools.items():
        await client.create_pool(pool, image, min_ready=0, max_size=1, runtime=runtime, root=root)
    samples: dict[str, list[float]] = {root: [] for root in pools}
    async with (
        client.acquire(pools[ROOT_READ_ONLY], timeout=120) as read_only,
        client.acquire(pools[ROOT_WRITABLE], timeout=120) as writable,
    ):
        boxes = {ROOT_READ_ONLY: read_only, ROOT_WRITABLE: writable}
        # One untimed round first: the first write into a fresh root pays
        # for the overlay's copy-up of /var/tmp.
        for i in range(repeat + 1):
            for root, sb in boxes.items():
                path = f"{WRITE_DIRS[root]}/w50"
                t0 = time.perf_counter()
                r = await sb.exec(WRITE_50MB.format(path=path), timeout=120)
                elapsed = (time.perf_counter() - t0) * 1000
                assert r.ok, r
                if i:
                    samples[root].append(elapsed)
                assert (await sb.exec(f"rm {path}")).ok
    for pool in pools.values():
        await client.delete_pool(pool, force=True)
    return {root: round(statistics.median(ms), 2) for root, ms in samples.items()}


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
                writes = {rt: await root_writes(rt, client, image, repeat) for rt in RUNTIMES}
        finally:
            await app.stop(grace=1)
    report: dict[str, Any] = {"benchmark": "isolation", "repeat": repeat}
    for rt in RUNTIMES:
        report[f"create_start_{rt}_ms"] = starts[rt]
    report["create_start_ratio"] = round(starts[GVISOR] / max(starts[RUNC], 0.1), 2)
    # Without the keeper, beside runc's create in the same loop (goal: at most 2x).
    report["create_start_gvisor_nokeeper_ms"] = starts["nokeeper"]
    report["create_start_nokeeper_ratio"] = round(starts["nokeeper"] / max(starts[RUNC], 0.1), 2)
    # A writable root beside the read-only one, each ratio to the same runtime's read-only create.
    for rt in RUNTIMES:
        writable = starts[f"{rt}_writable"]
        report[f"create_start_{rt}_writable_ms"] = writable
        report[f"create_start_{rt}_writable_ratio"] = round(writable / max(starts[rt], 0.1), 2)
    for metric in results[RUNC]:
        for rt in RUNTIMES:
            report[f"{metric}_{rt}_ms"] = results[rt][metric]
        report[f"{metric}_ratio"] = round(results[GVISOR][metric] / max(results[RUNC][metric], 0.1), 2)
    for rt in RUNTIMES:
        ro, rw = writes[rt][ROOT_READ_ONLY], writes[rt][ROOT_WRITABLE]
        report[f"root_write_50mb_{rt}_ms"] = ro
        report[f"root_write_50mb_{rt}_writable_ms"] = rw
        report[f"root_write_50mb_{rt}_writable_ratio"] = round(rw / max(ro, 0.1), 2)
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
