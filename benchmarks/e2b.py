"""The unchanged ``e2b`` SDK against sandboxd's E2B API, beside the same
operations through sandboxd's own client, in one run.

    python -m benchmarks.e2b
    python -m benchmarks.e2b --commands 200 --creates 10

Starts ``sandboxd serve`` and ``sandboxd e2b-api`` as separate processes,
creates a warm pool of the default image (the ``base`` template), then
measures through the async SDK: create + first command (``e2b_create_first_cmd_ms``,
median), a command's round trip on one sandbox (``e2b_cmd_p50_ms``) and a
1 MiB file write (``e2b_write_1mb_ms``, median); and through sandboxd's
client the same command (``bash -l -c true``, the argv the SDK sends) on a
leased sandbox (``native_cmd_p50_ms``). ``errors`` counts calls that raised
or answered wrongly. Every call is bounded; on exit the pool is deleted, both
servers stopped and containers left with the instance's label removed. The
last stdout line is the JSON written to benchmarks/results/e2b.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import docker

from benchmarks.acquire_exec import ServerProcess, free_port, percentile, sweep
from sandboxd.client import AsyncClient
from sandboxd.images.build import ensure_default_image

POOL = "e2b-bench"
KEY = "e2b_" + "be" * 20
RESULTS = Path(__file__).parent / "results" / "e2b.json"
CALL_LIMIT = 60.0
COMMAND = ["/bin/bash", "-l", "-c", "true"]


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class Errors:
    def __init__(self) -> None:
        self.count = 0
        self.kinds: dict[str, int] = {}

    async def timed(self, call: Callable[[], Awaitable[bool]]) -> float | None:
        """Seconds ``call`` took, or None (an error) when it raised or answered wrongly."""
        t0 = time.perf_counter()
        try:
            async with asyncio.timeout(CALL_LIMIT):
                ok = await call()
        except Exception as e:
            ok = False
            kind = type(e).__name__
            self.kinds[kind] = self.kinds.get(kind, 0) + 1
        took = time.perf_counter() - t0
        if not ok:
            self.count += 1
            return None
        return took


def _ms(samples: list[float], q: float) -> float:
    return round(percentile(samples, q) * 1000, 2)


async def _wait_e2b(url: str, proc: subprocess.Popen[bytes], within: float) -> None:
    deadline = time.monotonic() + within
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"e2b-api exited with {proc.returncode}")
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(f"{url}/health") as r:
                    if r.status in (204, 502):  # up: 502 = no such sandbox
                        return
            await asyncio.sleep(0.1)  # the poll interval of this bounded start-up wait
    raise TimeoutError(f"e2b-api not up within {within:g}s")


async def bench(args: argparse.Namespace, server: ServerProcess, url: str, image: str) -> dict[str, Any]:
    from e2b import AsyncSandbox

    errors = Errors()
    async with AsyncClient(server.address) as client:
        await client.create_pool(POOL, image, min_ready=args.creates + 2, max_size=args.creates + 8)
        deadline = time.monotonic() + 300
        while (await client.get_pool(POOL)).status.ready < args.creates + 2:
            if time.monotonic() > deadline:
                raise TimeoutError("pool not warm within 300 s")
            await asyncio.sleep(0.2)  # the poll interval of this bounded warm-up wait

        # Native: the same argv through sandboxd's client on a leased sandbox.
        native: list[float] = []
        async with client.acquire(POOL, timeout=CALL_LIMIT) as sb:
            for i in range(args.commands + 5):

                async def native_cmd() -> bool:
                    result = await sb.exec(COMMAND)
                    return bool(result.ok)

                took = await errors.timed(native_cmd)
                if took is not None and i >= 5:  # the first few warm the channel
                    native.append(took)

        creates: list[float] = []
        for _ in range(args.creates):
            made: list[Any] = []

            async def create_and_run(made: list[Any] = made) -> bool:
                sbx = await AsyncSandbox.create(api_key=KEY, api_url=url, sandbox_url=url, timeout=120)
                made.append(sbx)
                return (await sbx.commands.run("echo ok")).stdout == "ok\n"

            took = await errors.timed(create_and_run)
            if took is not None:
                creates.append(took)
            for sbx in made:
                await sbx.kill()

        sbx = await AsyncSandbox.create(api_key=KEY, api_url=url, sandbox_url=url, timeout=300)
        try:
            e2b_cmd: list[float] = []
            for i in range(args.commands + 5):

                async def e2b_run() -> bool:
                    return (await sbx.commands.run("true")).exit_code == 0

                took = await errors.timed(e2b_run)
                if took is not None and i >= 5:
                    e2b_cmd.append(took)

            payload = os.urandom(1 << 20)
            writes: list[float] = []
            for i in range(args.writes):
                path = f"/workspace/blob-{i}.bin"

                async def write(path: str = path) -> bool:
                    await sbx.files.write(path, payload)
                    return True

                took = await errors.timed(write)
                if took is not None:
                    writes.append(took)
            back = await sbx.files.read("/workspace/blob-0.bin", format="bytes")
            if bytes(back) != payload:
                errors.count += 1
                errors.kinds["write_read_mismatch"] = 1
        finally:
            await sbx.kill()
        await client.delete_pool(POOL, force=True)

    report = {
        "e2b_create_first_cmd_ms": _ms(creates, 50),
        "e2b_cmd_p50_ms": _ms(e2b_cmd, 50),
        "e2b_cmd_p99_ms": _ms(e2b_cmd, 99),
        "native_cmd_p50_ms": _ms(native, 50),
        "native_cmd_p99_ms": _ms(native, 99),
        "e2b_write_1mb_ms": _ms(writes, 50),
        "cmd_ratio": round(percentile(e2b_cmd, 50) / percentile(native, 50), 2),
        "errors": errors.count,
        "error_kinds": errors.kinds,
        "samples": {"creates": len(creates), "commands": len(e2b_cmd), "writes": len(writes)},
    }
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--commands", type=int, default=100, help="commands timed, each way")
    parser.add_argument("--creates", type=int, default=5, help="sandboxes created (create + first command)")
    parser.add_argument("--writes", type=int, default=5, help="1 MiB writes timed")
    args = parser.parse_args(argv)
    image = ensure_default_image()
    instance = "bench-e2b-" + secrets.token_hex(3)
    state = Path(tempfile.mkdtemp(prefix="e2b-bench-"))
    server = ServerProcess(instance, state)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cli = [sys.executable, "-m", "sandboxd.cli", "--log-level", "WARNING", "e2b-api"]
    front = subprocess.Popen(
        [
            *cli,
            "--target",
            server.address,
            "--port",
            str(port),
            "--template",
            f"base={POOL}",
            "--api-key",
            KEY,
        ],
        stdout=subprocess.DEVNULL,
        stderr=(state / "e2b.log").open("wb"),
        start_new_session=True,
    )
    dk = docker.from_env()
    try:

        async def run() -> dict[str, Any]:
            await server.wait_healthy(120)
            await _wait_e2b(url, front, 60)
            return await bench(args, server, url, image)

        report = asyncio.run(run())
    finally:
        front.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            front.wait(20)
        if front.poll() is None:
            front.kill()
        server.stop()
        left = sweep(dk, instance)
    report["leaked"] = len(left)
    report["load_1m"] = os.getloadavg()[0]
    report["goal_met"] = report["e2b_cmd_p50_ms"] <= 3 * report["native_cmd_p50_ms"] and report["errors"] == 0
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["bench", "main"]
