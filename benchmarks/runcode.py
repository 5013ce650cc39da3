"""SandboxFusion ``/run_code`` through sandboxd next to plain ``docker run`` per program.

    python -m benchmarks.runcode                 # 1, 16 and 128 concurrent
    python -m benchmarks.runcode --concurrency 1 4 --rounds 1

Starts ``sandboxd serve`` and ``sandboxd run-code`` as separate processes on
the code-judge image, then sends the same mixed batch of programs (python,
bash, cpp, nodejs, ruby; some wrong, one that does not compile, one that runs
past its time limit) at each concurrency, once through ``/run_code`` and once
as one ``docker run --rm`` per program (the same commands, files written by a
shell prelude). A request counts as an error when its answer is not the one
SandboxFusion would give (status and run status per program), or when HTTP
fails. Every call is bounded; on exit (errors and Ctrl-C included) the pool is
deleted, both servers get SIGTERM and containers left with the benchmark's
labels are removed. After the mix, SandboxFusion's own tests (its runner
tests and the dataset tests that post to /run_code, benchmarks.runcode_sf)
are replayed against the same server, one at a time (sf_suite_passed of
sf_suite_total) and eight at once (sf_suite_passed_at_8). Before the mix, a burst of trivial programs
(``print(1)``) at 16 and 128 at once measures what a burst costs beyond the
programs, on a server idle before it. The last stdout line is the JSON
written to benchmarks/results/runcode.json.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import secrets
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import docker

from benchmarks.acquire_exec import ServerProcess, free_port, percentile, sweep
from benchmarks.runcode_sf import suite_report
from sandboxd.adapters.sandboxfusion import POOL_MEMORY_MB, ensure_pool
from sandboxd.adapters.sandboxfusion_langs import LANGUAGES
from sandboxd.client import AsyncClient

POOL = "runcode-bench"
RESULTS = Path(__file__).parent / "results" / "runcode.json"
# Seconds any one call may take before it counts as an error.
CALL_LIMIT = 120.0


@dataclass(frozen=True)
class Program:
    """One program of the batch and the answer SandboxFusion gives it."""

    language: str
    code: str
    status: str
    run_status: str | None
    run_timeout: float = 5.0


MIX: tuple[Program, ...] = (
    Program("python", "print(sum(range(1000)))", "Success", "Finished"),
    Program("python", "import sys\nsys.exit(1)", "Failed", "Finished"),
    Program("python", "while True: pass", "Failed", "TimeLimitExceeded", run_timeout=1.0),
    Program("bash", "echo $((6*7))", "Success", "Finished"),
    Program("cpp", '#include <cstdio>\nint main(){puts("ok");}', "Success", "Finished"),
    Program("cpp", "int main(){return x;}", "Failed", None),
    Program("nodejs", "console.log([1,2,3].map(x => x * 2))", "Success", "Finished"),
    Program("ruby", "puts [1, 2].sum", "Success", "Finished"),
)


# The shortest program there is: what a burst costs beyond the programs themselves.
TRIVIAL = Program("python", "print(1)", "Success", "Finished")


def _docker_script(p: Program) -> str:
    runner = LANGUAGES[p.language]
    encoded = base64.b64encode(p.code.encode()).decode()
    steps = [f"echo {encoded} | base64 -d > {runner.source}"]
    if runner.compile:
        steps.append(f"timeout 10 {runner.compile}")
    steps.append(f"timeout {p.run_timeout:g} {runner.run}")
    return "mkdir -p /tmp/w && cd /tmp/w && " + " && ".join(steps)


async def _one_http(http: aiohttp.ClientSession, url: str, p: Program) -> tuple[float, str]:
    body = {
        "code": p.code,
        "language": p.language,
        "run_timeout": p.run_timeout,
        "memory_limit_MB": POOL_MEMORY_MB,
    }
    t0 = time.perf_counter()
    try:
        async with asyncio.timeout(CALL_LIMIT), http.post(url, json=body) as r:
            answer = await r.json() if r.status == 200 else {}
    except (aiohttp.ClientError, TimeoutError, ValueError):
        answer = {}
    took = time.perf_counter() - t0
    run_status = (answer.get("run_result") or {}).get("status")
    if answer.get("status") == p.status and run_status == p.run_status:
        return took, ""
    compiled = (answer.get("compile_result") or {}).get("status")
    return (
        took,
        f"{p.language}:{p.status}/{p.run_status} got {answer.get('status')}/{run_status} compile {compiled}",
    )


async def _one_docker(image: str, label: str, p: Program) -> tuple[float, str]:
    cmd = ["docker", "run", "--rm", "--network", "none", "--label", label, "-u", "1000", "-e", "HOME=/tmp"]
    cmd += [image, "bash", "-c", _docker_script(p)]
    t0 = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        *cmd, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
    )
    try:
        async with asyncio.timeout(CALL_LIMIT):
            code = await proc.wait()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return time.perf_counter() - t0, f"{p.language}: no exit within {CALL_LIMIT:g}s"
    took = time.perf_counter() - t0
    if (code == 0) == (p.status == "Success"):
        return took, ""
    return took, f"{p.language}:{p.status}/{p.run_status} got exit {code}"


async def _batch(n: int, concurrency: int, call: Any, mix: Sequence[Program] = MIX) -> dict[str, Any]:
    gate = asyncio.Semaphore(concurrency)
    programs = [mix[i % len(mix)] for i in range(n)]

    async def one(p: Program) -> tuple[float, str]:
        async with gate:
            result: tuple[float, str] = await call(p)
            return result

    t0 = time.perf_counter()
    results = await asyncio.gather(*(one(p) for p in programs))
    wall = time.perf_counter() - t0
    lat = [r[0] for r in results]
    return {
        "n": n,
        "p50_ms": round(percentile(lat, 50) * 1000, 1),
        "p99_ms": round(percentile(lat, 99) * 1000, 1),
        "errors": sum(1 for r in results if r[1]),
        "error_kinds": dict(Counter(r[1] for r in results if r[1])),
        "requests_per_s": round(n / wall, 2),
    }


async def _wait_http(url: str, proc: asyncio.subprocess.Process, within: float) -> None:
    deadline = time.monotonic() + within
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            if proc.returncode is not None:
                raise RuntimeError(f"run-code server exited with {proc.returncode}")
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(url) as r:
                    if r.status == 200:
                        return
            await asyncio.sleep(0.1)  # the poll interval of this bounded start-up wait
    raise TimeoutError(f"run-code server not up within {within:g}s")


async def _stats(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with asyncio.timeout(CALL_LIMIT), http.get(url) as r:
        answer: dict[str, Any] = await r.json()
        return answer


async def _wait_reserve(http: aiohttp.ClientSession, url: str, n: int, within: float) -> None:
    deadline = time.monotonic() + within
    while (await _stats(http, url))["idle"] < n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"run-code reserve of {n} not prepared within {within:g}s")
        await asyncio.sleep(0.2)  # the poll interval of this bounded wait


async def _settle(address: str, within: float) -> None:
    """Waits for the pool to stop creating (its own top-up after the reserve's leases)."""
    deadline = time.monotonic() + within
    async with AsyncClient(address) as client:
        while (await client.get_pool(POOL)).status.creating:
            if time.monotonic() > deadline:
                raise TimeoutError(f"pool still creating after {within:g}s")
            await asyncio.sleep(0.2)  # the poll interval of this bounded wait


async def _trivial_bursts(
    http: aiohttp.ClientSession, url: str, stats_url: str, address: str, image: str, label: str
) -> dict[str, Any]:
    """``print(1)`` at once from a server idle before it: 16 (fresh, then again after the
    first burst's sandboxes came back) and 128, with how many requests waited for a sandbox."""
    out: dict[str, Any] = {}
    for name, n in (("16_fresh", 16), ("16_again", 16), ("128", 128)):
        if name == "16_again":
            await _wait_reserve(http, stats_url, 16, 120)
        await _settle(address, 180)
        before = await _stats(http, stats_url)
        rc = await _batch(n, n, lambda _: _one_http(http, url, TRIVIAL), [TRIVIAL])
        after = await _stats(http, stats_url)
        out[name] = {
            "runcode_p50_ms": rc["p50_ms"],
            "runcode_p99_ms": rc["p99_ms"],
            "errors": rc["errors"],
            "waited_for_sandbox": after["waited"] - before["waited"],
            "leased_during": after["leased"] - before["leased"],
            "n": n,
        }
    dk = await _batch(16, 16, lambda p: _one_docker(image, label, p), [TRIVIAL])
    out["16_fresh"]["docker_run_p50_ms"] = dk["p50_ms"]
    out["16_fresh"]["docker_run_p99_ms"] = dk["p99_ms"]
    return out


async def bench(args: argparse.Namespace, server: ServerProcess, image: str, label: str) -> dict[str, Any]:
    """Runs every concurrency through /run_code and through docker run; returns the report."""
    await server.wait_healthy(60)
    async with AsyncClient(server.address) as client:
        # As `sandboxd run-code --image` makes its pool: memory for verl's default
        # memory_limit_MB (1024), which every request of the mix asks for.
        await ensure_pool(
            client, POOL, image, memory_mb=POOL_MEMORY_MB, min_ready=args.warm, max_size=args.max_size
        )
    port = free_port()
    rc_cmd = [
        sys.executable,
        "-m",
        "sandboxd.cli",
        "--log-level",
        "WARNING",
        "run-code",
        "--target",
        server.address,
    ]
    rc_cmd += ["--pool", POOL, "--port", str(port), "--acquire-timeout", str(CALL_LIMIT)]
    rc_cmd += ["--reserve", str(args.reserve)]
    run_code = await asyncio.create_subprocess_exec(
        *rc_cmd, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL, start_new_session=True
    )
    try:
        await _wait_http(f"http://127.0.0.1:{port}/v1/ping", run_code, 30)
        url = f"http://127.0.0.1:{port}/run_code"
        per: dict[str, Any] = {}
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            stats_url = f"http://127.0.0.1:{port}/sandboxd/stats"
            await _wait_reserve(http, stats_url, args.reserve, 180)
            trivial = await _trivial_bursts(http, url, stats_url, server.address, image, label)
            print(json.dumps({"trivial": trivial}), flush=True)
            # One untimed pass warms the pool and the page cache of the toolchains.
            await _batch(len(MIX), len(MIX), lambda p: _one_http(http, url, p))
            for c in args.concurrency:
                n = max(len(MIX) * args.rounds, c)
                rc = await _batch(n, c, lambda p: _one_http(http, url, p))
                dk = await _batch(n, c, lambda p: _one_docker(image, label, p))
                per[str(c)] = {
                    "runcode_p50_ms": rc["p50_ms"],
                    "runcode_p99_ms": rc["p99_ms"],
                    "docker_run_p50_ms": dk["p50_ms"],
                    "docker_run_p99_ms": dk["p99_ms"],
                    "errors": rc["errors"],
                    "docker_errors": dk["errors"],
                    "error_kinds": rc["error_kinds"],
                    "docker_error_kinds": dk["error_kinds"],
                    "requests_per_s": rc["requests_per_s"],
                    "docker_requests_per_s": dk["requests_per_s"],
                    "n": n,
                }
                print(json.dumps({"concurrency": c, **per[str(c)]}), flush=True)
        suite: dict[str, Any] = {}
        if args.sf_suite:
            suite = await suite_report(f"http://127.0.0.1:{port}", concurrency=8)
            print(json.dumps(suite), flush=True)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run_code.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(run_code.wait(), 30)
        except TimeoutError:
            os.killpg(run_code.pid, signal.SIGKILL)
            await run_code.wait()
        async with AsyncClient(server.address) as client:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.delete_pool(POOL, force=True), 120)
    top = per[str(max(args.concurrency))]
    return {
        "benchmark": "runcode",
        "image": image,
        "mix": [f"{p.language}:{p.status}/{p.run_status}" for p in MIX],
        "per_concurrency": per,
        "trivial_burst": trivial,
        "runcode_p50_ms": top["runcode_p50_ms"],
        "runcode_p99_ms": top["runcode_p99_ms"],
        "docker_run_p50_ms": top["docker_run_p50_ms"],
        "errors": sum(v["errors"] for v in per.values()),
        "requests_per_s": top["requests_per_s"],
        "concurrency": max(args.concurrency),
        **suite,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the benchmark, prints per-concurrency lines and the report as the last line."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.runcode")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 128])
    parser.add_argument("--rounds", type=int, default=2, help="passes over the mix at each concurrency")
    parser.add_argument("--warm", type=int, default=16, help="pool min_ready")
    parser.add_argument("--max-size", type=int, default=32, help="pool max_size")
    parser.add_argument("--reserve", type=int, default=16, help="run-code's --reserve")
    parser.add_argument("--image", default="", help="default: the code-judge image")
    parser.add_argument(
        "--no-sf-suite",
        dest="sf_suite",
        action="store_false",
        help="skip the replay of SandboxFusion's own tests",
    )
    args = parser.parse_args(argv)
    from sandboxd.images.codejudge import ensure_code_judge_image

    image = args.image or ensure_code_judge_image(log=lambda m: print(m, file=sys.stderr))
    instance = "bench-rc-" + secrets.token_hex(3)
    label = f"sandboxd.bench={instance}"
    state = Path(tempfile.mkdtemp(prefix="runcode-bench-"))
    server = ServerProcess(instance, state)
    dk = docker.from_env()
    try:
        report = asyncio.run(bench(args, server, image, label))
    finally:
        server.stop()
        left = sweep(dk, instance)
        for c in dk.containers.list(all=True, filters={"label": label}):
            with contextlib.suppress(docker.errors.APIError):
                c.remove(force=True)
    report["leaked"] = len(left)
    report["load_1m"] = os.getloadavg()[0]
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["MIX", "TRIVIAL", "Program", "bench", "main"]
