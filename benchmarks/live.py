"""Live snapshots of gVisor sandboxes beside a cold start, in one run on Docker.

    python -m benchmarks.live              # about 5 minutes on 2 cores
    python -m benchmarks.live --repeat 1   # one sample of each

One in-process server on the local engine with a gVisor pool of the default
image. For each size of process memory (64 and 256 MiB by default), the
*setup* is: write a small program, start it in the background from a
session and wait until it has filled that much memory with random bytes
(incompressible, like a loaded model or a built index). Then, medians of ``--repeat`` samples
in milliseconds:

- ``pause`` / ``resume``: Pause and Resume of the running sandbox;
- ``checkpoint``: Snapshot(live=true), image stored (``image_mb``: its size);
- ``restore``: Restore into one sandbox, until the program answers there;
- ``fork4``: Restore with n=4, until it answers in all four;
- baseline, in the same run: ``cold_start`` (a gVisor sandbox created and
  started, its first command run) plus ``replay`` (the same setup commands
  in a fresh sandbox, until the program is ready): ``cold_plus_replay``.

The last line of stdout is one JSON object; it is also written to
benchmarks/results/live.json. Exits 2 when the engine has no gVisor runtime.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
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

from sandboxd.app import App, build_app
from sandboxd.backends.base import GVISOR, Limits, SandboxSpec
from sandboxd.client import AsyncClient
from sandboxd.client.aio import Sandbox
from sandboxd.core.runtimes import fit_limits
from sandboxd.settings import load_settings

RESULTS_PATH = Path(__file__).resolve().parent / "results" / "live.json"
POOL = "live-bench"
MEMORY_LIMIT = 1 << 30

# Fills MiB of memory with random bytes, says "ready", then ticks.
PROGRAM = """
import os, sys, time
block = bytearray(os.urandom(int(sys.argv[1]) << 20))
open('/tmp/ready', 'w').write('ready')
tick = 0
while True:
    tick += 1
    open('/tmp/tick.tmp', 'w').write(str(tick))
    os.replace('/tmp/tick.tmp', '/tmp/tick')
    time.sleep(0.05)
"""


async def _wait(sb: Sandbox, command: str, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not (await sb.exec(command)).ok:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{command!r} did not succeed in {sb.id} within {timeout:.0f}s")
        await asyncio.sleep(0.02)  # a benchmark's poll interval, not a test's wait


async def _ticking(sb: Sandbox) -> None:
    """Until the program's tick moves in ``sb`` (it runs there)."""
    first = (await sb.exec("cat /tmp/tick")).stdout
    await _wait(sb, f'[ "$(cat /tmp/tick)" != {first.decode() or "0"!r} ]')


async def _setup(sb: Sandbox, mib: int) -> None:
    await sb.write_files({"prog.py": PROGRAM})
    # From a session, as an agent would start it: the session's shell and
    # what it started are carried.
    assert (await sb.exec(f"python3 prog.py {mib} >/dev/null 2>&1 &", session="agent")).ok
    await _wait(sb, "test -s /tmp/ready && test -s /tmp/tick")


async def _ready(client: AsyncClient, n: int, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while (await client.get_pool(POOL)).status.ready < n:
        if time.monotonic() > deadline:
            raise RuntimeError(f"pool {POOL} did not warm {n} sandboxes in {timeout:.0f}s")
        await asyncio.sleep(0.1)  # a benchmark's poll interval, not a test's wait


def _median(samples: list[float]) -> float:
    return round(statistics.median(samples), 1)


async def _timed(fn: Callable[[], Awaitable[Any]]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = await fn()
    return (time.perf_counter() - t0) * 1000, out


async def measure(client: AsyncClient, app: App, image: str, mib: int, repeat: int) -> dict[str, float]:
    """Every metric at ``mib`` MiB of process memory, in milliseconds."""
    samples: dict[str, list[float]] = {
        k: []
        for k in ("pause", "resume", "checkpoint", "restore", "fork4", "cold_start", "replay", "image_mb")
    }
    backend = app.control.backend
    limits = fit_limits(GVISOR, app.control.resolve_limits(Limits(memory_bytes=MEMORY_LIMIT)))
    for _ in range(repeat):
        # Baseline: a sandbox created cold, then the setup replayed in a warm one.
        spec = SandboxSpec(f"lb-{secrets.token_hex(4)}", "live-bench-cold", image, limits, runtime=GVISOR)
        ms, handle = await _timed(functools.partial(backend.create, spec))
        samples["cold_start"].append(ms)
        await backend.destroy(handle)
        await _ready(client, 1)
        async with client.acquire(POOL, timeout=300) as sb:
            ms, _ = await _timed(functools.partial(_setup, sb, mib))
            samples["replay"].append(ms)
            ms, _ = await _timed(sb.pause)
            samples["pause"].append(ms)
            ms, _ = await _timed(sb.resume)
            samples["resume"].append(ms)
            await _ticking(sb)
            ms, snap = await _timed(functools.partial(sb.snapshot, live=True))
            samples["checkpoint"].append(ms)
            samples["image_mb"].append(snap.size_bytes / 1e6)

        async def restore_one(snap_id: str = snap.id) -> None:
            lease = await client.restore(snap_id, timeout=300)
            try:
                await _ticking(lease[0])
            finally:
                await lease.release()

        await _ready(client, 1)
        ms, _ = await _timed(restore_one)
        samples["restore"].append(ms)

        async def fork(snap_id: str = snap.id) -> None:
            lease = await client.restore(snap_id, n=4, timeout=300)
            try:
                await asyncio.gather(*(_ticking(s) for s in lease))
            finally:
                await lease.release()

        await _ready(client, 4)
        ms, _ = await _timed(fork)
        samples["fork4"].append(ms)
        await client.delete_snapshot(snap.id)
    out = {k: _median(v) for k, v in samples.items()}
    out["cold_plus_replay"] = round(out["cold_start"] + out["replay"], 1)
    return out


async def run(sizes: list[int], repeat: int) -> dict[str, Any]:
    """Every size measured in one server; the report as written."""
    from sandboxd.images.build import ensure_default_image

    image = ensure_default_image(log=lambda _: None)
    with tempfile.TemporaryDirectory() as state:
        settings = load_settings(
            None, {"instance_id": "lb-" + secrets.token_hex(4), "state_dir": state, "server.port": 0}
        )
        app = build_app(settings)
        await app.start()
        try:
            async with AsyncClient(app.address) as client:
                if GVISOR not in await app.control.backend.runtimes():  # type: ignore[attr-defined]
                    raise SystemExit(2)
                await client.create_pool(
                    POOL,
                    image,
                    min_ready=4,
                    max_size=6,
                    runtime=GVISOR,
                    limits={"memory_bytes": MEMORY_LIMIT},
                )
                results = {mib: await measure(client, app, image, mib, repeat) for mib in sizes}
                await client.delete_pool(POOL, force=True)
        finally:
            await app.stop(grace=1)
    report: dict[str, Any] = {"benchmark": "live", "repeat": repeat}
    for mib, metrics in results.items():
        for metric, value in metrics.items():
            suffix = "" if metric == "image_mb" else "_ms"
            report[f"{metric}_{mib}mib{suffix}"] = value
        report[f"restore_vs_cold_{mib}mib"] = round(
            metrics["restore"] / max(metrics["cold_plus_replay"], 0.1), 2
        )
    report["host"] = {"cpus": os.cpu_count(), "kernel": platform.release(), "load_1m": os.getloadavg()[0]}
    return report


def main(argv: list[str] | None = None) -> int:
    """Runs the benchmark, prints the report's JSON last and writes it to RESULTS_PATH."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.live", description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="samples per metric (medians are reported)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 256], help="MiB of process memory")
    parser.add_argument("--output", type=Path, default=RESULTS_PATH)
    args = parser.parse_args(argv)
    try:
        report = asyncio.run(run(args.sizes, args.repeat))
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
