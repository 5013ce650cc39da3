"""Warm-acquire latency and exec round trip/throughput of sandboxd on Docker.

    python -m benchmarks.acquire_exec           # full run (2-3 minutes on 2 cores)
    python -m benchmarks.acquire_exec --quick   # small run for CI smoke tests
    python -m benchmarks.acquire_exec --profile --rounds 20  # py-spy table of the timed bursts

Runs ``sandboxd serve`` as a separate process (so server and clients use
different cores), then measures, side by side with plain Docker baselines:

(a) warm Acquire latency as the client sees it (the Acquire RPC only):
    - 1 client: sequential acquires, each lease held until the series ends
      (pool max_size == min_ready, so nothing is re-created under the timer);
    - N concurrent clients (default 64): in rounds, wait until the pool has N
      READY and nothing in flight, release N tasks at once, record, release
      all leases (untimed), repeat; p50/p99 over all samples;
    - extras for context: the same N sandboxes in ONE Acquire(n=N) call, and
      the gRPC floor (grpc.health.v1 Check, same channel, same burst shape,
      one burst just before each acquire round on the same quiet pool, so
      the two see the same host; 1 client: sequential checks);
(b) ``docker run --rm <image> true`` through the docker SDK: the cold baseline;
(c) Exec ``true`` round trips on one leased sandbox, in a session and without,
    next to ``docker exec true`` (SDK ``exec_run``) on a plain ``sleep
    infinity`` container of the same image; the server-reported duration is
    kept too, which splits the round trip into backend and gRPC/API parts;
(d) Exec throughput: N concurrent clients, each running ``true`` in its own
    session back to back for a fixed time. Two layouts are run, 16 sandboxes x
    4 sessions and 64 sandboxes x 1 session (scaled down with --quick); the
    faster is reported as ``exec_per_s`` and named in ``exec_layout``. They
    come out within noise of each other: the limit is CPU per exec (server,
    client, dockerd, containerd-shim, bash), not per-sandbox serialisation.
    Beside them, the same N clients call health.Check back to back for the
    same time (``details.grpc_floor_throughput``): the most calls per second
    this host's gRPC stack serves at that concurrency, server and client
    sharing its cores as they do for the execs. Each of these runs also
    splits the CPU it used per call (``cpu_ms_per_call``) between the server
    process, the client (this process) and the rest of the host (the
    sandboxes' shells, the kernel, the engine).

Between phases the benchmark waits until the pool is quiet (READY back at its
floor, nothing creating or releasing), so container churn does not pollute
the numbers. The host's CPU use by other processes is recorded per phase
(``details.host_load``): on a shared machine it explains outliers.

With ``--profile`` (needs py-spy) the server and the client are sampled
inside the timed windows only (the gRPC floor and acquire bursts, the exec
throughput runs): a table per phase and process goes to
benchmarks/results/acquire_exec.profile.txt and the collapsed stacks beside
it (.profile.folded, for any flame graph tool). The JSON keeps its keys; a
profiled run's numbers are a little slower, so commit an unprofiled one's.

On exit (error and Ctrl-C included) the pool is deleted with force, the server
gets SIGTERM, and containers labelled with the benchmark's instance id are
removed; how many were still there is reported as ``leaked``. The last line of
stdout is the JSON object also written to benchmarks/results/acquire_exec.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import secrets
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

import docker
import docker.errors
import grpc
import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sandboxd.backends.base import LABEL_INSTANCE
from sandboxd.client import AsyncClient, Lease
from sandboxd.images.build import ensure_default_image

T = TypeVar("T")

RESULTS_PATH = Path(__file__).resolve().parent / "results" / "acquire_exec.json"
PROFILE_PATH = RESULTS_PATH.with_name("acquire_exec.profile.txt")
POOL = "bench"
SESSION = "bench"
TRUE_ARGV = ["true"]

# key: (op, target, the same run's baseline the target multiplies or None, what).
# Latency goals are ratios to the gRPC floor measured in the same run: what
# sandboxd adds on top of its own gRPC stack, whatever the machine's speed.
GOALS: dict[str, tuple[str, float, str | None, str]] = {
    "acquire_p50_ms": ("<=", 1.2, "grpc_floor_p50_ms", "warm acquire p50 (concurrent clients)"),
    "acquire_p99_ms": ("<=", 1.2, "grpc_floor_p99_ms", "warm acquire p99 (concurrent clients)"),
    "exec_p50_ms": ("<=", 2.0, "grpc_floor_1_p50_ms", "session exec p50"),
    "exec_per_s": (">=", 2500.0, None, "exec throughput (concurrent clients)"),
}


@dataclass(frozen=True)
class Config:
    clients: int
    """Concurrent clients for (a) and (d); also the pool's min_ready and max_size."""
    acquire_rounds: int
    group_rounds: int
    """Rounds of one Acquire(n=clients) call: the batched alternative to N concurrent acquires."""
    sequential_acquires: int
    docker_run_samples: int
    exec_samples: int
    docker_exec_samples: int
    throughput_seconds: float
    layouts: tuple[tuple[int, int], ...]
    """(sandboxes, sessions per sandbox) tried for (d); sandboxes * sessions == clients."""
    ready_timeout: float
    channels: int
    """gRPC channels the concurrent clients share (1 = one channel for all)."""

    @classmethod
    def full(cls) -> Config:
        return cls(
            clients=64,
            acquire_rounds=5,
            group_rounds=3,
            sequential_acquires=50,
            docker_run_samples=10,
            exec_samples=200,
            docker_exec_samples=50,
            throughput_seconds=5.0,
            layouts=((16, 4), (64, 1)),
            ready_timeout=300.0,
            channels=1,
        )

    @classmethod
    def quick(cls) -> Config:
        return cls(
            clients=8,
            acquire_rounds=2,
            group_rounds=1,
            sequential_acquires=8,
            docker_run_samples=3,
            exec_samples=30,
            docker_exec_samples=10,
            throughput_seconds=1.0,
            layouts=((2, 4), (8, 1)),
            ready_timeout=180.0,
            channels=1,
        )


# -- small helpers -------------------------------------------------------------


def percentile(samples: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100]."""
    if not samples:
        return math.nan
    xs = sorted(samples)
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summary_ms(samples_s: Sequence[float]) -> dict[str, float]:
    ms = [s * 1000.0 for s in samples_s]
    return {
        "n": len(ms),
        "p50": round(percentile(ms, 50), 3),
        "p90": round(percentile(ms, 90), 3),
        "p99": round(percentile(ms, 99), 3),
        "max": round(max(ms), 3) if ms else math.nan,
    }


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cpu_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs from /proc/stat."""
    values = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    total = sum(values[:8])
    return total - idle, total


class CpuMeter:
    """Host-wide CPU busy share between start and read (all processes, ours included)."""

    def __init__(self) -> None:
        self._start = _cpu_jiffies()

    def busy_pct(self) -> float:
        busy, total = _cpu_jiffies()
        dt = total - self._start[1]
        return round(100.0 * (busy - self._start[0]) / dt, 1) if dt > 0 else math.nan


_ENGINE_COMMS = ("dockerd", "containerd", "runc", "docker-init", "docker-proxy")
_CLK_TCK = os.sysconf("SC_CLK_TCK")


def _stat_cpu(stat: str) -> float:
    """User + system CPU seconds from a /proc/<pid>/stat line."""
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def _foreign_cpu(ours: set[int]) -> dict[int, float]:
    """CPU seconds so far of every host process that is not ours, not the
    container engine and not inside a container: other people's workloads."""
    out: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in ours:
            continue
        try:
            stat = (entry / "stat").read_text()
            comm = stat[stat.index("(") + 1 : stat.rindex(")")]
            if comm.startswith(_ENGINE_COMMS) or "/docker" in (entry / "cgroup").read_text():
                continue
            out[int(entry.name)] = _stat_cpu(stat)
        except (OSError, ValueError, IndexError):
            continue
    return out


class HostMeter:
    """How busy the host was during a phase: in all (``busy_pct``, ours
    included) and by other people's host processes (``other_pct``, a lower
    bound: processes that start and end inside the phase are missed)."""

    def __init__(self, ours: set[int]) -> None:
        self._ours = ours
        self._jiffies = _cpu_jiffies()
        self._foreign = _foreign_cpu(ours)

    def read(self) -> dict[str, float]:
        busy, total = _cpu_jiffies()
        dt = total - self._jiffies[1]
        foreign = _foreign_cpu(self._ours)
        other = sum(max(0.0, cpu - self._foreign.get(pid, 0.0)) for pid, cpu in foreign.items())
        if dt <= 0:
            return {"busy_pct": math.nan, "other_pct": math.nan}
        return {
            "busy_pct": round(100.0 * (busy - self._jiffies[0]) / dt, 1),
            "other_pct": round(100.0 * other * _CLK_TCK / dt, 1),
        }


def _process_cpu(pid: int) -> float:
    """CPU seconds so far of one process (all its threads); 0 once it is gone."""
    try:
        return _stat_cpu(Path(f"/proc/{pid}/stat").read_text())
    except (OSError, ValueError, IndexError):
        return 0.0


class CallCpu:
    """CPU per call over a window, split between the server process, this
    (client) process and the rest of the host (the sandboxes' shells, the
    kernel, the engine): where the cores went, in ms per call."""

    def __init__(self, server: int) -> None:
        self._server = server
        self._start = (_process_cpu(server), _process_cpu(os.getpid()), _cpu_jiffies()[0] / _CLK_TCK)

    def per_call(self, calls: int) -> dict[str, float]:
        server, client, host = (
            _process_cpu(self._server),
            _process_cpu(os.getpid()),
            _cpu_jiffies()[0] / _CLK_TCK,
        )
        used = [server - self._start[0], client - self._start[1], host - self._start[2]]
        if calls <= 0:
            return {}
        ms = [round(1000.0 * u / calls, 3) for u in used]
        return {"server": ms[0], "client": ms[1], "rest": round(ms[2] - ms[0] - ms[1], 3), "total": ms[2]}


def background_load(seconds: float = 1.0) -> float:
    """Host CPU busy share while we do nothing: other workloads on the machine."""
    meter = CpuMeter()
    time.sleep(seconds)
    return meter.busy_pct()


class Interrupted(KeyboardInterrupt):
    """SIGTERM, handled like Ctrl-C so cleanup runs."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise Interrupted(f"signal {signum}")


# -- the server process --------------------------------------------------------


class ServerProcess:
    def __init__(self, instance: str, state_dir: Path, wrapper: Sequence[str] = ()) -> None:
        self.instance = instance
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.log_path = state_dir / "server.log"
        cmd = [
            *wrapper,
            sys.executable,
            "-m",
            "sandboxd.cli",
            "--log-level",
            "WARNING",
            "serve",
            "--port",
            str(self.port),
            "--instance",
            instance,
            "--state-dir",
            str(state_dir),
        ]
        self.wrapped = bool(wrapper)
        self._log = self.log_path.open("wb")
        # Own session: a Ctrl-C in the terminal reaches only us, and we stop
        # the server in order (pool deleted first, then SIGTERM).
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)

    def log_tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    async def wait_healthy(self, within: float) -> float:
        """Polls grpc.health.v1 until SERVING; returns seconds waited."""
        t0 = time.perf_counter()
        deadline = t0 + within
        async with grpc.aio.insecure_channel(self.address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log_tail()}")
                left = deadline - time.perf_counter()
                if left <= 0:
                    raise TimeoutError(f"server not healthy within {within:g}s:\n{self.log_tail()}")
                try:
                    request = health_pb2.HealthCheckRequest(service="")
                    reply = await stub.Check(request, timeout=min(1.0, left))
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return time.perf_counter() - t0
                except grpc.aio.AioRpcError:
                    pass
                await asyncio.sleep(0.05)

    def _server_pids(self) -> list[int]:
        """The server itself: our child, or (under a wrapper such as py-spy)
        the other members of the process group we started."""
        if not self.wrapped:
            return [self.proc.pid]
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == self.proc.pid:
                continue
            with contextlib.suppress(OSError, IndexError, ValueError):
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[2]) == self.proc.pid:  # pgrp == the group we started
                    pids.append(int(entry.name))
        return pids or [self.proc.pid]  # a wrapper that exec'd the server

    def stop(self, timeout: float = 40.0) -> int | None:
        """SIGTERM to the server (not to a wrapper, which should see its child
        exit and finish, e.g. py-spy writing its profile); SIGKILL to the
        whole group we started if that does not end it in time."""
        if self.proc.poll() is None:
            for pid in self._server_pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log(f"server did not stop within {timeout:g}s of SIGTERM; killing it")
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._log.close()
        return self.proc.returncode


# -- docker baselines (b) and the raw-exec half of (c) ---------------------------


def docker_baselines(dk: docker.DockerClient, image: str, cfg: Config, instance: str) -> dict[str, Any]:
    labels = {LABEL_INSTANCE: instance, "sandboxd.bench": "baseline"}
    # One unmeasured run first: page cache and the engine's image metadata are warm afterwards.
    dk.containers.run(image, TRUE_ARGV, remove=True, network_mode="none", labels=labels)
    run_s = []
    for _ in range(cfg.docker_run_samples):
        t0 = time.perf_counter()
        dk.containers.run(image, TRUE_ARGV, remove=True, network_mode="none", labels=labels)
        run_s.append(time.perf_counter() - t0)
    log(f"docker run --rm true: p50 {percentile(run_s, 50) * 1000:.0f} ms")

    container = dk.containers.run(
        image, ["sleep", "infinity"], detach=True, network_mode="none", labels=labels, init=True
    )
    try:
        for _ in range(3):
            container.exec_run(TRUE_ARGV)
        exec_s = []
        for _ in range(cfg.docker_exec_samples):
            t0 = time.perf_counter()
            result = container.exec_run(TRUE_ARGV)
            exec_s.append(time.perf_counter() - t0)
            if result.exit_code != 0:
                raise RuntimeError(f"docker exec true exited {result.exit_code}")
    finally:
        container.remove(force=True)
    log(f"docker exec true: p50 {percentile(exec_s, 50) * 1000:.1f} ms")
    return {"docker_run": summary_ms(run_s), "docker_exec": summary_ms(exec_s)}


# -- profiling (--profile) -----------------------------------------------------


def _frame_area(frame: str) -> str:
    """The part of the stack a frame belongs to: a sandboxd module, or the library it is in."""
    inner = frame[frame.rfind("(") + 1 : frame.rfind(")")] if "(" in frame else frame
    path = inner.rsplit(":", 1)[0]
    if "sandboxd/" in path:
        part = path[path.index("sandboxd/") :].removesuffix(".py").split("/")
        return "/".join(part[:3]) if part[1] in ("core", "backends") else "/".join(part[:2])
    if path.endswith("asyncio/events.py"):
        return "event loop callbacks (gRPC's Cython and C core, unseen)"
    if path.endswith("selectors.py"):
        return "epoll"
    if path.endswith("threading.py"):
        return "threads in C code (gRPC's poller, SQLite)"
    for lib in ("grpc", "asyncio", "google/protobuf", "opentelemetry", "sqlite3", "concurrent", "docker"):
        if f"{lib}/" in path or path.startswith(lib):
            return lib
    return "other"


class Profiler:
    """Samples the server and this process (the client side) with py-spy
    inside the timed windows only (the acquire bursts, the exec throughput
    runs), and merges the samples of each phase. Python frames only, without
    pausing the processes (native frames need a pause per sample, which cut
    exec throughput by an order of magnitude here): time in gRPC's Cython and
    C core shows under the Python frame that called into it, and threads
    waiting (the event loop in epoll) are not sampled. py-spy itself takes
    CPU on a 2-core machine, so a profiled run's numbers are a little slower
    than an unprofiled one's."""

    def __init__(self, rate: int, workdir: Path) -> None:
        exe = shutil.which("py-spy")
        if exe is None:
            raise RuntimeError("--profile needs py-spy (pip install py-spy)")
        self._exe = exe
        self.rate = rate
        self._workdir = workdir
        self.targets: dict[str, int] = {}
        self.stacks: dict[tuple[str, str], dict[str, int]] = {}
        self.seconds: dict[str, float] = {}
        self._running: list[tuple[str, str, subprocess.Popen[bytes], Path]] = []
        self._phase = ""
        self._t0 = 0.0
        self._n = 0

    def start(self, phase: str) -> None:
        """Attaches to every target and returns once each is being sampled
        (blocking: the benchmark's tasks are parked meanwhile)."""
        self._phase = phase
        self._t0 = time.perf_counter()
        for name, pid in self.targets.items():
            self._n += 1
            out = self._workdir / f"profile-{self._n}.txt"
            cmd = [self._exe, "record", "--pid", str(pid), "--rate", str(self.rate), "--format", "raw"]
            cmd += ["--threads", "--function", "--nonblocking", "--output", str(out)]
            # py-spy says nothing when its stdout is not a terminal or a file.
            # Popen, not an asyncio subprocess: its child watcher's threads
            # would show in the client's profile.
            with (self._workdir / f"profile-{self._n}.log").open("w+b") as log_file:
                proc = subprocess.Popen(
                    cmd, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
                )
                self._running.append((phase, name, proc, out))
                deadline = time.perf_counter() + 30.0
                while b"Sampling process" not in log_file.read():
                    log_file.seek(0)
                    if proc.poll() is not None or time.perf_counter() > deadline:
                        self.stop()
                        raise RuntimeError(f"py-spy could not sample {name} (pid {pid})")
                    time.sleep(0.02)
        self._t0 = time.perf_counter()

    def stop(self) -> None:
        """Stops the samplers and merges what they wrote."""
        self.seconds[self._phase] = self.seconds.get(self._phase, 0.0) + time.perf_counter() - self._t0
        running, self._running = self._running, []
        for _, _, proc, _ in running:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGINT)
        for phase, name, proc, out in running:
            try:
                proc.wait(60.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            counts = self.stacks.setdefault((phase, name), {})
            with contextlib.suppress(OSError):
                for line in out.read_text(errors="replace").splitlines():
                    stack, _, n = line.rpartition(" ")
                    # A thread frame alone is a thread between two frames;
                    # the profiler's own start and stop are not the benchmark.
                    if ";" in stack and "Profiler." not in stack and n.isdigit():
                        counts[stack] = counts.get(stack, 0) + int(n)

    def folded(self) -> str:
        """Every sample as collapsed stacks (phase;process;thread;frames count), for flame graph tools."""
        lines = []
        for (phase, name), counts in self.stacks.items():
            for stack, n in sorted(counts.items(), key=lambda kv: -kv[1]):
                lines.append(f"{phase};{name};{stack} {n}")
        return "\n".join(lines) + "\n"

    def table(self, top: int = 25) -> str:
        """Per phase and process: busy share by thread, samples by area, and
        the functions with the most samples, on their own (self) and with
        what they call (total)."""
        out = [
            "Profile of benchmarks.acquire_exec: py-spy samples of the server and of the client process,",
            f"taken only inside the timed windows, {self.rate} samples/s, Python frames only (time in",
            "gRPC's Cython and C core counts under the Python frame that called it; waiting threads",
            "are not sampled).",
            "busy = samples / (window seconds x rate): 100% is one core busy the whole window; a lower",
            "bound, as py-spy falls behind its rate on a loaded machine.",
            "self = samples whose innermost frame is the function; total = samples with it anywhere.",
            "",
        ]
        for (phase, name), counts in self.stacks.items():
            total = sum(counts.values())
            window = self.seconds.get(phase, 0.0)
            out.append(f"== {phase} / {name}: {total} samples in {window:.2f} s of windows")
            if not total:
                continue
            threads: dict[str, int] = {}
            areas: dict[str, int] = {}
            own: dict[str, int] = {}
            incl: dict[str, int] = {}
            for stack, n in counts.items():
                frames = stack.split(";")
                thread = frames[0].split(": ", 1)[-1]
                threads[thread] = threads.get(thread, 0) + n
                body = frames[1:] or frames
                leaf = body[-1]
                own[leaf] = own.get(leaf, 0) + n
                # sandboxd/cli is only the entry point: below it, the event loop and gRPC.
                area = next(
                    (
                        a
                        for a in map(_frame_area, reversed(body))
                        if a.startswith("sandboxd/") and a != "sandboxd/cli"
                    ),
                    _frame_area(leaf),
                )
                areas[area] = areas.get(area, 0) + n
                for f in set(body):
                    incl[f] = incl.get(f, 0) + n
            per_core = window * self.rate
            out.append(
                "  threads (busy): "
                + ", ".join(
                    f"{t} {100.0 * n / per_core:.0f}%" if per_core else t
                    for t, n in sorted(threads.items(), key=lambda kv: -kv[1])[:8]
                )
            )
            out.append("  samples by innermost sandboxd module (else the library of the innermost frame):")
            for area, n in sorted(areas.items(), key=lambda kv: -kv[1])[:20]:
                out.append(f"    {100.0 * n / total:5.1f}%  {area}")
            for label, table in (("self", own), ("total", incl)):
                out.append(f"  top {top} by {label}:")
                for f, n in sorted(table.items(), key=lambda kv: -kv[1])[:top]:
                    out.append(f"    {100.0 * n / total:5.1f}%  {f[:150]}")
            out.append("")
        return "\n".join(out)


# -- sandboxd phases -----------------------------------------------------------


class Bench:
    def __init__(
        self, clients: list[AsyncClient], image: str, cfg: Config, profiler: Profiler | None = None
    ) -> None:
        self.clients = clients
        self.client = clients[0]
        self.image = image
        self.cfg = cfg
        self.profiler = profiler
        self.server_pid = 0
        """The server process, for CallCpu (0: not measured)."""

    @contextlib.contextmanager
    def profiled(self, phase: str) -> Iterator[None]:
        """Samples the block under ``phase`` when profiling; nothing otherwise."""
        if self.profiler is None:
            yield
            return
        self.profiler.start(phase)
        try:
            yield
        finally:
            self.profiler.stop()

    def client_for(self, i: int) -> AsyncClient:
        return self.clients[i % len(self.clients)]

    async def wait_quiet(self, ready: int) -> float:
        """Waits until the pool has >= ready READY sandboxes and nothing in
        flight (creating/releasing); returns seconds waited."""
        t0 = time.perf_counter()
        deadline = t0 + self.cfg.ready_timeout
        last = None
        while True:
            status = (await self.client.get_pool(POOL)).status
            last = status
            if status.ready >= ready and status.creating == 0 and status.releasing == 0:
                return time.perf_counter() - t0
            if time.perf_counter() > deadline:
                raise TimeoutError(
                    f"pool not quiet with {ready} READY within {self.cfg.ready_timeout:g}s "
                    f"(ready {last.ready}, creating {last.creating}, releasing {last.releasing}, "
                    f"failed {last.failed_total}, last error {last.last_error!r})"
                )
            await asyncio.sleep(0.1)

    async def release_all(self, leases: Sequence[Lease]) -> None:
        await asyncio.gather(*(lease.release() for lease in leases))

    async def lease_n(self, n: int) -> list[Lease]:
        leases = await asyncio.gather(
            *(self.client_for(i).lease(POOL, lease_ttl=900.0, timeout=60.0) for i in range(n))
        )
        return list(leases)

    # gRPC floor: the cheapest RPC the server has, same channel(s), same shape
    async def _check(self, i: int) -> float:
        stub = health_pb2_grpc.HealthStub(self.client_for(i)._channel)
        t0 = time.perf_counter()
        await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=10.0)
        return time.perf_counter() - t0

    async def grpc_floor(self) -> list[float]:
        """One client's health checks in sequence: the 1-client floor."""
        seq = [await self._check(0) for _ in range(self.cfg.sequential_acquires)]
        log(f"gRPC floor (health.Check): 1 client p50 {percentile(seq, 50) * 1000:.2f} ms")
        return seq

    async def floor_burst(self) -> list[float]:
        """N health checks at once: the floor for an acquire round, measured
        just before it on the same quiet pool, so both see the same host."""
        go = asyncio.Event()

        async def one(i: int) -> float:
            await go.wait()
            return await self._check(i)

        tasks = [asyncio.create_task(one(i)) for i in range(self.cfg.clients)]
        await asyncio.sleep(0.05)
        with self.profiled("grpc_floor_burst"):
            go.set()
            return list(await asyncio.gather(*tasks))

    async def _back_to_back(
        self, calls: Sequence[Callable[[], Awaitable[bool]]], phase: str = ""
    ) -> tuple[int, int, float, dict[str, float]]:
        """Each of ``calls`` repeated by a client of its own, all started
        at once, for the throughput run's time (sampled under ``phase`` when
        profiling): (calls that succeeded, calls that failed, seconds, CPU
        per call split by CallCpu)."""
        go = asyncio.Event()
        stop_at = 0.0
        failed = 0

        async def worker(call: Callable[[], Awaitable[bool]]) -> int:
            nonlocal failed
            done = 0
            await go.wait()
            while time.perf_counter() < stop_at:
                if await call():
                    done += 1
                else:
                    failed += 1
            return done

        tasks = [asyncio.create_task(worker(call)) for call in calls]
        await asyncio.sleep(0.05)
        with self.profiled(phase) if phase else contextlib.nullcontext():
            cpu = CallCpu(self.server_pid)
            t0 = time.perf_counter()
            stop_at = t0 + self.cfg.throughput_seconds
            go.set()
            done = sum(await asyncio.gather(*tasks))
            elapsed = time.perf_counter() - t0
            split = cpu.per_call(done + failed)
        return done, failed, elapsed, split

    async def floor_throughput(self) -> dict[str, Any]:
        """N clients' health checks back to back for the throughput run's
        time: the ceiling of calls per second an exec run could reach."""
        # After the exec runs the pool refills what they released: measured
        # alongside, the floor would be that churn's.
        await self.wait_quiet(self.cfg.clients)

        def check(i: int) -> Callable[[], Awaitable[bool]]:
            stub = health_pb2_grpc.HealthStub(self.client_for(i)._channel)
            request = health_pb2.HealthCheckRequest(service="")

            async def call() -> bool:
                await stub.Check(request, timeout=10.0)
                return True

            return call

        total, _, elapsed, split = await self._back_to_back([check(i) for i in range(self.cfg.clients)])
        per_s = total / elapsed
        log(
            f"gRPC floor throughput (health.Check), {self.cfg.clients} clients: {per_s:.0f} calls/s, "
            f"CPU ms/call {split}"
        )
        return {
            "clients": self.cfg.clients,
            "calls": total,
            "seconds": round(elapsed, 3),
            "per_s": round(per_s, 1),
            "cpu_ms_per_call": split,
        }

    # (a) 1 client
    async def acquire_sequential(self) -> list[float]:
        await self.wait_quiet(self.cfg.clients)
        samples: list[float] = []
        held: list[Lease] = []
        try:
            for _ in range(self.cfg.sequential_acquires):
                t0 = time.perf_counter()
                lease = await self.client.lease(POOL, lease_ttl=900.0, timeout=60.0)
                samples.append(time.perf_counter() - t0)
                held.append(lease)
        finally:
            # Held until the end so no release/re-create churn runs under the
            # measurement (max_size == min_ready, so the pool cannot refill yet).
            await self.release_all(held)
        return samples

    # (a) N clients, in rounds
    async def acquire_concurrent(self) -> tuple[list[float], list[float]]:
        """(acquire latencies, health-check latencies of the floor bursts paired with the rounds)."""
        samples: list[float] = []
        floor: list[float] = []
        n = self.cfg.clients
        for r in range(self.cfg.acquire_rounds):
            waited = await self.wait_quiet(n)
            floor += await self.floor_burst()
            await asyncio.sleep(0.05)
            go = asyncio.Event()
            held: list[Lease] = []
            tasks = [asyncio.create_task(self._timed_acquire(i, go, held)) for i in range(n)]
            await asyncio.sleep(0.05)  # every task parked on the event
            try:
                with self.profiled("acquire_burst"):
                    go.set()
                    got = await asyncio.gather(*tasks)
            finally:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                await self.release_all(held)
            samples += got
            log(
                f"acquire round {r + 1}/{self.cfg.acquire_rounds}: {n} clients, "
                f"p50 {percentile(got, 50) * 1000:.2f} ms, max {max(got) * 1000:.2f} ms "
                f"(waited {waited:.1f}s for the pool)"
            )
        log(
            f"gRPC floor (health.Check), {n} at once before each round: p50 "
            f"{percentile(floor, 50) * 1000:.2f} ms, p99 {percentile(floor, 99) * 1000:.2f} ms"
        )
        return samples, floor

    # (a, extra) the same N sandboxes in one RPC
    async def acquire_group(self) -> list[float]:
        samples = []
        for _ in range(self.cfg.group_rounds):
            await self.wait_quiet(self.cfg.clients)
            t0 = time.perf_counter()
            lease = await self.client.lease(POOL, self.cfg.clients, lease_ttl=900.0, timeout=60.0)
            samples.append(time.perf_counter() - t0)
            await lease.release()
        log(f"acquire group of {self.cfg.clients} in one RPC: p50 {percentile(samples, 50) * 1000:.2f} ms")
        return samples

    async def _timed_acquire(self, i: int, go: asyncio.Event, held: list[Lease]) -> float:
        await go.wait()
        t0 = time.perf_counter()
        lease = await self.client_for(i).lease(POOL, lease_ttl=900.0, timeout=60.0)
        dt = time.perf_counter() - t0
        held.append(lease)
        return dt

    # (c)
    async def exec_roundtrips(self) -> dict[str, Any]:
        await self.wait_quiet(1)
        lease = await self.client.lease(POOL, lease_ttl=900.0, timeout=60.0)
        sid = lease.sandboxes[0].id
        out: dict[str, Any] = {}
        try:
            for label, session in (("session", SESSION), ("nosession", "")):
                for _ in range(5):  # warm-up (first session exec opens the shell)
                    await self.client.exec(sid, TRUE_ARGV, session=session)
                rtt, server = [], []
                for _ in range(self.cfg.exec_samples):
                    t0 = time.perf_counter()
                    result = await self.client.exec(sid, TRUE_ARGV, session=session)
                    rtt.append(time.perf_counter() - t0)
                    server.append(result.duration)
                    if not result.ok:
                        raise RuntimeError(f"exec true ({label}): {result}")
                out[label] = summary_ms(rtt)
                out[label + "_backend"] = summary_ms(server)
                log(
                    f"exec true ({label}): p50 {percentile(rtt, 50) * 1000:.2f} ms "
                    f"(backend-reported {percentile(server, 50) * 1000:.2f} ms)"
                )
        finally:
            await lease.release()
        return out

    # (d)
    async def exec_throughput(self, sandboxes: int, sessions: int) -> dict[str, Any]:
        await self.wait_quiet(sandboxes)
        leases = await self.lease_n(sandboxes)
        try:
            slots = [
                (self.client_for(i * sessions + k), lease.sandboxes[0].id, f"{SESSION}-{k}")
                for i, lease in enumerate(leases)
                for k in range(sessions)
            ]
            # Warm-up: opens every session shell.
            await asyncio.gather(*(c.exec(sid, TRUE_ARGV, session=s) for c, sid, s in slots))

            def exec_true(client: AsyncClient, sid: str, session: str) -> Callable[[], Awaitable[bool]]:
                async def call() -> bool:
                    return (await client.exec(sid, TRUE_ARGV, session=session)).ok

                return call

            total, failures, elapsed, split = await self._back_to_back(
                [exec_true(*slot) for slot in slots], f"exec_throughput_{sandboxes}x{sessions}"
            )
        finally:
            await self.release_all(leases)
        per_s = total / elapsed
        log(
            f"exec throughput {sandboxes} sandboxes x {sessions} sessions: {per_s:.0f} exec/s "
            f"({total} in {elapsed:.2f}s, {failures} failed), CPU ms/exec {split}"
        )
        return {
            "sandboxes": sandboxes,
            "sessions_per_sandbox": sessions,
            "clients": len(slots),
            "execs": total,
            "seconds": round(elapsed, 3),
            "exec_per_s": round(per_s, 1),
            "failures": failures,
            "cpu_ms_per_call": split,
        }


async def run_sandboxd(
    server: ServerProcess, image: str, cfg: Config, profiler: Profiler | None = None
) -> dict[str, Any]:
    waited = await server.wait_healthy(60.0)
    log(f"server {server.address} (pid {server.proc.pid}) healthy after {waited:.2f}s")
    clients = [AsyncClient(server.address) for _ in range(max(1, cfg.channels))]
    try:
        for c in clients:
            await c.wait_ready(10.0)
        bench = Bench(clients, image, cfg, profiler)
        bench.server_pid = server._server_pids()[0]
        if profiler is not None:
            profiler.targets = {"server": server._server_pids()[0], "client": os.getpid()}
        await bench.client.create_pool(POOL, image, min_ready=cfg.clients, max_size=cfg.clients)
        fill = await bench.wait_quiet(cfg.clients)
        log(f"pool warm: {cfg.clients} READY after {fill:.1f}s")
        out: dict[str, Any] = {"pool_fill_seconds": round(fill, 2)}
        ours = {os.getpid(), server.proc.pid, *server._server_pids()}
        load: dict[str, dict[str, float]] = {}
        out["host_load"] = load

        async def phase(name: str, work: Awaitable[T]) -> T:
            meter = HostMeter(ours)
            try:
                return await work
            finally:
                load[name] = meter.read()

        out["grpc_floor_1"] = summary_ms(await phase("grpc_floor", bench.grpc_floor()))
        seq = await phase("acquire_1", bench.acquire_sequential())
        out["acquire_1"] = summary_ms(seq)
        log(
            f"acquire, 1 client: p50 {percentile(seq, 50) * 1000:.2f} ms, "
            f"p99 {percentile(seq, 99) * 1000:.2f} ms"
        )
        acquired, floor = await phase("acquire_n", bench.acquire_concurrent())
        out["grpc_floor_n"] = summary_ms(floor)
        out["acquire_n"] = summary_ms(acquired)
        out["acquire_group"] = summary_ms(await phase("acquire_group", bench.acquire_group()))
        out["exec"] = await phase("exec", bench.exec_roundtrips())
        layouts = []
        for sandboxes, sessions in cfg.layouts:
            layouts.append(
                await phase(f"throughput_{sandboxes}x{sessions}", bench.exec_throughput(sandboxes, sessions))
            )
        out["throughput_layouts"] = layouts
        out["grpc_floor_throughput"] = await phase("floor_throughput", bench.floor_throughput())
        return out
    finally:
        for c in clients:
            await c.close()


async def delete_pool(address: str) -> str:
    async with AsyncClient(address) as client:
        try:
            await asyncio.wait_for(client.delete_pool(POOL, force=True), 120.0)
            return "deleted"
        except Exception as e:  # NotFound when the run failed before creating it
            return f"{type(e).__name__}: {e}"


def sweep(dk: docker.DockerClient, instance: str) -> list[dict[str, str]]:
    """Removes containers left with the instance's label; returns what was there."""
    leftovers = dk.containers.list(all=True, filters={"label": f"{LABEL_INSTANCE}={instance}"})
    found = []
    for c in leftovers:
        found.append(
            {
                "name": c.name,
                "status": c.status,
                "created": c.attrs.get("Created", ""),
                "pool": c.labels.get("sandboxd.pool", ""),
            }
        )
        try:
            c.remove(force=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as e:  # e.g. removal already in progress
            found[-1]["remove_error"] = str(e.explanation)
    return found


# -- reporting -----------------------------------------------------------------


def machine_info(dk: docker.DockerClient) -> dict[str, Any]:
    version = dk.version()
    cpu = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu": cpu,
        "docker_server_version": version.get("Version", ""),
        "docker_api_version": version.get("ApiVersion", ""),
        "storage_driver": dk.info().get("Driver", ""),
        "python": platform.python_version(),
        "grpcio": grpc.__version__,
        "kernel": platform.release(),
        **code_version(),
    }


def code_version() -> dict[str, Any]:
    """The sandboxd code measured: HEAD and whether sandboxd/ had uncommitted changes."""
    root = Path(__file__).resolve().parent.parent
    out: dict[str, Any] = {}
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "sandboxd", "proto"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        )
        out["git_commit"] = head.stdout.strip()
        out["sandboxd_uncommitted_files"] = len(dirty.stdout.splitlines())
    return out


def goals_of(report: dict[str, Any]) -> dict[str, Any]:
    """Each goal of GOALS against the report's own values (ratios to its own baselines)."""
    goals: dict[str, Any] = {}
    for key, (op, factor, base, what) in GOALS.items():
        value = report.get(key)
        reference = report.get(base) if base else 1.0
        target = None if reference is None else factor * reference
        met = None
        if value is not None and target is not None:
            met = value <= target if op == "<=" else value >= target
        text = f"{op} {factor:g}" if base is None else f"{op} {factor:g} x {base}"
        if base is not None and target is not None:
            text += f" ({target:.3f})"
        goals[key] = {"goal": text, "value": value, "met": met, "what": what}
    return goals


def build_report(
    raw: dict[str, Any], cfg: Config, machine: dict[str, Any], leaked: int, error: str, quick: bool
) -> dict[str, Any]:
    def get(section: str, key: str = "p50", sub: str | None = None) -> float | None:
        node = raw.get(section)
        if sub is not None and isinstance(node, dict):
            node = node.get(sub)
        if not isinstance(node, dict):
            return None
        value = node.get(key)
        return None if value is None or (isinstance(value, float) and math.isnan(value)) else value

    layouts = raw.get("throughput_layouts", [])
    best = max(layouts, key=lambda x: x["exec_per_s"]) if layouts else None
    report: dict[str, Any] = {
        "acquire_p50_ms": get("acquire_n"),
        "acquire_p99_ms": get("acquire_n", "p99"),
        "acquire_1_p50_ms": get("acquire_1"),
        "acquire_1_p99_ms": get("acquire_1", "p99"),
        "docker_run_p50_ms": get("docker_run"),
        "exec_p50_ms": get("exec", sub="session"),
        "exec_p99_ms": get("exec", "p99", sub="session"),
        "exec_nosession_p50_ms": get("exec", sub="nosession"),
        "exec_nosession_p99_ms": get("exec", "p99", sub="nosession"),
        "exec_backend_p50_ms": get("exec", sub="session_backend"),
        "exec_nosession_backend_p50_ms": get("exec", sub="nosession_backend"),
        "docker_exec_p50_ms": get("docker_exec"),
        "acquire_group_p50_ms": get("acquire_group"),
        "grpc_floor_p50_ms": get("grpc_floor_n"),
        "grpc_floor_p99_ms": get("grpc_floor_n", "p99"),
        "grpc_floor_1_p50_ms": get("grpc_floor_1"),
        "exec_per_s": best["exec_per_s"] if best else None,
        "exec_layout": (
            f"{best['sandboxes']} sandboxes x {best['sessions_per_sandbox']} sessions" if best else None
        ),
        "concurrent_clients": cfg.clients,
        "leaked": leaked,
        "quick": quick,
        "machine": machine,
        "config": asdict(cfg),
        "details": raw,
    }
    report["goals"] = goals_of(report)
    report["goals_met"] = all(g["met"] for g in report["goals"].values())
    if error:
        report["error"] = error
    return report


def combine(reports: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One report of several trials: each top-level number the median of
    the trials', goals judged on those; details are the median trial's
    (by exec throughput), and every trial's numbers are kept beside them."""
    if len(reports) == 1:
        return reports[0]
    ranked = sorted(reports, key=lambda r: r.get("exec_per_s") or 0.0)
    out = dict(ranked[len(ranked) // 2])
    numbers = [k for k, v in out.items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    for key in numbers:
        values = [r[key] for r in reports if isinstance(r.get(key), (int, float))]
        if values:
            out[key] = round(statistics.median(values), 3)
    out["leaked"] = sum(r.get("leaked", 0) for r in reports)
    out["details"] = {
        **out["details"],
        "combined": f"top-level numbers are the per-key median of {len(reports)} trials "
        "(details.trials); other details from the median trial by exec_per_s",
        "trials": [{k: r.get(k) for k in numbers} for r in reports],
    }
    out["goals"] = goals_of(out)
    out["goals_met"] = all(g["met"] for g in out["goals"].values())
    errors = [r["error"] for r in reports if r.get("error")]
    if errors:
        out["error"] = "; ".join(errors)
    return out


def print_table(report: dict[str, Any]) -> None:
    def fmt(v: Any, unit: str = "ms") -> str:
        if v is None:
            return "-"
        return f"{v:,.0f} {unit}" if unit.endswith("/s") else f"{v:.2f} {unit}"

    n = report["concurrent_clients"]
    d = report["details"]
    rows = [
        (
            "warm Acquire, 1 client",
            fmt(report["acquire_1_p50_ms"]),
            fmt(report["acquire_1_p99_ms"]),
            f"docker run --rm true: p50 {fmt(report['docker_run_p50_ms'])}",
        ),
        (
            f"warm Acquire, {n} clients",
            fmt(report["acquire_p50_ms"]),
            fmt(report["acquire_p99_ms"]),
            "goal p50 and p99 <= 1.2 x the gRPC floor's",
        ),
        (
            f"warm Acquire(n={n}), 1 RPC",
            fmt(report["acquire_group_p50_ms"]),
            "",
            f"all {n} sandboxes in one call (acquire_group)",
        ),
        (
            "gRPC floor (health.Check), 1 client",
            fmt(report["grpc_floor_1_p50_ms"]),
            "",
            "cheapest RPC on the same server and channel",
        ),
        (
            f"gRPC floor (health.Check), {n} clients",
            fmt(report["grpc_floor_p50_ms"]),
            fmt(report["grpc_floor_p99_ms"]),
            "same burst shape as the Acquire rounds",
        ),
        (
            "Exec true, session",
            fmt(report["exec_p50_ms"]),
            fmt(report["exec_p99_ms"]),
            f"docker exec true (SDK): p50 {fmt(report['docker_exec_p50_ms'])}; goal <= 2 x 1-client floor",
        ),
        (
            "Exec true, no session",
            fmt(report["exec_nosession_p50_ms"]),
            fmt(report["exec_nosession_p99_ms"]),
            f"docker exec true (SDK): p50 {fmt(report['docker_exec_p50_ms'])}",
        ),
    ]

    def split(cpu: dict[str, float] | None) -> str:
        if not cpu:
            return ""
        return (
            f"; CPU ms/call: server {cpu['server']:.2f}, client {cpu['client']:.2f}, rest {cpu['rest']:.2f}"
        )

    floor = d.get("grpc_floor_throughput", {})
    floor_per_s = floor.get("per_s")
    rows.append(
        (
            f"gRPC floor throughput ({n} clients)",
            fmt(floor_per_s, "calls/s"),
            "",
            "health.Check back to back" + split(floor.get("cpu_ms_per_call")),
        )
    )
    for layout in d.get("throughput_layouts", []):
        rows.append(
            (
                f"Exec throughput {layout['sandboxes']}x{layout['sessions_per_sandbox']} ({n} clients)",
                fmt(layout["exec_per_s"], "exec/s"),
                "",
                "goal >= 2,500 exec/s" + split(layout.get("cpu_ms_per_call")),
            )
        )
    widths = [max(len(r[i]) for r in [*rows, ("", "p50", "p99", "")]) for i in range(4)]
    head = ("", "p50", "p99", "baseline / goal")
    line = "  ".join("-" * w for w in widths)
    print(line)
    print("  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)))
    print(line)
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
    print(line)
    m = report["machine"]
    print(
        f"machine: {m.get('nproc')} CPUs ({m.get('cpu', '')}), docker {m.get('docker_server_version')}, "
        f"python {m.get('python')}, grpcio {m.get('grpcio')}; host CPU busy before start "
        f"{m.get('background_cpu_pct')}%, during run {m.get('host_cpu_busy_pct_during_run')}%"
    )
    if report.get("exec_layout"):
        print(f"throughput layout kept: {report['exec_layout']} ({report['exec_per_s']:,.0f} exec/s)")
    for g in report["goals"].values():
        mark = "ok  " if g["met"] else ("MISS" if g["met"] is False else "n/a ")
        print(f"goal {mark} {g['what']}: {g['value']} (goal {g['goal']})")
    load = report["details"].get("host_load", {})
    if load:
        print(
            "other processes' CPU during each phase (share of all CPUs, lower bound): "
            + ", ".join(f"{name} {v['other_pct']:.0f}%" for name, v in load.items())
        )
        if max(v["other_pct"] for v in load.values()) > 10:
            print("WARNING: other workloads ran during the measurement; rerun on a quiet host (--wait-idle)")
    print(f"leaked containers: {report['leaked']}")
    if report.get("error"):
        print(f"ERROR: {report['error']}")


# -- entry point ---------------------------------------------------------------


@contextlib.contextmanager
def cleanup_signals() -> Iterator[None]:
    """During cleanup a second Ctrl-C must not cut it short."""

    def note(signum: int, frame: FrameType | None) -> None:
        log("cleaning up; please wait")

    old_int = signal.signal(signal.SIGINT, note)
    old_term = signal.signal(signal.SIGTERM, note)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old_int)
        signal.signal(signal.SIGTERM, old_term)


def wait_for_idle(limit: float, threshold: float = 20.0) -> float:
    """Waits up to limit seconds for the host to be under threshold % busy
    (other workloads skew every number here); returns the last reading."""
    deadline = time.perf_counter() + limit
    busy = background_load()
    while busy > threshold and time.perf_counter() < deadline:
        log(f"host {busy:.0f}% busy; waiting for it to calm down")
        busy = background_load(2.0)
    return busy


def run(
    cfg: Config,
    server_wrapper: Sequence[str],
    quick: bool,
    wait_idle: float = 0.0,
    profiler: Profiler | None = None,
) -> tuple[dict[str, Any], int]:
    signal.signal(signal.SIGTERM, _on_sigterm)
    dk = docker.from_env(timeout=120)
    image = ensure_default_image()
    instance = f"bench-{secrets.token_hex(4)}"
    state_dir = Path(tempfile.mkdtemp(prefix="sandboxd-bench-"))
    raw: dict[str, Any] = {}
    error = ""
    server: ServerProcess | None = None
    machine = machine_info(dk)
    machine["background_cpu_pct"] = wait_for_idle(wait_idle)
    machine["loadavg_start"] = os.getloadavg()[0]
    if machine["background_cpu_pct"] > 25:
        log(
            f"warning: the host is {machine['background_cpu_pct']:.0f}% busy before we start; "
            "numbers will be noisy"
        )
    meter = CpuMeter()
    log(
        f"image {image}, instance {instance}, {machine['nproc']} CPUs, "
        f"docker {machine['docker_server_version']}"
    )
    try:
        raw.update(docker_baselines(dk, image, cfg, instance))
        server = ServerProcess(instance, state_dir, server_wrapper)
        raw.update(asyncio.run(run_sandboxd(server, image, cfg, profiler)))
    except KeyboardInterrupt as e:
        error = f"interrupted ({str(e) or 'Ctrl-C'})"
    except Exception as e:
        error = f"{type(e).__name__}: {e}"
        log(f"benchmark failed: {error}")
    finally:
        machine["host_cpu_busy_pct_during_run"] = meter.busy_pct()
        machine["loadavg_end"] = os.getloadavg()[0]
        with cleanup_signals():
            if server is not None:
                if server.proc.poll() is None:
                    log(f"deleting pool: {asyncio.run(delete_pool(server.address))}")
                code = server.stop()
                log(f"server exited with {code}")
                if error and server.proc.returncode not in (0, None):
                    log(f"server log tail:\n{server.log_tail()}")
            leftovers = sweep(dk, instance)
            leaked = len(leftovers)
            if leftovers:
                raw["leftovers"] = leftovers
                log(
                    f"removed {leaked} leftover containers labelled {LABEL_INSTANCE}={instance}: "
                    + ", ".join(
                        f"{x['name']} ({x['status']}, created {x['created'][11:23]})" for x in leftovers[:5]
                    )
                    + (" ..." if leaked > 5 else "")
                )
            shutil.rmtree(state_dir, ignore_errors=True)
            dk.close()
    return build_report(raw, cfg, machine, leaked, error, quick), (1 if error else 0)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.acquire_exec", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="small run (CI smoke test)")
    parser.add_argument("--clients", type=int, help="concurrent clients (and pool size)")
    parser.add_argument("--rounds", type=int, help="concurrent acquire rounds")
    parser.add_argument("--seconds", type=float, help="exec throughput measurement time")
    parser.add_argument("--channels", type=int, help="gRPC channels shared by the concurrent clients")
    parser.add_argument("--layouts", help="throughput layouts, e.g. '16x4,64x1' (sandboxes x sessions)")
    parser.add_argument(
        "--server-wrapper",
        default="",
        help="command prefix for the server, e.g. 'py-spy record -o prof.svg --'",
    )
    parser.add_argument(
        "--trials", type=int, default=1, help="whole runs, one after another; the report takes medians"
    )
    parser.add_argument("--output", type=Path, default=RESULTS_PATH, help="where the JSON goes")
    parser.add_argument(
        "--profile",
        type=Path,
        nargs="?",
        const=PROFILE_PATH,
        metavar="PATH",
        help="sample the server and the client with py-spy inside the timed bursts and write a table "
        f"(default {PROFILE_PATH.relative_to(PROFILE_PATH.parents[2])}) and the collapsed stacks "
        "beside it (.folded); the run's numbers are a little slower than an unprofiled run's",
    )
    parser.add_argument(
        "--profile-rate",
        type=int,
        default=1000,
        help="py-spy samples per second (the bursts are short: add --rounds 20 for enough samples)",
    )
    parser.add_argument(
        "--wait-idle",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="first wait up to this long for other load on the host to drop under 20%%",
    )
    args = parser.parse_args(argv)

    cfg = Config.quick() if args.quick else Config.full()
    changes: dict[str, Any] = {}
    if args.clients:
        changes["clients"] = args.clients
        changes["sequential_acquires"] = min(cfg.sequential_acquires, args.clients)
    if args.rounds:
        changes["acquire_rounds"] = args.rounds
    if args.seconds:
        changes["throughput_seconds"] = args.seconds
    if args.channels:
        changes["channels"] = args.channels
    if args.layouts:
        changes["layouts"] = tuple(tuple(int(x) for x in part.split("x")) for part in args.layouts.split(","))
    if changes:
        cfg = Config(**{**asdict(cfg), **changes})
    for sandboxes, sessions in cfg.layouts:
        if sandboxes > cfg.clients:
            parser.error(f"layout {sandboxes}x{sessions} needs more sandboxes than the pool's {cfg.clients}")

    with tempfile.TemporaryDirectory(prefix="sandboxd-profile-") as workdir:
        profiler = Profiler(args.profile_rate, Path(workdir)) if args.profile else None
        reports, code = [], 0
        for trial in range(max(1, args.trials)):
            if args.trials > 1:
                log(f"trial {trial + 1} of {args.trials}")
            one, failed = run(cfg, shlex.split(args.server_wrapper), args.quick, args.wait_idle, profiler)
            reports.append(one)
            code = max(code, failed)
        report = combine(reports)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    if profiler is not None:
        args.profile.parent.mkdir(parents=True, exist_ok=True)
        args.profile.write_text(profiler.table())
        args.profile.with_suffix(".folded").write_text(profiler.folded())
        log(f"profile written to {args.profile} (collapsed stacks: {args.profile.with_suffix('.folded')})")
    print_table(report)
    print(json.dumps(report, separators=(",", ":")))
    return code


if __name__ == "__main__":
    sys.exit(main())
