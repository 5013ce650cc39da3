"""A sandboxd server as a child process on loopback, with its own instance id
and state directory, for one benchmark run."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    """In the child: SIGTERM when the harness dies, even by SIGKILL (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    os.setsid()  # a Ctrl-C in the terminal reaches only the harness, which stops us in order


class ServerProcess:
    """``python -m sandboxd.cli serve`` on 127.0.0.1 and a free port."""

    def __init__(
        self, *, backend: str = "docker", log_level: str = "WARNING", env: dict[str, str] | None = None
    ) -> None:
        """``env`` adds to the harness's environment (e.g. DOCKER_HOST: another engine)."""
        self.instance = f"load-{secrets.token_hex(4)}"
        self.state_dir = Path(tempfile.mkdtemp(prefix="sandboxd-load-"))
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.log_path = self.state_dir / "server.log"
        cmd = [
            sys.executable, "-m", "sandboxd.cli", "--log-level", log_level, "serve",
            "--host", "127.0.0.1", "--port", str(self.port), "--instance", self.instance,
            "--state-dir", str(self.state_dir), "--backend", backend,
        ]  # fmt: skip
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            cmd,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
            env={**os.environ, **(env or {})},
        )

    def log_tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    async def wait_healthy(self, within: float = 60.0) -> float:
        """Polls grpc.health.v1 until SERVING; returns the seconds it took."""
        t0 = time.perf_counter()
        async with grpc.aio.insecure_channel(self.address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log_tail()}")
                left = t0 + within - time.perf_counter()
                if left <= 0:
                    raise TimeoutError(f"server not healthy within {within:g}s:\n{self.log_tail()}")
                with contextlib.suppress(grpc.aio.AioRpcError):
                    reply = await stub.Check(
                        health_pb2.HealthCheckRequest(service=""), timeout=min(1.0, left)
                    )
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return time.perf_counter() - t0
                await asyncio.sleep(0.05)

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM (graceful: the server stops its pools), SIGKILL if that hangs. Blocking."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
                self.proc.wait(10)
        self._log.close()
        return self.proc.returncode
