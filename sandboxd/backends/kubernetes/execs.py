"""Exec in sandbox Pods: one-shot commands and persistent shell sessions,
over the API server's exec stream (wsexec). The protocol inside the sandbox
(tagged process trees, session markers) is sandboxd.backends.shell's, the
same as the Docker backend's; this module only differs in transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from sandboxd.backends.base import WORKSPACE, ExecEvent, ExecOutcome, ExecResult, ExecSpec, OutputChunk
from sandboxd.backends.execstream import MarkerSplitter, OutputBudget, stop_detail
from sandboxd.backends.kubernetes.client import KubeClient, KubeError, unavailable, unreachable
from sandboxd.backends.kubernetes.wsexec import ExecStream, wrap_argv
from sandboxd.backends.shell import EXEC_TAG_VAR, SESSION_TAG_VAR, ansi_c_quote, kill_argv, session_command

_DRAIN_AFTER_KILL = 5.0


@dataclass
class PodTarget:
    client: KubeClient
    namespace: str
    pod: str
    container: str
    is_alive: Callable[[], Awaitable[bool]]
    spawn: Callable[[Coroutine[Any, Any, None]], None]

    async def open(
        self, argv: list[str], *, stdin: bool, cwd: str = WORKSPACE, env: dict[str, str] | None = None
    ) -> ExecStream:
        return await ExecStream.open(
            self.client,
            self.namespace,
            self.pod,
            self.container,
            wrap_argv(argv, cwd, env or {}),
            stdin=stdin,
        )

    async def kill(self, var: str, tag: str) -> None:
        """Kills every process whose environment carries ``var=tag``."""
        try:
            stream = await ExecStream.open(
                self.client, self.namespace, self.pod, self.container, kill_argv(var, tag), stdin=False
            )
        except KubeError:
            return  # the Pod may be gone, which kills the tree anyway
        try:
            while not isinstance(await stream.next_frame(10.0), TimeoutError | None):
                pass
        finally:
            await stream.close()


async def _finish(task: asyncio.Task[None]) -> None:
    with contextlib.suppress(TimeoutError, KubeError):
        await asyncio.wait_for(task, 10)


async def run_oneshot(target: PodTarget, spec: ExecSpec) -> AsyncIterator[ExecEvent]:
    tag = secrets.token_hex(8)
    argv = list(spec.argv) if spec.argv else ["bash", "-c", spec.shell]
    started = time.monotonic()
    try:
        stream = await target.open(
            argv, stdin=bool(spec.stdin), cwd=spec.cwd or WORKSPACE, env={**spec.env, EXEC_TAG_VAR: tag}
        )
    except KubeError as e:
        alive = await target.is_alive()
        if alive and unreachable(e):
            # Not an outcome of the command (it never started): the caller
            # gets UNAVAILABLE, and the sandbox and its lease are kept.
            raise unavailable(e, "the command did not start") from e
        yield ExecResult(ExecOutcome.SANDBOX_LOST, -1, 0.0, detail=str(e), sandbox_gone=not alive)
        return
    feeder: asyncio.Task[None] | None = None
    if spec.stdin:
        feeder = asyncio.create_task(_feed(stream, spec.stdin))
    budget = OutputBudget(spec.output_limit)
    deadline = started + spec.timeout
    stopped: ExecOutcome | None = None
    killer: asyncio.Task[None] | None = None
    completed = False
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if stopped is not None:
                    break
                stopped = ExecOutcome.TIMED_OUT
                killer = asyncio.create_task(target.kill(EXEC_TAG_VAR, tag))
                deadline = time.monotonic() + _DRAIN_AFTER_KILL
                continue
            frame = await stream.next_frame(remaining)
            if isinstance(frame, TimeoutError):
                continue
            if frame is None:
                break
            data = budget.take(frame[1])
            if data:
                yield OutputChunk(frame[0], data)
            if budget.truncated and stopped is None:
                stopped = ExecOutcome.OUTPUT_TRUNCATED
                killer = asyncio.create_task(target.kill(EXEC_TAG_VAR, tag))
                deadline = time.monotonic() + _DRAIN_AFTER_KILL
        completed = True
    finally:
        if feeder is not None:
            feeder.cancel()
        if not completed and killer is None:
            target.spawn(target.kill(EXEC_TAG_VAR, tag))
        await stream.close()
        if killer is not None:
            await _finish(killer)
    duration = time.monotonic() - started
    if stopped is not None:
        yield ExecResult(
            stopped,
            -1,
            duration,
            signal=9,
            output_truncated=budget.truncated,
            detail=stop_detail(stopped, spec),
        )
        return
    code = stream.exit_code
    if code is None:
        alive = await target.is_alive()
        detail = stream.failure or ("the exec stream was cut" if alive else "the sandbox stopped")
        yield ExecResult(ExecOutcome.SANDBOX_LOST, -1, duration, detail=detail, sandbox_gone=not alive)
        return
    yield ExecResult(ExecOutcome.EXITED, code, duration)


async def _feed(stream: ExecStream, data: bytes) -> None:
    with contextlib.suppress(ConnectionError, OSError, KubeError):
        await stream.write(data)
        await stream.close_stdin()


class ShellSession:
    """A bash kept open through one exec stream; cwd, exports and functions
    persist between commands (the protocol of sandboxd.backends.shell)."""

    def __init__(self, target: PodTarget, env: dict[str, str]) -> None:
        self._target = target
        self._env = env
        self._tag = secrets.token_hex(8)
        self._lock = asyncio.Lock()
        self._stream: ExecStream | None = None
        self.dead = False

    async def start(self) -> None:
        self._stream = await self._target.open(
            ["bash", "--noprofile", "--norc"], stdin=True, env={**self._env, SESSION_TAG_VAR: self._tag}
        )

    async def close(self) -> None:
        self.dead = True
        if self._stream is not None:
            await self._stream.close()
            self._stream = None

    async def run(self, spec: ExecSpec) -> AsyncIterator[ExecEvent]:
        async with self._lock:
            async for event in self._run_locked(spec):
                yield event

    async def _run_locked(self, spec: ExecSpec) -> AsyncIterator[ExecEvent]:
        stream = self._stream
        if stream is None or self.dead:
            raise KubeError(0, "", "session is closed")
        marker = f"__SBXD_{secrets.token_hex(8)}__"
        tag = secrets.token_hex(8)
        command = spec.shell if spec.shell else " ".join(ansi_c_quote(a) for a in spec.argv)
        started = time.monotonic()
        line = session_command(
            command, tag=tag, marker=marker, cwd=spec.cwd, env=dict(spec.env), stdin=spec.stdin
        )
        try:
            await stream.write(line)
        except (ConnectionError, OSError, KubeError):
            self.dead = True
            yield await self._lost(started)
            return
        budget = OutputBudget(spec.output_limit)
        splitters = {1: MarkerSplitter(marker.encode()), 2: MarkerSplitter(marker.encode())}
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
                        escalated = self.dead = True
                        killers.append(asyncio.create_task(self._target.kill(SESSION_TAG_VAR, self._tag)))
                        deadline = time.monotonic() + 2.0
                        continue
                    break
                frame = await stream.next_frame(remaining)
                if isinstance(frame, TimeoutError):
                    continue
                if frame is None:
                    self.dead = True
                    break
                splitter = splitters.get(frame[0])
                if splitter is None or splitter.done:
                    continue
                out = budget.take(splitter.feed(frame[1]))
                if out:
                    yield OutputChunk(frame[0], out)
                if budget.truncated and stopped is None:
                    stopped = ExecOutcome.OUTPUT_TRUNCATED
                    killers.append(asyncio.create_task(self._target.kill(EXEC_TAG_VAR, tag)))
                    deadline = time.monotonic() + 2.0
            completed = True
        finally:
            if not completed:
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
            yield ExecResult(
                stopped, -1, duration, signal=9, output_truncated=budget.truncated, detail=detail
            )
            return
        if splitters[1].exit_code is None:
            yield await self._lost(started)
            return
        yield ExecResult(ExecOutcome.EXITED, splitters[1].exit_code, duration)

    async def _lost(self, started: float) -> ExecResult:
        alive = await self._target.is_alive()
        detail = "the session stream was cut" if alive else "the sandbox stopped"
        return ExecResult(
            ExecOutcome.SANDBOX_LOST, -1, time.monotonic() - started, detail=detail, sandbox_gone=not alive
        )
