"""Exec over a backend's process stream, the same for every exec-capable
backend: persistent shell sessions and one-shot commands.

A backend supplies only an ``ExecTransport`` (sandboxd.backends.exectransport;
Docker: the engine's hijacked exec channel; Kubernetes: the API server's
exec WebSocket). What runs inside the sandbox (process-tree kill, session
markers) is sandboxd.backends.shell's; the output framing is
sandboxd.backends.execstream's.

A time-out, an output cap or a caller that goes away ends every process the
command started (``ExecTransport.kill`` of its ``Tree``), however they
detached; a session's shell survives its command's kill, keeping its cwd and
environment. A stream that ends without the command's result is checked
against the sandbox itself: a sandbox that is gone (or going) makes the
result SANDBOX_LOST, never the exit status its death gave the command.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping

from sandboxd.backends.base import WORKSPACE, ExecEvent, ExecOutcome, ExecResult, ExecSpec, OutputChunk
from sandboxd.backends.execstream import MarkerSplitter, OutputBudget, stop_detail
from sandboxd.backends.exectransport import ExecTransport, Explain, Spawn, unchanged
from sandboxd.backends.shell import (
    EXEC_TAG_VAR,
    SESSION_PRELUDE,
    SESSION_SHELL,
    SESSION_TAG_VAR,
    Tree,
    ansi_c_quote,
    oneshot_argv,
    session_command,
    session_frame,
    stdin_frames,
)
from sandboxd.errors import BackendError

# After a kill, how long a one-shot waits for its stream to end before giving up on it.
_DRAIN_AFTER_KILL = 5.0
# A session waits less: past it, the next step is to kill the shell itself.
_SESSION_DRAIN = 2.0
# Raised by a transport whose stream is gone, so the command's fate is the sandbox's.
_STREAM_ERRORS = (ConnectionError, OSError, BackendError)
# Exit statuses above this are deaths by a signal (128 + n), as a sandbox's
# death gives its processes: only those are checked against the sandbox.
_SIGNALLED = 128


async def _finish(task: asyncio.Task[None]) -> None:
    # Shielded: a caller cancelled meanwhile must not cut the kill short.
    with contextlib.suppress(TimeoutError, *_STREAM_ERRORS):
        await asyncio.wait_for(asyncio.shield(task), 10)


async def _feed(transport: ExecTransport, data: bytes) -> None:
    with contextlib.suppress(*_STREAM_ERRORS):
        await transport.write(data)
        await transport.close_stdin()


async def _kill_then_close(transport: ExecTransport, tree: Tree) -> None:
    with contextlib.suppress(*_STREAM_ERRORS):
        await transport.kill(tree)
    with contextlib.suppress(*_STREAM_ERRORS):
        await transport.close()


def _gone(duration: float) -> ExecResult:
    return ExecResult(
        ExecOutcome.SANDBOX_LOST,
        -1,
        duration,
        detail="the sandbox stopped while the command ran",
        sandbox_gone=True,
    )


async def _lost(transport: ExecTransport, started: float, alive_detail: str) -> ExecResult:
    if not await transport.alive():
        return _gone(time.monotonic() - started)
    return ExecResult(ExecOutcome.SANDBOX_LOST, -1, time.monotonic() - started, detail=alive_detail)


class OneShot:
    """One command as a process of its own on a fresh stream: start() it
    (the backend's errors pass through), then follow() it to its result."""

    def __init__(self, transport: ExecTransport, spec: ExecSpec, spawn: Spawn) -> None:
        self._transport = transport
        self._spec = spec
        self._spawn = spawn
        self._tag = secrets.token_hex(8)
        self._started = 0.0
        self._stdin = b""
        self._explain: Explain = unchanged

    async def start(self) -> None:
        """Starts the process, its tree contained so a timeout can find it all."""
        spec = self._spec
        self._explain = self._transport.watch_limits()
        argv, script = (list(spec.argv), b"") if spec.argv else oneshot_argv(spec.shell)
        self._stdin = script + spec.stdin
        self._started = time.monotonic()
        await self._transport.open(
            argv,
            env={**spec.env, EXEC_TAG_VAR: self._tag},
            cwd=spec.cwd or WORKSPACE,
            stdin=bool(self._stdin),
        )

    async def follow(self) -> AsyncIterator[ExecEvent]:
        """Output chunks as they come, then the ExecResult."""
        transport, spec = self._transport, self._spec
        tree = Tree(EXEC_TAG_VAR, self._tag)
        feeder: asyncio.Task[None] | None = None
        if self._stdin:
            feeder = asyncio.create_task(_feed(transport, self._stdin))
        budget = OutputBudget(spec.output_limit)
        deadline = self._started + spec.timeout
        stopped: ExecOutcome | None = None
        # The kill runs beside the reader: an engine finishes an exec only
        # once its output is consumed, so pausing the reader to kill would
        # deadlock.
        killer: asyncio.Task[None] | None = None
        completed = False
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    if stopped is not None:
                        break
                    stopped = ExecOutcome.TIMED_OUT
                    killer = asyncio.create_task(transport.kill(tree))
                    deadline = time.monotonic() + _DRAIN_AFTER_KILL
                    continue
                frame = await transport.read(remaining)
                if isinstance(frame, TimeoutError):
                    continue
                if frame is None:
                    break
                data = budget.take(frame[1])
                if data:
                    yield OutputChunk(frame[0], data)
                if budget.truncated and stopped is None:
                    stopped = ExecOutcome.OUTPUT_TRUNCATED
                    killer = asyncio.create_task(transport.kill(tree))
                    deadline = time.monotonic() + _DRAIN_AFTER_KILL
            completed = True
        finally:
            if feeder is not None:
                feeder.cancel()
            if not completed:
                # The caller went away (client cancelled, stream cut): the
                # command must not run on unattended, and the stream (with
                # what contains the tree) closes only after the kill.
                self._spawn(_kill_then_close(transport, tree))
        if killer is not None:
            await _finish(killer)
        await transport.close()
        duration = time.monotonic() - self._started
        if stopped is not None:
            yield self._explain(
                ExecResult(
                    stopped,
                    -1,
                    duration,
                    signal=9,
                    output_truncated=budget.truncated,
                    detail=stop_detail(stopped, spec),
                )
            )
            return
        code, failure = await transport.exit_status()
        if (code is None or code > _SIGNALLED) and not await transport.alive():
            # Killed with its sandbox, not by itself or by a limit in it.
            yield _gone(duration)
            return
        if code is None:
            yield ExecResult(
                ExecOutcome.SANDBOX_LOST, -1, duration, detail=failure or "the exec stream was cut"
            )
            return
        yield self._explain(ExecResult(ExecOutcome.EXITED, code, duration))


class SessionClosed(BackendError):
    """A command was sent to a session whose shell is gone."""

    def __init__(self) -> None:
        super().__init__("session is closed")


class _Abandoned:
    """A command whose caller went away: what finding its end takes."""

    def __init__(self, splitters: dict[int, MarkerSplitter], tree: Tree) -> None:
        self.splitters = splitters
        self.tree = tree


class ShellSession:
    """A bash kept open through one stream: one command at a time, its state
    (cwd, exported variables, functions) carried between commands."""

    def __init__(self, transport: ExecTransport, spawn: Spawn, env: Mapping[str, str] | None = None) -> None:
        self._transport = transport
        self._spawn = spawn
        self._env = dict(env or {})
        self._tag = secrets.token_hex(8)
        self._lock = asyncio.Lock()
        self._open = False
        self._abandoned: _Abandoned | None = None
        # The sandbox's clock as the last command ended (where the transport
        # wants it): the next command's processes started after it.
        self._since = ""
        self.dead = False

    async def start(self) -> None:
        """Opens the shell in the workspace (the transport's errors pass through)."""
        await self._transport.open(
            SESSION_SHELL,
            env={**self._env, SESSION_TAG_VAR: self._tag},
            cwd=WORKSPACE,
            stdin=True,
        )
        self._open = True
        try:
            # No round trip: the shell reads it before the first command.
            await self._transport.write(SESSION_PRELUDE)
        except _STREAM_ERRORS:
            self.dead = True

    @contextlib.asynccontextmanager
    async def between_commands(self) -> AsyncIterator[None]:
        """Holds the shell idle: no command runs in it (nor an abandoned
        one's recovery) until the block ends."""
        async with self._lock:
            yield

    async def close(self) -> None:
        """Closes the shell's stream; the session cannot run commands after."""
        self.dead = True
        self._open = False
        await self._transport.close()

    async def run(self, spec: ExecSpec) -> AsyncIterator[ExecEvent]:
        """Runs one command in the shell, after any in progress; yields output
        chunks, then the ExecResult. Raises SessionClosed, before any
        event, when the shell is gone."""
        await self._lock.acquire()
        try:
            # aclosing: a caller that walks away must have the command killed
            # before the next command takes the lock.
            async with contextlib.aclosing(self._run_locked(spec)) as events:
                async for event in events:
                    yield event
        finally:
            abandoned, self._abandoned = self._abandoned, None
            if abandoned is None:
                self._lock.release()
            else:
                # The lock passes to the recovery: no command starts before
                # the shell is idle again.
                self._spawn(self._recover(abandoned))

    async def _run_locked(self, spec: ExecSpec) -> AsyncGenerator[ExecEvent, None]:
        if not self._open or self.dead:
            raise SessionClosed()
        transport = self._transport
        marker = f"__SBXD_{secrets.token_hex(8)}__"
        clock = transport.clock
        tag = secrets.token_hex(8)
        command = spec.shell if spec.shell else " ".join(ansi_c_quote(a) for a in spec.argv)
        started = time.monotonic()
        explain = transport.watch_limits()
        line = session_frame(
            session_command(
                command,
                tag=tag,
                marker=marker,
                cwd=spec.cwd,
                env=dict(spec.env),
                stdin=spec.stdin,
                clock=clock,
            )
        )
        if spec.stdin:
            line += stdin_frames(spec.stdin)
        try:
            await transport.write(line)
        except _STREAM_ERRORS:
            self.dead = True
            yield await _lost(transport, started, "the session stream was cut")
            return
        budget = OutputBudget(spec.output_limit)
        splitters = {1: MarkerSplitter(marker.encode()), 2: MarkerSplitter(marker.encode())}
        command_tree = Tree(EXEC_TAG_VAR, tag, keep_root=True, since=self._since)
        deadline = started + spec.timeout
        stopped: ExecOutcome | None = None
        escalated = False
        killers: list[asyncio.Task[None]] = []
        completed = False
        try:
            while not (splitters[1].exit_code is not None and splitters[2].done):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    if stopped is None:
                        stopped = ExecOutcome.TIMED_OUT
                        killers.append(asyncio.create_task(transport.kill(command_tree)))
                        deadline = time.monotonic() + _SESSION_DRAIN
                        continue
                    if not escalated:
                        # The command is a shell builtin (e.g. an endless loop):
                        # only killing the shell stops it.
                        escalated = self.dead = True
                        killers.append(asyncio.create_task(transport.kill(self._whole())))
                        deadline = time.monotonic() + _SESSION_DRAIN
                        continue
                    break
                frame = await transport.read(remaining)
                if isinstance(frame, TimeoutError):
                    continue
                if frame is None:
                    self.dead = True
                    break
                stream, data = frame
                splitter = splitters.get(stream)
                if splitter is None or splitter.done:
                    continue
                out = budget.take(splitter.feed(data))
                if out:
                    yield OutputChunk(stream, out)
                if budget.truncated and stopped is None:
                    stopped = ExecOutcome.OUTPUT_TRUNCATED
                    killers.append(asyncio.create_task(transport.kill(command_tree)))
                    deadline = time.monotonic() + _SESSION_DRAIN
            completed = True
        finally:
            if not completed:
                # Abandoned mid-command: run() hands the lock to _recover,
                # which kills the command and waits for the shell to be idle.
                self._abandoned = _Abandoned(splitters, command_tree)
        duration = time.monotonic() - started
        for killer in killers:
            await _finish(killer)
        self._ended_at(splitters[1])
        if self.dead:
            await self.close()
        elif stopped is None:
            await transport.settle()
        if stopped is not None:
            detail = stop_detail(stopped, spec)
            if escalated:
                detail += "; the session shell was restarted (cwd and environment reset)"
            yield explain(
                ExecResult(stopped, -1, duration, signal=9, output_truncated=budget.truncated, detail=detail)
            )
            return
        if splitters[1].exit_code is None:
            yield await self._ended(started)
            return
        yield explain(ExecResult(ExecOutcome.EXITED, splitters[1].exit_code, duration))

    def _ended_at(self, stdout: MarkerSplitter) -> None:
        """Keeps the clock the shell printed after the command's status."""
        if stdout.exit_code is not None and stdout.extra:
            self._since = stdout.extra.decode(errors="replace")

    def _whole(self) -> Tree:
        """The shell and everything it runs."""
        return Tree(SESSION_TAG_VAR, self._tag)

    async def _recover(self, abandoned: _Abandoned) -> None:
        """Kills an abandoned command, then reads the rest of its output
        until the shell has printed its markers: the session goes on with
        its state. A shell that does not get there is killed (and the next
        command starts a new one). Holds the lock run() passed on."""
        transport = self._transport
        splitters = abandoned.splitters
        try:
            await transport.kill(abandoned.tree)
            deadline = time.monotonic() + _SESSION_DRAIN
            while not (splitters[1].exit_code is not None and splitters[2].done):
                remaining = deadline - time.monotonic()
                frame = await transport.read(remaining) if remaining > 0 else None
                if frame is None:
                    self.dead = True
                    break
                if isinstance(frame, TimeoutError):
                    continue
                stream, data = frame
                splitter = splitters.get(stream)
                if splitter is not None and not splitter.done:
                    splitter.feed(data)
            self._ended_at(splitters[1])
        except _STREAM_ERRORS:
            self.dead = True
        finally:
            try:
                if self.dead:
                    with contextlib.suppress(*_STREAM_ERRORS):
                        await transport.kill(self._whole())
                    with contextlib.suppress(*_STREAM_ERRORS):
                        await self.close()
            finally:
                self._lock.release()

    async def _ended(self, started: float) -> ExecResult:
        """The result of a command whose shell's stream ended before the marker."""
        code = (await self._transport.exit_status())[0]
        if not await self._transport.alive():
            # The shell died with its sandbox: not the command's doing.
            return _gone(time.monotonic() - started)
        if code is not None:
            return ExecResult(
                ExecOutcome.EXITED,
                code,
                time.monotonic() - started,
                detail="the session shell exited; the next command starts a new session",
            )
        return ExecResult(
            ExecOutcome.SANDBOX_LOST, -1, time.monotonic() - started, detail="the session stream was cut"
        )
