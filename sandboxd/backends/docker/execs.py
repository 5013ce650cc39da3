"""Exec inside Docker containers: one-shot processes and persistent shells.

Both run through the engine's hijacked exec stream (rawapi). Timeouts and
output caps kill the whole process tree by environment tag (see
sandboxd.backends.shell), so background children die too.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, replace
from typing import Any

from sandboxd.backends.base import (
    WORKSPACE,
    ExecEvent,
    ExecOutcome,
    ExecResult,
    ExecSpec,
    OutputChunk,
)
from sandboxd.backends.docker.cgroups import ContainerProbe, Counters
from sandboxd.backends.docker.rawapi import ExecChannel, RawEngine
from sandboxd.backends.execstream import MarkerSplitter, OutputBudget, stop_detail
from sandboxd.backends.shell import (
    EXEC_TAG_VAR,
    SESSION_TAG_VAR,
    ansi_c_quote,
    kill_argv,
    session_command,
)
from sandboxd.errors import BackendError

# After a kill, how long we wait for the stream to end before giving up on it.
_DRAIN_AFTER_KILL = 5.0

IsAlive = Callable[[], Awaitable[bool]]
Killer = Callable[[str, str], Coroutine[Any, Any, None]]


@dataclass
class Target:
    """The container an exec runs in, and how to reach into it."""

    engine: RawEngine
    container: str
    user: str
    is_alive: IsAlive
    kill: Killer
    """Kills every process whose environment has ``VAR=tag``: (VAR, tag)."""
    spawn: Callable[[Coroutine[Any, Any, None]], None]
    """Runs cleanup that must outlive a cancelled exec (owned by the backend)."""
    probe: ContainerProbe | None = None


def _explain(target: Target, before: Counters | None, result: ExecResult) -> ExecResult:
    """Names the limit behind a failed or timed-out command, if one was hit."""
    if target.probe is None or before is None:
        return result
    timed_out = result.outcome is ExecOutcome.TIMED_OUT
    if result.outcome is not ExecOutcome.EXITED and not timed_out:
        return result
    if result.outcome is ExecOutcome.EXITED and result.exit_code == 0:
        return result
    reason = target.probe.classify(before, result.exit_code, timed_out)
    if reason is None:
        return result
    outcome, detail = reason
    return replace(result, outcome=outcome, detail=f"{detail}; {result.detail}" if result.detail else detail)


async def kill_tree(engine: RawEngine, container: str, tag_var: str, tag: str) -> None:
    try:
        exec_id = await engine.exec_create(
            container, kill_argv(tag_var, tag), stdin=False, env={}, workdir="/", user=""
        )
        channel = await engine.exec_start(exec_id)
        while await channel.read_frame() is not None:
            pass
        await channel.close()
    except BackendError:
        # The container may be gone, which kills the tree anyway.
        pass


async def run_oneshot(target: Target, spec: ExecSpec) -> AsyncIterator[ExecEvent]:
    engine, container, user, is_alive = target.engine, target.container, target.user, target.is_alive
    before = target.probe.counters() if target.probe else None
    tag = secrets.token_hex(8)
    argv = list(spec.argv) if spec.argv else ["bash", "-c", spec.shell]
    env = {**spec.env, EXEC_TAG_VAR: tag}
    started = time.monotonic()
    exec_id = await engine.exec_create(
        container, argv, stdin=bool(spec.stdin), env=env, workdir=spec.cwd or WORKSPACE, user=user
    )
    channel = await engine.exec_start(exec_id)
    feeder: asyncio.Task[None] | None = None
    if spec.stdin:
        feeder = asyncio.create_task(_feed(channel, spec.stdin))
    budget = OutputBudget(spec.output_limit)
    deadline = started + spec.timeout
    stopped: ExecOutcome | None = None
    # The kill runs beside the reader: the engine finishes an exec only once
    # its output is consumed, so pausing the reader to kill would deadlock.
    killer: asyncio.Task[None] | None = None
    completed = False
    try:
        while True:
            remaining = deadline - time.monotonic()
            if stopped is None and remaining <= 0:
                stopped = ExecOutcome.TIMED_OUT
                killer = asyncio.create_task(target.kill(EXEC_TAG_VAR, tag))
                deadline = time.monotonic() + _DRAIN_AFTER_KILL
                continue
            if stopped is not None and remaining <= 0:
                break
            frame = await channel.next_frame(remaining)
            if isinstance(frame, TimeoutError):
                continue
            if frame is None:
                break
            stream, data = frame
            data = budget.take(data)
            if data:
                yield OutputChunk(stream, data)
            if budget.truncated and stopped is None:
                stopped = ExecOutcome.OUTPUT_TRUNCATED
                killer = asyncio.create_task(target.kill(EXEC_TAG_VAR, tag))
                deadline = time.monotonic() + _DRAIN_AFTER_KILL
        completed = True
    finally:
        if feeder is not None:
            feeder.cancel()
        if not completed and killer is None:
            # The caller went away (client cancelled, stream cut): the command
            # must not run on unattended.
            target.spawn(target.kill(EXEC_TAG_VAR, tag))
        await channel.close()
        if killer is not None:
            await _finish(killer)
    duration = time.monotonic() - started
    info = await _inspect_quietly(engine, exec_id)
    exit_code = info.get("ExitCode")
    if stopped is not None:
        yield _explain(
            target,
            before,
            ExecResult(
                stopped,
                -1,
                duration,
                signal=9,
                output_truncated=budget.truncated,
                detail=stop_detail(stopped, spec),
            ),
        )
        return
    if exit_code is None or info.get("Running"):
        if not await is_alive():
            yield ExecResult(
                ExecOutcome.SANDBOX_LOST, -1, duration, detail="the sandbox stopped", sandbox_gone=True
            )
            return
        yield ExecResult(ExecOutcome.SANDBOX_LOST, -1, duration, detail="the exec stream was cut")
        return
    yield _explain(target, before, ExecResult(ExecOutcome.EXITED, int(str(exit_code)), duration))


async def _finish(task: asyncio.Task[None]) -> None:
    with contextlib.suppress(TimeoutError, BackendError):
        await asyncio.wait_for(task, 10)


async def _feed(channel: ExecChannel, data: bytes) -> None:
    try:
        await channel.write(data)
        channel.close_stdin()
    except (ConnectionError, OSError):
        pass


async def _inspect_quietly(engine: RawEngine, exec_id: str) -> dict[str, object]:
    try:
        return await engine.exec_inspect(exec_id)
    except BackendError:
        return {}


class ShellSession:
    """A bash kept open through an exec stream: one command at a time, state
    (cwd, exported variables, functions) carried between commands."""

    def __init__(self, target: Target, env: dict[str, str]) -> None:
        self._target = target
        self._engine = target.engine
        self._container = target.container
        self._user = target.user
        self._env = env
        self._tag = secrets.token_hex(8)
        self._lock = asyncio.Lock()
        self._channel: ExecChannel | None = None
        self._exec_id = ""
        self.dead = False

    async def start(self) -> None:
        env = {**self._env, SESSION_TAG_VAR: self._tag}
        self._exec_id = await self._engine.exec_create(
            self._container,
            ["bash", "--noprofile", "--norc"],
            stdin=True,
            env=env,
            workdir=WORKSPACE,
            user=self._user,
        )
        self._channel = await self._engine.exec_start(self._exec_id)

    async def close(self) -> None:
        self.dead = True
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    async def run(self, spec: ExecSpec) -> AsyncIterator[ExecEvent]:
        async with self._lock:
            async for event in self._run_locked(spec, self._target.is_alive):
                yield event

    async def _run_locked(self, spec: ExecSpec, is_alive: IsAlive) -> AsyncIterator[ExecEvent]:
        if self._channel is None or self.dead:
            raise BackendError("session is closed")
        channel = self._channel
        marker = f"__SBXD_{secrets.token_hex(8)}__".encode()
        tag = secrets.token_hex(8)
        command = spec.shell if spec.shell else " ".join(ansi_c_quote(a) for a in spec.argv)
        started = time.monotonic()
        before = self._target.probe.counters() if self._target.probe else None
        try:
            await channel.write(
                session_command(
                    command,
                    tag=tag,
                    marker=marker.decode(),
                    cwd=spec.cwd,
                    env=dict(spec.env),
                    stdin=spec.stdin,
                )
            )
        except (ConnectionError, OSError):
            self.dead = True
            yield await self._lost(started, is_alive)
            return
        budget = OutputBudget(spec.output_limit)
        splitters = {1: MarkerSplitter(marker), 2: MarkerSplitter(marker)}
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
                        killers.append(asyncio.create_task(self._target.kill(EXEC_TAG_VAR, tag)))
                        deadline = time.monotonic() + 2.0
                        continue
                    if not escalated:
                        # The command is a shell builtin (e.g. an endless loop):
                        # only killing the shell stops it.
                        escalated = True
                        self.dead = True
                        killers.append(asyncio.create_task(self._target.kill(SESSION_TAG_VAR, self._tag)))
                        deadline = time.monotonic() + 2.0
                        continue
                    break
                frame = await channel.next_frame(remaining)
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
                    killers.append(asyncio.create_task(self._target.kill(EXEC_TAG_VAR, tag)))
                    deadline = time.monotonic() + 2.0
            completed = True
        finally:
            if not completed:
                # Abandoned mid-command: the shell's state is unknown, so the
                # session (and everything it runs) goes.
                self.dead = True
                self._target.spawn(self._target.kill(SESSION_TAG_VAR, self._tag))
        duration = time.monotonic() - started
        for killer in killers:
            await _finish(killer)
        if self.dead:
            await self.close()
        if stopped is not None:
            detail = stop_detail(stopped, spec)
            if escalated:
                detail += "; the session shell was restarted (cwd and environment reset)"
            yield _explain(
                self._target,
                before,
                ExecResult(stopped, -1, duration, signal=9, output_truncated=budget.truncated, detail=detail),
            )
            return
        if splitters[1].exit_code is None:
            yield await self._ended(started, is_alive)
            return
        yield _explain(self._target, before, ExecResult(ExecOutcome.EXITED, splitters[1].exit_code, duration))

    async def _ended(self, started: float, is_alive: IsAlive) -> ExecResult:
        info = await _inspect_quietly(self._engine, self._exec_id)
        code = info.get("ExitCode")
        if isinstance(code, int) and await is_alive():
            return ExecResult(
                ExecOutcome.EXITED,
                code,
                time.monotonic() - started,
                detail="the session shell exited; the next command starts a new session",
            )
        return await self._lost(started, is_alive)

    async def _lost(self, started: float, is_alive: IsAlive) -> ExecResult:
        alive = await is_alive()
        detail = "the session stream was cut" if alive else "the sandbox stopped"
        return ExecResult(
            ExecOutcome.SANDBOX_LOST, -1, time.monotonic() - started, detail=detail, sandbox_gone=not alive
        )
