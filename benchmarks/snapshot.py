"""Snapshot, restore and fork through sandboxd on Docker, beside the baselines.

    python -m benchmarks.snapshot            # 50 MB / 5,000 files, 5 trials (medians: this machine is noisy)
    python -m benchmarks.snapshot --quick    # 5 MB / 500 files, 1 trial
    python -m benchmarks.snapshot --through-sandbox   # never read in place

By default the server reads Docker workspaces in place from the host (it runs
here as root) and follows change journals; ``--through-sandbox`` measures the
path a remote engine or Kubernetes takes (listing commands, tar streams) and
writes benchmarks/results/snapshot-through-sandbox.json instead.

Runs ``sandboxd serve`` as a separate process and measures, per trial, on a
fresh sandbox whose workspace is filled with incompressible random files:

- ``raw_tar_ms``: ``tar -c`` of the workspace inside the container, streamed
  out through the engine's exec API (the floor for a snapshot read through the
  sandbox; one read in place from the host need not stream anything);
- ``snapshot_ms``: a full Snapshot RPC (cold blob store for that content);
- ``restore_ms``: Restore of that snapshot into one warm sandbox;
- ``incremental_snapshot_ms``: Snapshot of the restored sandbox after 1% of
  its files were rewritten;
- ``fork8_ms``: Restore of a snapshot (never restored before) into 8 sandboxes;
- ``docker_exec_fork8_ms``: the same archive (the raw tar above) extracted
  into 8 running plain containers at once with ``docker exec -i ... tar -x``
  (what a fork costs without sandboxd's staged hand-over);
- ``docker_commit_run_ms``: ``docker commit`` of a plain container holding the
  same files in its root filesystem, then ``docker run`` of the committed image
  (what one would do without sandboxd; tmpfs workspaces are not committed).

Medians over trials are reported. The last line of stdout is the JSON object
also written to benchmarks/results/snapshot.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import docker
import docker.errors

from sandboxd.backends.base import LABEL_INSTANCE
from sandboxd.client import AsyncClient
from sandboxd.images.build import ensure_default_image

RESULTS_PATH = Path(__file__).resolve().parent / "results" / "snapshot.json"
POOL = "snap"
SESSION = "agent"
GOALS = {
    "snapshot_vs_raw_tar": ("<=", 1.4, "snapshot_ms / raw_tar_ms"),
    "incremental_vs_full": ("<=", 0.10, "incremental_snapshot_ms / snapshot_ms"),
    "fork8_ms": ("<=", 1000.0, "fork of 8"),
}

# Writes FILES random files totalling BYTES under DIR, 50 per directory.
GENERATE = r"""
import os, sys
root, files, total = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
size = total // files
for i in range(files):
    d = os.path.join(root, f"d{i // 50:03d}")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f"f{i:05d}.bin"), "wb") as fh:
        fh.write(os.urandom(size))
"""

# Rewrites every 100th file with new random bytes of the same size.
CHANGE = r"""
import os, sys
root = sys.argv[1]
paths = sorted(os.path.join(dp, f) for dp, _, fs in os.walk(root) for f in fs)
for p in paths[::100]:
    n = os.path.getsize(p)
    with open(p, "wb") as fh:
        fh.write(os.urandom(n))
print(len(paths[::100]))
"""


def log(msg: str) -> None:
    print(f"[snapshot-bench] {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def timed(fn: Callable[[], Awaitable[Any]]) -> tuple[float, Any]:
    t = time.perf_counter()
    result = await fn()
    return (time.perf_counter() - t) * 1000, result


def raw_tar_ms(dk: docker.DockerClient, container: str, keep: Path | None = None) -> tuple[float, int]:
    """tar of /workspace inside the container, streamed out and counted
    (and written to ``keep`` when given)."""
    t = time.perf_counter()
    exec_id = dk.api.exec_create(container, ["tar", "-c", "-f", "-", "-C", "/workspace", "."], user="1000")
    size = 0
    with contextlib.ExitStack() as stack:
        sink = stack.enter_context(keep.open("wb")) if keep is not None else None
        for chunk in dk.api.exec_start(exec_id, stream=True):
            size += len(chunk)
            if sink is not None:
                sink.write(chunk)
    code = dk.api.exec_inspect(exec_id)["ExitCode"]
    if code != 0:
        raise RuntimeError(f"raw tar exited {code}")
    return (time.perf_counter() - t) * 1000, size


def docker_exec_fork_ms(dk: docker.DockerClient, image: str, instance: str, archive: Path, n: int) -> float:
    """``docker exec -i <c> tar -x`` of ``archive`` into ``n`` running plain
    containers (tmpfs workspace, as sandboxes have) at once; only the
    extraction is timed, the containers are started before (a warm pool)."""
    containers = [
        dk.containers.run(
            image, ["sleep", "infinity"], detach=True, network_mode="none", user="1000",
            tmpfs={"/workspace": "size=256m,nr_inodes=20000,uid=1000,gid=1000"},
            labels={LABEL_INSTANCE: instance},
        )
        for _ in range(n)
    ]  # fmt: skip
    try:
        t = time.perf_counter()
        procs = []
        for c in containers:
            with archive.open("rb") as fh:
                cmd = ["docker", "exec", "-i", c.id, "tar", "-x", "-C", "/workspace", "-f", "-"]
                procs.append(subprocess.Popen(cmd, stdin=fh))
        codes = [p.wait() for p in procs]
        elapsed = (time.perf_counter() - t) * 1000
        if any(codes):
            raise RuntimeError(f"docker exec tar -x exited {codes}")
        return elapsed
    finally:
        for c in containers:
            with contextlib.suppress(docker.errors.DockerException):
                c.remove(force=True)


def docker_commit_run_ms(dk: docker.DockerClient, image: str, instance: str, files: int, total: int) -> float:
    container = dk.containers.run(
        image, ["sleep", "infinity"], detach=True, network_mode="none", labels={LABEL_INSTANCE: instance}
    )
    tag = f"sandboxd-bench/commit-{secrets.token_hex(4)}"
    try:
        code, out = container.exec_run(["python3", "-c", GENERATE, "/data", str(files), str(total)])
        if code != 0:
            raise RuntimeError(f"generate failed: {out!r}")
        t = time.perf_counter()
        committed = container.commit(repository=tag)
        run = dk.containers.run(committed.id, ["true"], detach=True, network_mode="none")
        run.wait()
        elapsed = (time.perf_counter() - t) * 1000
        run.remove(force=True)
        return elapsed
    finally:
        container.remove(force=True)
        with contextlib.suppress(docker.errors.DockerException):
            dk.images.remove(tag, force=True)


class Server:
    def __init__(self, instance: str, state_dir: Path, config: str = "") -> None:
        self.port = free_port()
        self._log = (state_dir / "server.log").open("wb")
        cmd = [
            sys.executable, "-m", "sandboxd.cli", "--log-level", "WARNING", "serve",
            "--host", "127.0.0.1", "--port", str(self.port), "--instance", instance,
            "--state-dir", str(state_dir),
        ]  # fmt: skip
        if config:
            (state_dir / "sandboxd.toml").write_text(config)
            cmd += ["--config", str(state_dir / "sandboxd.toml")]
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
        self._log.close()


async def wait_ready(client: AsyncClient, n: int, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        pool = await client.get_pool(POOL)
        if pool.status.ready >= n and pool.status.creating == 0:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"pool never reached {n} READY (now {pool.status.ready})")
        await asyncio.sleep(0.2)


async def trial(
    client: AsyncClient, dk: docker.DockerClient, files: int, total: int, fork_n: int, archive: Path
) -> dict[str, float]:
    out: dict[str, float] = {}
    await wait_ready(client, fork_n + 1)
    source = await client.lease(POOL, timeout=60)
    sb = source[0]
    try:
        r = await sb.exec(["python3", "-c", GENERATE, "/workspace", str(files), str(total)], timeout=300)
        assert r.ok, r
        assert (await sb.exec("cd /workspace && export STEP=1", session=SESSION)).ok
        out["raw_tar_ms"], out["raw_tar_bytes"] = await asyncio.to_thread(raw_tar_ms, dk, f"sandboxd-{sb.id}")
        if not await asyncio.to_thread(archive.exists):  # for the docker exec fork baseline; not timed
            await asyncio.to_thread(raw_tar_ms, dk, f"sandboxd-{sb.id}", archive)
        out["snapshot_ms"], snap = await timed(lambda: sb.snapshot(session=SESSION, policy_version=1))
        assert snap.entry_count >= files, snap
        out["snapshot_stored_bytes"] = snap.stored_bytes
        # A second snapshot id of the same content: dedup, and an uncached tar for the fork.
        out["snapshot_again_ms"], again = await timed(lambda: sb.snapshot(session=SESSION, policy_version=1))
    finally:
        await source.release()
    await wait_ready(client, fork_n + 1)
    out["restore_ms"], restored = await timed(lambda: client.restore(snap.id, timeout=60))
    try:
        target = restored[0]
        r = await target.exec(["python3", "-c", CHANGE, "/workspace"], timeout=120)
        assert r.ok, r
        out["incremental_snapshot_ms"], inc = await timed(lambda: target.snapshot(session=SESSION))
        out["incremental_stored_bytes"] = inc.stored_bytes
        assert inc.parent_id == snap.id
    finally:
        await restored.release()
    await wait_ready(client, fork_n)
    out["fork8_ms"], fork = await timed(lambda: client.restore(again.id, n=fork_n, timeout=60))
    try:
        checks = await asyncio.gather(*(s.exec("pwd; echo $STEP", session=SESSION) for s in fork))
        assert all(c.text == "/workspace\n1\n" for c in checks), checks
    finally:
        await fork.release()
    return out


async def run(quick: bool, through_sandbox: bool = False) -> dict[str, Any]:
    files, total, trials = (500, 5 << 20, 1) if quick else (5000, 50 << 20, 5)
    fork_n = 8
    image = await asyncio.to_thread(ensure_default_image, log=log)
    dk = docker.from_env()
    instance = "bench-snap-" + secrets.token_hex(3)
    load_before = os.getloadavg()[0]
    state = Path(tempfile.mkdtemp(prefix="sandboxd-bench-"))
    server = Server(instance, state, "[backend]\nhost_workspaces = false\n" if through_sandbox else "")
    results: list[dict[str, float]] = []
    commit_ms: list[float] = []
    docker_fork_ms: list[float] = []
    archive = state / "workspace.tar"
    try:
        async with AsyncClient(server.target) as client:
            await client.wait_ready(30)
            await client.create_pool(POOL, image, min_ready=fork_n + 2, max_size=fork_n + 6)
            for i in range(trials):
                log(f"trial {i + 1}/{trials}")
                results.append(await trial(client, dk, files, total, fork_n, archive))
                log(json.dumps(results[-1]))
            await client.delete_pool(POOL, force=True)
            # The engine baselines after every sandboxd trial: committing 50 MB
            # and pushing 8 x 56 MB through the engine leave disk writeback and
            # the engine busy for a while, which would tax the trials after them.
            for _ in range(trials):
                docker_fork_ms.append(
                    await asyncio.to_thread(docker_exec_fork_ms, dk, image, instance, archive, fork_n)
                )
                commit_ms.append(
                    await asyncio.to_thread(docker_commit_run_ms, dk, image, instance, files, total)
                )
    finally:
        server.stop()
        for c in dk.containers.list(all=True, filters={"label": f"{LABEL_INSTANCE}={instance}"}):
            with contextlib.suppress(docker.errors.DockerException):
                c.remove(force=True)
    med = {k: round(statistics.median(r[k] for r in results), 1) for k in results[0]}
    summary: dict[str, Any] = {
        "snapshot_ms": med["snapshot_ms"],
        "restore_ms": med["restore_ms"],
        "raw_tar_ms": med["raw_tar_ms"],
        "docker_commit_run_ms": round(statistics.median(commit_ms), 1),
        "docker_exec_fork8_ms": round(statistics.median(docker_fork_ms), 1),
        "incremental_snapshot_ms": med["incremental_snapshot_ms"],
        "fork8_ms": med["fork8_ms"],
        "snapshot_again_ms": med["snapshot_again_ms"],
        "snapshot_stored_bytes": int(med["snapshot_stored_bytes"]),
        "incremental_stored_bytes": int(med["incremental_stored_bytes"]),
        "raw_tar_bytes": int(med["raw_tar_bytes"]),
        "workspace": {"files": files, "bytes": total, "changed_files": files // 100},
        "trials": trials,
        "read_path": "through-sandbox" if through_sandbox else "in-place",
        "per_trial": results,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        # 1-minute load averages around the run: on a shared 2-core machine, other
        # work inflates every figure (ratios between same-trial figures hold better).
        "load_average": {"before": round(load_before, 2), "after": round(os.getloadavg()[0], 2)},
    }
    ratios = {
        "snapshot_vs_raw_tar": summary["snapshot_ms"] / summary["raw_tar_ms"],
        "incremental_vs_full": summary["incremental_snapshot_ms"] / summary["snapshot_ms"],
        "fork8_ms": summary["fork8_ms"],
    }
    summary["goals"] = {
        name: {
            "value": round(ratios[name], 3),
            "goal": f"{op} {limit}",
            "met": ratios[name] <= limit,
            "what": what,
        }
        for name, (op, limit, what) in GOALS.items()
    }
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="5 MB / 500 files, one trial")
    parser.add_argument(
        "--through-sandbox", action="store_true", help="read workspaces through the sandbox, never in place"
    )
    args = parser.parse_args()
    summary = asyncio.run(run(args.quick, args.through_sandbox))
    if not args.quick:
        path = (
            RESULTS_PATH.with_name("snapshot-through-sandbox.json") if args.through_sandbox else RESULTS_PATH
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
