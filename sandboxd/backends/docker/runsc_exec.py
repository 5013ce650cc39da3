"""Shells in gVisor sandboxes started by ``runsc exec`` from the host, their
stdio on plain pipes the control plane holds.

Through the engine, every byte of a session command crosses dockerd,
containerd and the shim before it reaches gVisor (about 5 ms a round trip
here). ``runsc exec`` instead hands its own stdio to the sandbox as host
descriptors, so the shell reads and writes the control plane's pipes
directly (an echo round trip of 0.03 ms). Donated descriptors, unlike FIFOs
the sandbox opens by name, do not hold up a live checkpoint, and a session
goes on after one. The process gets what ``docker exec`` gives it: the
container's environment with ``env`` added, its capabilities and
no-new-privileges, the given user and directory.

It needs the runtime's own binary and state directory, which only the
engine's host has: both are read from the sandbox process (its executable,
its ``--root``). Where that fails (a remote engine, no permission), or the
process does not start, the engine's stream serves instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from sandboxd.backends.docker.pipes import PipeChannel

__all__ = ["RunscExec", "RunscProcess", "find_runsc"]

# Longest `runsc exec` may take to end after its process did.
_EXIT_WAIT = 5.0


@dataclass(frozen=True)
class RunscExec:
    """How to run a process in one gVisor container with ``runsc exec``."""

    binary: str
    root: str
    container_id: str

    def argv(self, argv: Sequence[str], *, env: Mapping[str, str], cwd: str, user: str) -> list[str]:
        """The ``runsc exec`` command line for ``argv``."""
        out = [self.binary, f"--root={self.root}", "exec", "--user", user]
        if cwd:
            out += ["--cwd", cwd]
        for key, value in env.items():
            out += ["--env", f"{key}={value}"]
        return [*out, self.container_id, *argv]

    async def start(
        self, argv: Sequence[str], *, env: Mapping[str, str], cwd: str, user: str
    ) -> RunscProcess:
        """Starts ``argv`` in the sandbox; its stdio are pipes held here.
        OSError where ``runsc exec`` cannot be started or watched."""
        loop = asyncio.get_running_loop()
        ends: list[int] = []
        try:
            for _ in range(3):
                ends.extend(os.pipe())
            stdin_r, stdin_w, stdout_r, stdout_w, stderr_r, stderr_w = ends
            command = self.argv(argv, env=env, cwd=cwd, user=user)
            proc = await loop.run_in_executor(None, _spawn, command, stdin_r, stdout_w, stderr_w)
        except BaseException:
            for fd in ends:
                with contextlib.suppress(OSError):
                    os.close(fd)
            raise
        for fd in (stdin_r, stdout_w, stderr_w):
            os.close(fd)
        try:
            exited = _watch(proc)
        except OSError:
            proc.kill()
            await loop.run_in_executor(None, proc.wait)
            for fd in (stdin_w, stdout_r, stderr_r):
                os.close(fd)
            raise
        return RunscProcess(proc, exited, PipeChannel(stdin_w, stdout_r, stderr_r))


def _spawn(argv: list[str], stdin: int, stdout: int, stderr: int) -> subprocess.Popen[bytes]:
    # Its own session: a signal to the server's group is not one to the sandbox's shells.
    return subprocess.Popen(argv, stdin=stdin, stdout=stdout, stderr=stderr, start_new_session=True)


def _watch(proc: subprocess.Popen[bytes]) -> asyncio.Future[int]:
    """Its exit code, once it ends, reaped as it ends. A pidfd on the loop,
    not a thread per process: a host may hold a shell per session for hours."""
    loop = asyncio.get_running_loop()
    pidfd = os.pidfd_open(proc.pid)
    exited: asyncio.Future[int] = loop.create_future()

    def ended() -> None:
        code = proc.poll()
        if code is None:
            return
        loop.remove_reader(pidfd)
        os.close(pidfd)
        if not exited.done():
            exited.set_result(code)

    loop.add_reader(pidfd, ended)
    return exited


class RunscProcess:
    """A started ``runsc exec``: the channel to its process, and its exit code."""

    def __init__(
        self, proc: subprocess.Popen[bytes], exited: asyncio.Future[int], channel: PipeChannel
    ) -> None:
        self.proc = proc
        self.exited = exited
        self.channel = channel

    async def exit_code(self) -> int | None:
        """The process's exit code as ``docker exec`` reports it (128 + the
        signal that ended it); None if ``runsc exec`` has not ended in time."""
        with contextlib.suppress(TimeoutError):
            return await asyncio.wait_for(asyncio.shield(self.exited), _EXIT_WAIT)
        return None

    async def close(self) -> None:
        """Closes the pipes; ``runsc exec`` ends with its process (killed if it
        outlives that, which leaves the process in the sandbox untouched)."""
        await self.channel.close()
        if await self.exit_code() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            await asyncio.shield(self.exited)


def find_runsc(sandbox_pid: int, container_id: str) -> RunscExec | None:
    """The runtime's binary and state directory, read from the gVisor sandbox
    process ``sandbox_pid`` (the container's pid as the engine reports it);
    None where this host cannot see or run them. Blocks (reads /proc)."""
    if sandbox_pid <= 0 or not container_id:
        return None
    try:
        binary = os.readlink(f"/proc/{sandbox_pid}/exe")
        args = Path(f"/proc/{sandbox_pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    root = next((a[len(b"--root=") :].decode() for a in args if a.startswith(b"--root=")), "")
    if not root or not binary.startswith("/") or binary.endswith(" (deleted)"):
        return None
    if not os.access(binary, os.X_OK) or not os.path.isdir(root):
        return None
    return RunscExec(binary, root, container_id)
