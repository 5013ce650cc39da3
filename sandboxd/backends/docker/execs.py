"""Exec inside Docker containers: the engine's hijacked exec stream (rawapi)
as the transport of sandboxd.backends.session, and the typed outcomes the
container's cgroup counters explain (OOM kill, pids limit, file limit, full
disk).

How a stream's processes are contained, so that a kill ends all of them:

- on the engine's host (the control plane sees the container's cgroups): the
  stream starts behind GATE, is moved into a cgroup of its own (a Cell) before
  it runs anything, and a kill freezes that cgroup and SIGKILLs everything in
  it, after the environment-tag pass over the whole container;
- through a remote engine: the stream starts behind REAPER (a child
  subreaper), and a kill is TREE_KILL, run by an engine exec of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from sandboxd.backends.base import ExecEvent, ExecOutcome, ExecResult, ExecSpec
from sandboxd.backends.docker.cgroups import Cell, ContainerProbe, Counters
from sandboxd.backends.docker.keeper import RELAY_VAR, relay_argv
from sandboxd.backends.docker.pipes import READY, HostPipes
from sandboxd.backends.docker.rawapi import ExecChannel, RawEngine
from sandboxd.backends.docker.runsc_exec import RunscExec, RunscProcess
from sandboxd.backends.execstream import FirstLine, RootPidLine
from sandboxd.backends.exectransport import Explain, Frame, Spawn, unchanged
from sandboxd.backends.session import OneShot
from sandboxd.backends.shell import Tree, gate_argv, reaper_argv, tree_kill_argv
from sandboxd.errors import BackendError, TransientBackendError

IsRunning = Callable[[str], Awaitable[bool]]
"""Whether the container with this id runs (True when the engine cannot tell)."""

log = logging.getLogger(__name__)


class Channel(Protocol):
    """A started process's stdio: the engine's exec stream, or FIFOs (pipes)."""

    async def next_frame(self, timeout: float) -> tuple[int, bytes] | TimeoutError | None: ...

    async def read_frame(self) -> tuple[int, bytes] | None: ...

    async def write(self, data: bytes) -> None: ...

    def close_stdin(self) -> None: ...

    async def close(self) -> None: ...


# Longest a gated stream may take to print its pid (a process start).
_GATE_TIMEOUT = 30.0
# Longest an exec of the control plane's own (a kill, a liveness check) may
# take: under gVisor the stream of one whose container is removed meanwhile
# may never end.
_QUIET_EXEC_TIMEOUT = 10.0
# Pauses (seconds) before asking the engine again whether a container whose
# exec would not start still runs: it reports a container's death late.
_ENGINE_CATCH_UP = (0.05, 0.1, 0.2, 0.4, 0.8)
# Pauses (seconds) while the engine has not yet recorded the exit of a piped
# shell whose FIFOs have already closed.
_PIPE_EXIT_CATCH_UP = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.4, 0.8)


class _PrintedEarly(Exception):
    """Output came after the pid line before the process was let go: not a
    stream GATE or REAPER started."""


async def _pid_line(channel: Channel) -> tuple[bytes | None, bytes]:
    """The first stdout line GATE or REAPER prints (None if the stream ended
    before it), and the tail of what stderr said until then."""
    first, said = FirstLine(), b""
    async with asyncio.timeout(_GATE_TIMEOUT):
        while first.value is None:
            frame = await channel.read_frame()
            if frame is None:
                return None, said
            if frame[0] == 2:
                said = (said + frame[1])[-4096:]
            elif first.feed(frame[1]):
                raise _PrintedEarly
    return first.value, said


def _explain(probe: ContainerProbe, before: Counters, result: ExecResult) -> ExecResult:
    """Names the limit behind a failed or timed-out command, if one was hit."""
    timed_out = result.outcome is ExecOutcome.TIMED_OUT
    if result.outcome is not ExecOutcome.EXITED and not timed_out:
        return result
    if result.outcome is ExecOutcome.EXITED and result.exit_code == 0:
        return result
    reason = probe.classify(before, result.exit_code, timed_out)
    if reason is None:
        return result
    outcome, detail = reason
    return replace(result, outcome=outcome, detail=f"{detail}; {result.detail}" if result.detail else detail)


class EngineExec:
    """One engine exec in one container (an ExecTransport): its hijacked
    stream, and the container's host view (cgroup probe) for containing and
    killing its processes and for naming the limits a command hit."""

    def __init__(
        self,
        engine: RawEngine,
        container: str,
        *,
        user: str,
        probe: ContainerProbe | None,
        is_running: IsRunning,
        executor: Executor,
        kill_user: str = "",
        pipes: tuple[Path, str] | None = None,
        pipes_refused: Callable[[], None] = lambda: None,
        runsc: RunscExec | None = None,
        kept: tuple[str, bool] | None = None,
    ) -> None:
        """``executor`` runs the host-side freezes and kills, which block on
        /proc and /sys; ``kill_user`` is who TREE_KILL runs as without the
        host ("": the container's user); ``pipes`` is the sandbox's inbox (the
        host's directory, where the sandbox sees it), for a shell's stdio on
        FIFOs (sandboxd.backends.docker.pipes), and ``pipes_refused`` is
        called when the sandbox could not open them (or, with ``runsc``, a
        gVisor sandbox's way to start a shell on the host's pipes, when that
        failed: sandboxd.backends.docker.runsc_exec); ``kept`` (a key, and
        whether to attach to the shell that runs under it already) has a
        sandbox without the host's view start the stream's process through
        its keeper, where a live snapshot carries it
        (sandboxd.backends.docker.keeper)."""
        self._engine = engine
        self._container = container
        self._user = user
        self._probe = probe
        self._is_running = is_running
        self._executor = executor
        self._kill_user = kill_user
        self._pipes = pipes
        self._pipes_refused = pipes_refused
        self._runsc = runsc
        self._runsc_proc: RunscProcess | None = None
        self._kept = kept
        self._piped = False
        self._channel: Channel | None = None
        self._exec_id = ""
        self._cell: Cell | None = None
        self._root_host = 0
        # Without the host: the root's pid comes as the first line of stdout.
        self._pid_line: RootPidLine | None = None
        self._root = 0
        self._released = False

    @property
    def clock(self) -> bool:
        """TREE_KILL needs the clock at a session command's start; a cell does not."""
        return self._cell is None

    async def open(self, argv: Sequence[str], *, env: Mapping[str, str], cwd: str, stdin: bool) -> None:
        """Creates and starts the exec as the sandbox user, contained (see
        the module docstring) before the command runs."""
        cell = self._probe.cell() if self._probe is not None else None
        if (
            cell is None
            and stdin
            and self._runsc is not None
            and await self._open_runsc(argv, env=env, cwd=cwd)
        ):
            return
        if cell is not None and stdin and self._pipes is not None:
            if await self._open_piped(argv, env=env, cwd=cwd, cell=cell):
                return
            cell = self._probe.cell() if self._probe is not None else None
        if cell is not None:
            argv = gate_argv(list(argv))
        else:
            argv, env = self._rooted(argv, env, cwd)
            self._pid_line = RootPidLine()
        try:
            self._exec_id = await self._engine.exec_create(
                self._container, list(argv), stdin=stdin or cell is not None, env=dict(env), workdir=cwd,
                user=self._user,
            )  # fmt: skip
            self._channel = await self._engine.exec_start(self._exec_id, self._container)
            if cell is not None:
                await self._enter(cell, stdin)
        except BaseException:
            if cell is not None and self._cell is None:
                await self._blocking(cell.release)
            raise

    async def _open_piped(self, argv: Sequence[str], *, env: Mapping[str, str], cwd: str, cell: Cell) -> bool:
        """open() with the shell's stdio on FIFOs; False (nothing left behind)
        where the sandbox could not open them, so the caller uses the engine
        stream instead."""
        assert self._pipes is not None
        host_dir, inside = self._pipes
        pipes = HostPipes(host_dir, inside)
        try:
            await self._blocking(pipes.make)
        except OSError as e:
            log.warning("session pipes unavailable in %s (%s): using the engine stream", host_dir, e)
            self._pipes = None
            await self._blocking(cell.release)
            return False
        engine: ExecChannel | None = None
        try:
            self._exec_id = await self._engine.exec_create(
                self._container, gate_argv(pipes.argv(list(argv))), stdin=True, env=dict(env), workdir=cwd,
                user=self._user,
            )  # fmt: skip
            engine = await self._engine.exec_start(self._exec_id, self._container)
            self._channel = engine
            await self._enter(cell, stdin=False)
            said = await self._redirected(engine)
            if said != READY + b"\n":
                log.warning(
                    "session pipes refused in %s (%r): using the engine stream", self._container, said[:200]
                )
                self._pipes = None
                self._pipes_refused()
                self._channel = None
                if self._cell is not None:
                    await self._blocking(self._cell.kill)  # whatever of it still runs
                await self._release_cell()
                await self._blocking(pipes.close)
                return False
            self._channel = pipes.channel()
            self._piped = True
            await self._blocking(pipes.unlink)
        except BaseException:
            channel, self._channel = self._channel, None
            if self._piped and channel is not None:
                await channel.close()
            self._piped = False
            pipes.close()
            await self._release_cell()
            # Never entered, or released above: a second release is a no-op.
            await self._blocking(cell.release)
            raise
        finally:
            if engine is not None:
                await engine.close()
        return True

    async def _open_runsc(self, argv: Sequence[str], *, env: Mapping[str, str], cwd: str) -> bool:
        """open() by ``runsc exec`` on the host's pipes; False (nothing left
        behind) where it could not start the process, so the caller uses the
        engine stream instead. REAPER's pid line says it started."""
        assert self._runsc is not None
        argv, env = self._rooted(argv, env, cwd)
        try:
            proc = await self._runsc.start(argv, env=env, cwd=cwd, user=self._user)
        except OSError as e:
            return await self._runsc_failed(None, str(e))
        try:
            value, said = await _pid_line(proc.channel)
        except _PrintedEarly:
            return await self._runsc_failed(proc, "output before the pid line")
        except BaseException:
            await proc.close()
            raise
        if value is None:
            return await self._runsc_failed(proc, said.decode(errors="replace"))
        if not value.isdigit():
            return await self._runsc_failed(proc, value.decode(errors="replace"))
        self._root = int(value)
        self._runsc_proc, self._channel = proc, proc.channel
        if said:
            # REAPER writes nothing before its pid: this is runsc's own say.
            log.debug("runsc exec in %s wrote before its pid: %r", self._container, said[:200])
        return True

    def _rooted(
        self, argv: Sequence[str], env: Mapping[str, str], cwd: str
    ) -> tuple[list[str], Mapping[str, str]]:
        """The stream's command line where its root prints its pid: REAPER,
        or a relay to a kept shell (which prints the shell's)."""
        if self._kept is None:
            return reaper_argv(list(argv)), env
        key, attach = self._kept
        relay = relay_argv(key, argv, in_place=reaper_argv(list(argv)), env=env, cwd=cwd, attach=attach)
        return relay, {**env, RELAY_VAR: "1"}

    async def _runsc_failed(self, proc: RunscProcess | None, why: str) -> bool:
        log.warning("runsc exec unavailable in %s (%s): using the engine stream", self._container, why[:300])
        self._runsc = None
        self._pipes_refused()
        if proc is not None:
            await proc.close()
        return False

    async def _redirected(self, engine: ExecChannel) -> bytes:
        """What the engine stream says after the gate: READY once the shell's
        stdio is on the FIFOs, else why it failed (to the stream's end). The
        engine keeps the stream open while the process lives, whatever it
        did with its descriptors, so READY is awaited, not the end."""
        said = b""
        async with asyncio.timeout(_GATE_TIMEOUT):
            while (frame := await engine.read_frame()) is not None:
                said += frame[1]
                if (frame[0] == 1 and said.startswith(READY + b"\n")) or len(said) > 4096:
                    break
        return said

    async def _release_cell(self) -> None:
        cell, self._cell = self._cell, None
        if cell is not None:
            with contextlib.suppress(OSError):
                await self._blocking(cell.release)

    async def _enter(self, cell: Cell, stdin: bool) -> None:
        """Reads GATE's pid, moves the process into ``cell``, lets it go on."""
        assert self._channel is not None and self._probe is not None
        try:
            value, _ = await _pid_line(self._channel)
        except _PrintedEarly:
            raise TransientBackendError("the exec printed before it started") from None
        if value is None:
            raise TransientBackendError("the exec ended before it started")
        if not value.isdigit():
            # The engine's own complaint (the runtime could not start it).
            raise TransientBackendError(f"the exec did not start: {value.decode(errors='replace')}")
        self._root = int(value)
        pid = self._probe.host_pid(self._root)
        if pid is not None and cell.enter(pid):
            self._cell, self._root_host = cell, pid
        else:
            # Not contained: TREE_KILL finds what it starts by tag and parentage.
            await self._blocking(cell.release)
        await self._channel.write(b"\n")
        if not stdin:
            self._channel.close_stdin()

    def _stream(self) -> Channel:
        if self._channel is None:
            raise ConnectionError("the exec stream is closed")
        return self._channel

    async def write(self, data: bytes) -> None:
        """Sends bytes to the exec's stdin."""
        await self._stream().write(data)

    async def close_stdin(self) -> None:
        """Half-closes the exec's socket."""
        self._stream().close_stdin()

    async def read(self, timeout: float) -> Frame | TimeoutError | None:
        """The next demultiplexed frame (see ExecChannel.next_frame), the
        root's pid line taken off stdout when REAPER runs it."""
        if self._pid_line is None:
            return await self._stream().next_frame(timeout)
        return await self._pid_line.read(self._stream().next_frame, timeout)

    async def exit_status(self) -> tuple[int | None, str]:
        """The exec's exit code as the engine reports it (None while it runs).
        A shell on FIFOs ends its stream the moment it dies, before the
        engine has heard of it: the engine gets a moment to catch up."""
        if self._runsc_proc is not None:
            return await self._runsc_proc.exit_code(), ""
        for delay in (*(_PIPE_EXIT_CATCH_UP if self._piped else ()), None):
            try:
                info = await self._engine.exec_inspect(self._exec_id)
            except BackendError:
                return None, ""
            code = info.get("ExitCode")
            if code is not None and not info.get("Running"):
                return int(str(code)), ""
            if delay is not None:
                await asyncio.sleep(delay)
        return None, ""

    async def kill(self, tree: Tree) -> None:
        """From the host when it sees the container (works even when the
        sandbox cannot fork): the tag pass over the container, then the
        stream's cell. Without a cell, TREE_KILL by an exec of its own."""
        probe, cell = self._probe, self._cell
        if probe is not None:
            spare = self._root_host if tree.keep_root else 0

            def from_host() -> None:
                probe.kill_tagged(tree.pattern.encode(), freeze=cell is None)
                if cell is not None:
                    cell.kill(spare)

            await self._blocking(from_host)
        if cell is None:
            root = self._pid_line.pid if self._pid_line is not None else self._root
            await self._exec_quietly(tree_kill_argv(tree, root), self._kill_user)

    async def settle(self) -> None:
        """After a command in the stream's shell ended by itself: moves what
        it left running out of the cell, so the next command's kill spares it."""
        cell = self._cell
        if cell is not None and cell.others(self._root_host):
            await self._blocking(cell.settle, self._root_host)

    async def alive(self) -> bool:
        """Whether the container runs. The host sees its init process exit
        at once; the engine notices later, so without the host a new exec
        must start in it too. One that does not start means the container is
        on its way out (or cannot take one more process): the engine gets a
        moment to say which."""
        if self._probe is not None:
            return self._probe.running()
        if not await self._is_running(self._container):
            return False
        if await self._exec_quietly(["true"], self._user) == 0:
            return True
        for delay in _ENGINE_CATCH_UP:
            await asyncio.sleep(delay)
            if not await self._is_running(self._container):
                return False
        return True

    async def _exec_quietly(self, argv: list[str], user: str) -> int:
        """Runs ``argv`` by an exec of its own to its end: 0 if it exited 0,
        1 if it did not start or failed, -1 if the engine did not answer."""
        try:
            async with asyncio.timeout(_QUIET_EXEC_TIMEOUT):
                exec_id = await self._engine.exec_create(
                    self._container, argv, stdin=False, env={}, workdir="/", user=user
                )
                channel = await self._engine.exec_start(exec_id, self._container)
                try:
                    while await channel.read_frame() is not None:
                        pass
                finally:
                    await channel.close()
                info = await self._engine.exec_inspect(exec_id)
        except (TransientBackendError, TimeoutError):
            return -1
        except BackendError:
            # The container may be gone, which ends its processes anyway.
            return 1
        return 0 if info.get("ExitCode") == 0 else 1

    def watch_limits(self) -> Explain:
        """Reads the cgroup counters now, to compare when the command ends."""
        if self._probe is None:
            return unchanged
        return functools.partial(_explain, self._probe, self._probe.counters())

    async def close(self) -> None:
        """Closes the stream and gives the cell back (what is left in it
        moves to the container's cgroup); the exec id stays for exit_status."""
        if self._channel is not None:
            channel, self._channel = self._channel, None
            await channel.close()
        if self._runsc_proc is not None:
            await self._runsc_proc.close()
        if self._cell is not None and not self._released:
            self._released = True
            with contextlib.suppress(OSError):
                await self._blocking(self._cell.release)

    async def _blocking(self, fn: Callable[..., object], *args: object) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, functools.partial(fn, *args))


async def run_oneshot(transport: EngineExec, spec: ExecSpec, spawn: Spawn) -> AsyncIterator[ExecEvent]:
    """Runs ``spec`` as an engine exec of its own; the engine's errors
    (NotFound, SandboxLost, TransientBackendError) pass through."""
    command = OneShot(transport, spec, spawn)
    await command.start()
    async for event in command.follow():
        yield event
