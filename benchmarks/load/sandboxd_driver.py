"""The sandboxd driver: episodes against a sandboxd server over gRPC.

With ``target=None`` it starts its own server (``ServerProcess``: loopback,
unique instance id, temporary state dir) and, after the run, stops it and
counts containers still carrying that instance's label: those are leaks.
Against a ``target`` it only counts sandboxes left LEASED under the run's label.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from benchmarks.load import snapshots
from benchmarks.load.episode import ExecOutcome
from benchmarks.load.leaks import RUN_LABEL, engine_leftovers, leased_leftovers
from benchmarks.load.server import ServerProcess
from sandboxd import errors
from sandboxd.client import AsyncClient, Sandbox

SESSION = "agent"


class SandboxdDriver:
    name = "sandboxd"

    def __init__(
        self,
        *,
        run_id: str,
        image: str,
        min_ready: int,
        max_size: int,
        target: str | None = None,
        pool: str | None = None,
        lease_ttl: float = 900.0,
        acquire_timeout: float = 300.0,
        backend: str = "docker",
        log: Any = None,
    ) -> None:
        self.run_id = run_id
        self.image = image
        self.min_ready = min_ready
        self.max_size = max_size
        self.target = target
        self.pool = pool or f"load-{run_id}"
        self._own_pool = pool is None
        self.lease_ttl = lease_ttl
        self.acquire_timeout = acquire_timeout
        self.backend = backend
        self.snapshots = False
        self.snapshot_note = "not checked"
        self.server: ServerProcess | None = None
        self.client: AsyncClient | None = None
        self._snapshot: snapshots.SnapshotMethod | None = None
        self._channel: grpc.aio.Channel | None = None
        self._sessions: set[str] = set()
        self._cpu0: tuple[float | None, float] = (None, 0.0)
        """Sandboxes whose session exists (a snapshot captures its state)."""
        self._log = log or (lambda msg: None)

    @property
    def c(self) -> AsyncClient:
        assert self.client is not None, "setup() first"
        return self.client

    # -- set-up and tear-down ---------------------------------------------------

    async def setup(self, warm_timeout: float) -> dict[str, Any]:
        """Starts the server if needed, creates the pool and waits until it is
        warm; returns what it measured (seconds for each part)."""
        info: dict[str, Any] = {}
        if self.target is None:
            self.server = ServerProcess(backend=self.backend)
            info["server_start_s"] = round(await self.server.wait_healthy(), 3)
            info["instance"] = self.server.instance
            address = self.server.address
        else:
            address = self.target
        self.client = AsyncClient(address)
        await self.client.wait_ready(10.0)
        self._channel = grpc.aio.insecure_channel(address)
        self._snapshot, self.snapshot_note = await asyncio.to_thread(snapshots.discover, address)
        self.snapshots = self._snapshot is not None
        self._log(f"sandboxd at {address}; snapshots: {self.snapshot_note}")
        t0 = time.perf_counter()
        if self._own_pool:
            await self.c.create_pool(self.pool, self.image, min_ready=self.min_ready, max_size=self.max_size)
        await self.wait_warm(self.min_ready, warm_timeout)
        info["warmup_s"] = round(time.perf_counter() - t0, 3)
        self._cpu0 = (self.server_cpu_seconds(), time.perf_counter())
        info["pool"] = self.pool
        info["min_ready"] = self.min_ready
        info["max_size"] = self.max_size
        self._log(f"pool {self.pool}: {self.min_ready} READY after {info['warmup_s']:.1f}s")
        return info

    async def wait_warm(self, ready: int, timeout: float) -> None:
        deadline = time.perf_counter() + timeout
        while True:
            status = (await self.c.get_pool(self.pool)).status
            if status.ready >= ready and status.creating == 0:
                return
            if time.perf_counter() > deadline:
                raise TimeoutError(
                    f"pool {self.pool} not warm within {timeout:g}s: ready {status.ready}/{ready}, "
                    f"creating {status.creating}, failed {status.failed_total}, "
                    f"last error {status.last_error!r}"
                )
            await asyncio.sleep(0.25)

    def server_cpu_seconds(self) -> float | None:
        """CPU time (user + system) of our server process so far; None when not ours."""
        if self.server is None:
            return None
        try:
            fields = Path(f"/proc/{self.server.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    async def hold_refill(self) -> None:
        """Every group of the step holds its sandboxes: no refill during the step."""
        await self.c.update_pool(self.pool, min_ready=0)

    async def refill(self, timeout: float) -> None:
        """Between steps: the floor back, and wait until the pool is warm."""
        await self.c.update_pool(self.pool, min_ready=self.min_ready)
        await self.wait_warm(self.min_ready, timeout)

    async def teardown(self) -> dict[str, Any]:
        """Deletes the pool (if ours), stops the server (if ours), and counts leaks."""
        out: dict[str, Any] = {"leaked": 0, "leftovers": []}
        cpu1 = self.server_cpu_seconds()
        if self._cpu0[0] is not None and cpu1 is not None:
            elapsed = time.perf_counter() - self._cpu0[1]
            out["server_cpu_s"] = round(cpu1 - self._cpu0[0], 2)
            out["server_cpu_pct_of_one_core"] = round(100 * (cpu1 - self._cpu0[0]) / elapsed, 1)
        if self.client is not None:
            with contextlib.suppress(errors.SandboxdError, grpc.aio.AioRpcError):
                left = await leased_leftovers(self.client, self.run_id)
                out["leftovers"] += left
            if self._own_pool:
                try:
                    await asyncio.wait_for(self.c.delete_pool(self.pool, force=bool(out["leftovers"])), 120)
                except Exception as e:  # reported, not fatal: the leak check below decides
                    out["delete_pool_error"] = f"{type(e).__name__}: {e}"
            await self.client.close()
        if self._channel is not None:
            await self._channel.close()
        if self.server is not None:
            out["server_exit_code"] = await asyncio.to_thread(self.server.stop)
            if self.backend == "docker":
                import docker

                from sandboxd.backends.base import LABEL_INSTANCE

                engine = docker.from_env(timeout=120)
                try:
                    found = await asyncio.to_thread(
                        engine_leftovers, engine, LABEL_INSTANCE, self.server.instance
                    )
                finally:
                    engine.close()
                out["leftovers"] += found
            if out["server_exit_code"] != 0 or out["leftovers"]:
                out["server_log_tail"] = self.server.log_tail()
                out["server_state_dir"] = str(self.server.state_dir)
            else:
                shutil.rmtree(self.server.state_dir, ignore_errors=True)
        out["leaked"] = len(out["leftovers"])
        return out

    # -- the Driver protocol ----------------------------------------------------

    async def acquire(self, n: int, labels: Mapping[str, str]) -> Sequence[Sandbox]:
        lease = await self.c.lease(
            self.pool,
            n,
            labels={RUN_LABEL: self.run_id, **labels},
            lease_ttl=self.lease_ttl,
            timeout=self.acquire_timeout,
        )
        return lease.sandboxes

    async def exec(self, box: object, command: str, *, session: bool, timeout: float) -> ExecOutcome:
        assert isinstance(box, Sandbox)
        if session:
            self._sessions.add(box.id)
        r = await box.exec(command, session=SESSION if session else "", timeout=timeout)
        return ExecOutcome(r.outcome, r.exit_code, r.stderr)

    async def write(self, box: object, files: Sequence[tuple[str, bytes]]) -> None:
        assert isinstance(box, Sandbox)
        await box.write_files(dict(files))

    async def snapshot(self, box: object) -> None:
        assert isinstance(box, Sandbox) and self._channel is not None
        if self._snapshot is None:
            return
        try:
            await snapshots.call(
                self._channel,
                self._snapshot,
                box.id,
                timeout=120.0,
                session=SESSION if box.id in self._sessions else None,
                labels={RUN_LABEL: self.run_id},
                ttl_seconds=self.lease_ttl,
            )
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                self.snapshots = False
                self.snapshot_note = f"{self._snapshot.path} answered UNIMPLEMENTED; snapshots skipped"
                return
            raise

    async def release(self, boxes: Sequence[object]) -> None:
        first = boxes[0]
        assert isinstance(first, Sandbox)
        await self.c.release(first.lease_id)
        for b in boxes:
            self._sessions.discard(getattr(b, "id", ""))

    def classify(self, error: BaseException) -> str:
        cause = error.__cause__ if isinstance(error, errors.SandboxdError) else error
        if isinstance(cause, grpc.aio.AioRpcError):
            return f"grpc:{cause.code().name}"
        if isinstance(error, TimeoutError):
            return "client:Timeout"
        return f"client:{type(error).__name__}"

    async def sample(self) -> dict[str, int]:
        s = (await self.c.get_pool(self.pool)).status
        return {
            "ready": s.ready,
            "creating": s.creating,
            "leased": s.leased,
            "releasing": s.releasing,
            "waiting": s.waiting,
            "demand": s.leased + s.waiting,
        }


__all__ = ["SandboxdDriver"]
