"""gVisor sandboxes on Docker: their limits named and their usage read from inside.

Under gVisor the host sees gVisor's own processes, not the sandbox's: its
cgroup's pids count gVisor's threads, and ``/proc/<pid>/root`` is not the
sandbox's filesystem. What the host can still tell is the container's memory
(the whole sandbox lives in its memory cgroup) and whether the engine killed
it for memory. So, for a gVisor sandbox only:

- a command that fails is explained by a statvfs of the workspace and the
  scratch mounts run inside (DISK_FULL), and by a refused fork in its stderr
  (PIDS_EXHAUSTED: the pids limit is RLIMIT_NPROC there, which fails fork
  and clone with EAGAIN and leaves no counter to read);
- a sandbox that stops while a command runs is OOM_KILLED when the engine
  says so: gVisor has no per-process OOM killer, hitting the memory limit
  ends the whole sandbox;
- usage takes memory and CPU from the host's cgroup and processes, disk
  bytes and files from inside.

runc sandboxes pass straight through to the base backend.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

from sandboxd.backends.base import (
    GVISOR,
    WORKSPACE,
    ExecEvent,
    ExecOutcome,
    ExecResult,
    ExecSpec,
    OutputChunk,
    SandboxSpec,
    SandboxUsage,
)
from sandboxd.backends.docker.backend import DockerBackend
from sandboxd.backends.docker.cgroups import SCRATCH, ContainerProbe
from sandboxd.backends.gvisor_pids import KILL_ALL, RESCUE_SESSION, STDERR_KEPT, refused_fork
from sandboxd.errors import SandboxLost

__all__ = ["GvisorAwareBackend", "parse_statfs"]

_MOUNTS = (WORKSPACE, *SCRATCH)
# A filesystem with less than this free is full for a command that failed on it.
_FULL_BYTES = 64 << 10
# gVisor's root overlay grows its file on the host in steps: a write it
# refuses may leave this much of the root's bound unused.
_FULL_ROOT_BYTES = 4 << 20
_STATFS_ARGV = ("stat", "-f", "-c", "%n %S %b %a %c %d", *_MOUNTS)
_PIDS_ARGV = ("sh", "-c", "ls /proc | grep -c '^[0-9]'")


def parse_statfs(text: str) -> dict[str, tuple[int, int, int, int]]:
    """Mount -> (total bytes, free bytes, files, free files) from _STATFS_ARGV's output."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 6 and all(p.isdigit() for p in parts[1:]):
            bsize, blocks, avail, files, ffree = (int(p) for p in parts[1:])
            out[parts[0]] = (blocks * bsize, avail * bsize, files, ffree)
    return out


class GvisorAwareBackend(DockerBackend):
    """The Docker backend, with gVisor sandboxes' limits and usage read from inside them."""

    async def create(self, spec: SandboxSpec) -> str:
        handle = await super().create(spec)
        if spec.runtime == GVISOR:
            try:
                async for _ in super().exec(handle, ExecSpec(shell="true", session=RESCUE_SESSION)):
                    pass
            except BaseException:
                await self.destroy(handle)
                raise
        return handle

    async def exec(self, handle: str, spec: ExecSpec) -> AsyncIterator[ExecEvent]:
        if await self._runtime(handle) != GVISOR:
            async for event in super().exec(handle, spec):
                yield event
            return
        stderr = b""
        async for event in super().exec(handle, spec):
            if isinstance(event, OutputChunk) and event.stream == 2:
                stderr = (stderr + event.data)[-STDERR_KEPT:]
            elif isinstance(event, ExecResult):
                try:
                    event = await self._explain(handle, event, stderr)
                except SandboxLost:
                    # It stopped while the failure was looked into.
                    lost = replace(event, outcome=ExecOutcome.SANDBOX_LOST, sandbox_gone=True)
                    event = await self._explain(handle, lost, stderr)
            yield event

    async def _explain(self, handle: str, result: ExecResult, stderr: bytes) -> ExecResult:
        if result.outcome is ExecOutcome.SANDBOX_LOST:
            if await self._containers.oom_killed(handle):
                return replace(
                    result,
                    outcome=ExecOutcome.OOM_KILLED,
                    detail="the sandbox hit its memory limit; under gVisor that stops the whole sandbox",
                    sandbox_gone=True,
                )
            return result
        if result.outcome not in (ExecOutcome.EXITED, ExecOutcome.TIMED_OUT) or (
            result.outcome is ExecOutcome.EXITED and result.exit_code == 0
        ):
            return result
        if refused_fork(stderr):
            await self._kill_all(handle)
            detail = (
                "the sandbox's process limit was reached (fork refused); every process the sandbox's "
                "commands started was killed"
            )
            return _named(result, ExecOutcome.PIDS_EXHAUSTED, detail)
        for mount, (total, free, _, _) in (await self._statfs(handle)).items():
            if total and free < _FULL_BYTES:
                where = "the workspace" if mount == WORKSPACE else mount
                return _named(result, ExecOutcome.DISK_FULL, f"{where} is full ({total} bytes)")
        root = await self._containers.root_room(handle)
        if root is not None and root.f_bavail * root.f_frsize < _FULL_ROOT_BYTES:
            total = root.f_blocks * root.f_frsize
            return _named(result, ExecOutcome.DISK_FULL, f"the root filesystem is full ({total} bytes)")
        return result

    async def _kill_all(self, handle: str) -> None:
        async for _ in super().exec(handle, ExecSpec(shell=KILL_ALL, session=RESCUE_SESSION, timeout=10)):
            pass

    async def _inside(self, handle: str, argv: tuple[str, ...]) -> str:
        """What ``argv`` prints inside the sandbox ("" when it fails)."""
        out = b""
        async for event in super().exec(handle, ExecSpec(argv=argv, timeout=10)):
            if isinstance(event, OutputChunk) and event.stream == 1:
                out += event.data
            elif isinstance(event, ExecResult) and event.outcome is ExecOutcome.SANDBOX_LOST:
                raise SandboxLost("the sandbox's container is gone")
        return out.decode(errors="replace")

    async def _statfs(self, handle: str) -> dict[str, tuple[int, int, int, int]]:
        return parse_statfs(await self._inside(handle, _STATFS_ARGV))

    async def usage(self, handle: str) -> SandboxUsage:
        if await self._runtime(handle) != GVISOR:
            return await super().usage(handle)
        if not await self._is_running(handle):
            raise SandboxLost("the sandbox's container is gone")
        pid = await self._containers.host_pid(handle)
        probe = await self._run(ContainerProbe.open, pid) if pid else None
        host = probe.usage() if probe is not None else SandboxUsage()
        statfs = await self._statfs(handle)
        total, free, files, ffree = statfs.get(WORKSPACE, (0, 0, 0, 0))
        pids = await self._inside(handle, _PIDS_ARGV)
        return SandboxUsage(
            memory_bytes=host.memory_bytes,
            memory_peak_bytes=host.memory_peak_bytes,
            # The listing's own shell and ls are not the sandbox's.
            pids=max(0, int(pids.strip() or 0) - 2),
            disk_bytes=total - free,
            disk_total_bytes=total,
            # gVisor does not limit the file count: the total is not a limit.
            files=max(0, files - ffree - 1),
            files_total=0,
            cpu_seconds=host.cpu_seconds,
        )


def _named(result: ExecResult, outcome: ExecOutcome, detail: str) -> ExecResult:
    return replace(result, outcome=outcome, detail=f"{detail}; {result.detail}" if result.detail else detail)
