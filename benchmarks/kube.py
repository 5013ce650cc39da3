"""sandboxd on Kubernetes (kwok nodes): warm-up, acquire latency, adoption.

    export KUBECONFIG=$(deploy/testcluster/up.sh | tail -1)
    python -m benchmarks.kube                 # 1,000 Pods, 200 claims/s
    python -m benchmarks.kube --pods 100 --rate 50 --claims 100   # quick

Runs ``sandboxd serve`` (Kubernetes backend) as a separate process against
the test cluster, in a fresh namespace, and measures in one run:

- ``warm_1000_s``: from CreatePool(min_ready=N) until N Pods are READY
  (POST, schedule, kwok marks Running+Ready, the watch reports it);
- ``acquire_p50_ms`` / ``acquire_p99_ms``: Acquire(n=1) latency, open loop at
  ``--rate`` claims/s, every claim served from the warm pool (leases kept;
  the pool keeps ``--headroom`` Pods beyond N warm so it does not run dry
  while it refills behind the claims);
- ``adopt_1000_s``: after SIGKILL of the server holding N leased Pods (and
  the pool's warm ones), from the restart until it serves again with all N
  leases adopted (and the unleased Pods deleted);
- ``rss_mb``: the server's peak RSS while tracking ``tracked_pods`` Pods.

``--state sqlite`` keeps leases in SQLite instead of on the Pods (the
default, ``cluster``, records each lease with a merge patch per Pod, written
right after Acquire answers).

The last line of stdout is the JSON object also written to
benchmarks/results/kube.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from grpc_health.v1 import health_pb2, health_pb2_grpc

from sandboxd.backends.kubernetes.client import KubeClient, KubeError, load_configuration
from sandboxd.backends.kubernetes.podspec import selector
from sandboxd.client import AsyncClient

RESULTS_PATH = Path(__file__).resolve().parent / "results" / "kube.json"
IMAGE = "sandboxd/rollout:kube-bench"


def log(msg: str) -> None:
    print(f"[kube-bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, config: Path, instance: str, state: Path, port: int) -> None:
        self._log = (state / "server.log").open("ab")
        cmd = [
            sys.executable,
            "-m",
            "sandboxd.cli",
            "--log-level",
            "WARNING",
            "serve",
            "--config",
            str(config),
        ]
        cmd += ["--port", str(port), "--instance", instance, "--state-dir", str(state)]
        self.started = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        self.target = f"127.0.0.1:{port}"
        self.peak_rss = 0

    def rss_mb(self) -> float:
        with contextlib.suppress(OSError), open(f"/proc/{self.proc.pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    kb = int(line.split()[1])
                    self.peak_rss = max(self.peak_rss, kb)
                    return kb / 1024
        return 0.0

    async def serving(self, timeout: float = 600.0) -> None:
        deadline = time.monotonic() + timeout
        async with AsyncClient(self.target) as client:
            stub = health_pb2_grpc.HealthStub(client._channel)
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"server exited with {self.proc.returncode}; see its server.log")
                with contextlib.suppress(Exception):
                    reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                if time.monotonic() > deadline:
                    raise TimeoutError("server did not serve in time")
                await asyncio.sleep(0.05)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.kill()
        self._log.close()


async def wait_pool(
    client: AsyncClient, pool: str, *, ready: int = 0, leased: int = 0, timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        status = (await client.get_pool(pool)).status
        if status.ready >= ready and status.leased >= leased:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"pool {pool}: ready {status.ready}/{ready}, leased {status.leased}/{leased}")
        await asyncio.sleep(0.1)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def run(args: argparse.Namespace) -> dict[str, Any]:
    kubeconfig = args.kubeconfig or os.environ.get("KUBECONFIG", "")
    if not kubeconfig:
        raise SystemExit("set KUBECONFIG (deploy/testcluster/up.sh prints it) or pass --kubeconfig")
    kube = KubeClient(load_configuration(kubeconfig, None), threads=4)
    namespace = "sbx-bench-" + secrets.token_hex(3)
    instance = "bench-" + secrets.token_hex(3)
    await kube.request("POST", "/api/v1/namespaces", body={"metadata": {"name": namespace}})
    for _ in range(600):
        try:
            await kube.request("GET", f"/api/v1/namespaces/{namespace}/serviceaccounts/default")
            break
        except KubeError:
            await asyncio.sleep(0.1)
    state = Path(tempfile.mkdtemp(prefix="sandboxd-kube-bench-"))
    config = state / "sandboxd.toml"
    config.write_text(
        f"""
[pools]
max_starting = {args.starting}
max_pool_size = {args.pods + args.headroom + args.claims + 64}
create_timeout_seconds = 300

[limits]
cpu_millis = 10
memory_bytes = {32 << 20}
disk_bytes = {16 << 20}

[backend]
kind = "kubernetes"
namespace = "{namespace}"
kubeconfig = "{kubeconfig}"
threads = {args.threads}
state = "{args.state}"
"""
    )
    port = free_port()
    n = args.pods
    result: dict[str, Any] = {
        "pods": n,
        "headroom": args.headroom,
        "claims": args.claims,
        "rate_per_s": args.rate,
        "state": args.state,
        "namespace": namespace,
    }
    server = Server(config, instance, state, port)
    try:
        await server.serving()
        async with AsyncClient(server.target) as client:
            # -- warm-up ------------------------------------------------------
            # The pool keeps `headroom` Pods beyond N warm, so that every claim
            # of the rate phase finds a warm Pod while the pool refills
            # behind them (what is measured is a warm claim, not a cold start).
            target = n + args.headroom
            started = time.monotonic()
            await client.create_pool("bench", IMAGE, min_ready=target, max_size=target + args.claims + 64)
            await wait_pool(client, "bench", ready=n, timeout=args.timeout)
            result["warm_1000_s"] = round(time.monotonic() - started, 2)
            log(f"warmed {n} Pods in {result['warm_1000_s']} s (rss {server.rss_mb():.0f} MB)")
            await wait_pool(client, "bench", ready=target, timeout=args.timeout)

            # -- acquire at a fixed rate from the warm pool (open loop) ------------
            latencies: list[float] = []
            leases: list[str] = []

            async def claim() -> None:
                t0 = time.monotonic()
                lease = await client.lease("bench", n=1, lease_ttl=3600, timeout=60)
                latencies.append((time.monotonic() - t0) * 1000)
                leases.append(lease.id)

            tasks = []
            t0 = time.monotonic()
            for i in range(args.claims):
                delay = t0 + i / args.rate - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(claim()))
            await asyncio.gather(*tasks)
            result["acquire_p50_ms"] = round(statistics.median(latencies), 2)
            result["acquire_p99_ms"] = round(percentile(latencies, 0.99), 2)
            result["acquire_achieved_rate_per_s"] = round(args.claims / (time.monotonic() - t0), 1)
            slow = sorted(range(len(latencies)), key=lambda i: -latencies[i])[:10]
            log("slowest claims (index: ms): " + ", ".join(f"{i}: {latencies[i]:.0f}" for i in sorted(slow)))
            log(f"acquire p50 {result['acquire_p50_ms']} ms, p99 {result['acquire_p99_ms']} ms")
            # The pool refills behind the leases: let it, so the RSS and the
            # restart see leased + warm Pods.
            with contextlib.suppress(TimeoutError):
                await wait_pool(client, "bench", ready=target, leased=args.claims, timeout=args.timeout)
            tracked = len(await kube_pods(kube, namespace, instance))
            result["tracked_pods"] = tracked
            result["rss_mb"] = round(max(server.rss_mb(), server.peak_rss / 1024), 1)
            log(f"tracking {tracked} Pods, rss {result['rss_mb']} MB")

        # -- crash and adopt ----------------------------------------------------
        server.kill()
        server = Server(config, instance, state, port)
        await server.serving(timeout=args.timeout)
        async with AsyncClient(server.target) as client:
            await wait_pool(client, "bench", leased=args.claims, timeout=args.timeout)
            result["adopt_1000_s"] = round(time.monotonic() - server.started, 2)
            log(f"adopted {args.claims} leased Pods in {result['adopt_1000_s']} s")
            result["adopt_rss_mb"] = round(server.rss_mb(), 1)
            for lease_id in leases:
                with contextlib.suppress(Exception):
                    await client.release(lease_id)
            await client.delete_pool("bench")
    finally:
        server.stop()
        with contextlib.suppress(KubeError):
            await kube.request("DELETE", f"/api/v1/namespaces/{namespace}", body={"gracePeriodSeconds": 0})
        await kube.close()
    return result


async def kube_pods(kube: KubeClient, namespace: str, instance: str) -> list[Any]:
    body = await kube.request(
        "GET",
        f"/api/v1/namespaces/{namespace}/pods",
        query={"labelSelector": selector(instance)},
        timeout=120,
    )
    return list(body.get("items") or [])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kubeconfig")
    parser.add_argument("--pods", type=int, default=1000, help="warm pool size (and leased Pods to adopt)")
    parser.add_argument("--claims", type=int, default=1000, help="acquires in the rate phase")
    parser.add_argument("--rate", type=float, default=200.0, help="claims per second")
    parser.add_argument("--headroom", type=int, default=500, help="warm Pods kept beyond --pods")
    parser.add_argument("--starting", type=int, default=200, help="pools.max_starting")
    parser.add_argument("--threads", type=int, default=16, help="backend API threads")
    parser.add_argument(
        "--state", choices=["cluster", "sqlite"], default="cluster", help="where pools and leases persist"
    )
    parser.add_argument("--timeout", type=float, default=900.0)
    args = parser.parse_args()
    result = asyncio.run(run(args))
    RESULTS_PATH.parent.mkdir(parents=True, exist_ok=True)
    RESULTS_PATH.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
