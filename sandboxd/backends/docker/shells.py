"""The shells the Docker backend holds in its sandboxes: each sandbox's spare
(started with it: its health check), its named sessions, and the idle shells
that fork one-shot commands.

In a gVisor sandbox started for live snapshots every one of them is kept by
the sandbox's keeper (sandboxd.backends.docker.keeper), so a live snapshot
carries it: a named session's under its name, by which a restored sandbox's
session attaches to its own shell; a checkpoint holds them all between
commands. Other sandboxes (runc, and gVisor ones without the keeper) hold
plain shells, started straight by the engine or ``runsc exec``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

from sandboxd.backends.base import ExecOutcome, ExecResult, ExecSpec
from sandboxd.backends.docker.execs import EngineExec
from sandboxd.backends.docker.keeper import FIRST_KEY, session_key
from sandboxd.backends.exectransport import Spawn
from sandboxd.backends.gvisor_pids import RESCUE_SESSION
from sandboxd.backends.session import ShellSession
from sandboxd.errors import BackendError, FailedPrecondition, TransientBackendError

log = logging.getLogger(__name__)

Transport = Callable[[str, tuple[str, bool] | None], Awaitable[EngineExec]]
"""A fresh exec stream into a sandbox (see EngineExec's ``kept``)."""

Kept = Callable[[str], Awaitable[bool]]
"""Whether a sandbox's shells are kept by its keeper."""

_IDLE_RUNNERS = 4
# What starting a shell or a command in it raises when the sandbox will not have it.
_SHELL_ERRORS = (BackendError, ConnectionError, OSError)
# How long a live checkpoint waits for the commands running in the sandbox's
# shells to end (it is taken between commands).
_QUIET_WAIT_SECONDS = 60.0


class Shells:
    """The shells of every sandbox of one backend, by the sandbox's handle."""

    def __init__(self, transport: Transport, kept: Kept, spawn: Spawn) -> None:
        self._transport = transport
        self._kept_by = kept
        self._spawn = spawn
        self._sessions: dict[str, dict[str, ShellSession]] = {}
        self._spare: dict[str, ShellSession] = {}
        self._session_locks: dict[str, asyncio.Lock] = {}
        self._runners: dict[str, list[ShellSession]] = {}
        # Every shell held per sandbox with a keeper (sessions, idle and
        # busy runners, the spare): a checkpoint waits for them to be idle.
        self._kept: dict[str, weakref.WeakSet[ShellSession]] = {}
        # Named sessions whose kept shells came with a restored image, not
        # yet attached to.
        self._attachable: dict[str, set[str]] = {}

    async def new(
        self,
        handle: str,
        name: str = "",
        env: Mapping[str, str] | None = None,
        attach: bool = False,
        first: bool = False,
    ) -> ShellSession:
        """A shell for session ``name`` ("": an idle shell or the spare),
        not started; in a sandbox with a keeper a kept one: ``attach``
        finds the one of that name a restored image holds, ``first`` the one
        the keeper started with the sandbox."""
        if not await self._kept_by(handle):
            return ShellSession(await self._transport(handle, None), self._spawn, env)
        key = session_key(name) if name else FIRST_KEY if first else "r-" + secrets.token_hex(8)
        shell = ShellSession(await self._transport(handle, (key, attach or first)), self._spawn, env)
        self._kept.setdefault(handle, weakref.WeakSet()).add(shell)
        return shell

    async def ready_spare(self, handle: str, session: ShellSession) -> None:
        """Starts the spare shell, which doubles as the health check: a
        sandbox is READY only once a command has run in it."""
        await session.start()
        async for event in session.run(ExecSpec(shell="true", timeout=30)):
            if isinstance(event, ExecResult) and (
                event.outcome is not ExecOutcome.EXITED or event.exit_code != 0
            ):
                raise TransientBackendError(f"health check failed: {event.detail or event.outcome.name}")
        self._spare[handle] = session

    async def take_runner(self, handle: str) -> ShellSession:
        """An idle shell to fork a one-shot command in (give it back after)."""
        idle = self._runners.setdefault(handle, [])
        while idle:
            runner = idle.pop()
            if not runner.dead:
                return runner
        spare = self._spare.pop(handle, None)
        if spare is not None and not spare.dead:
            return spare
        runner = await self.new(handle)
        await runner.start()
        return runner

    async def give_runner(self, handle: str, runner: ShellSession) -> None:
        idle = self._runners.get(handle)
        if idle is not None and not runner.dead and len(idle) < _IDLE_RUNNERS:
            idle.append(runner)
        else:
            await runner.close()

    async def session(self, handle: str, name: str) -> ShellSession:
        """Session ``name``'s shell, started (or attached to) on first use."""
        async with self._session_locks.setdefault(handle, asyncio.Lock()):
            sessions = self._sessions.setdefault(handle, {})
            session = sessions.get(name)
            if session is not None and not session.dead:
                return session
            # A kept shell is found after a restore by its session's name:
            # the spare has none. The rescue session (started with a gVisor
            # sandbox) leaves the spare to the first command, as with the keeper.
            takes_spare = name != RESCUE_SESSION and not await self._kept_by(handle)
            spare = self._spare.pop(handle, None) if takes_spare else None
            if spare is not None and not spare.dead:
                session = spare
            else:
                restored = self._attachable.get(handle, set())
                session = None
                if name in restored:
                    restored.discard(name)
                    session = await self._attached(handle, name)
                if session is None:
                    session = await self.new(handle, name)
                    await session.start()
            sessions[name] = session
            return session

    async def _attached(self, handle: str, name: str) -> ShellSession | None:
        """Session ``name``'s own shell in a restored sandbox, once it has
        answered: what it wrote while no stream read it (its jobs' output)
        is taken in, and where its last command ended (a command's kill
        spares the jobs started before it). None if it did not answer (a
        new shell replaces it)."""
        session = await self.new(handle, name, attach=True)
        failed = "it did not start"
        with contextlib.suppress(*_SHELL_ERRORS):
            await session.start()
            async for event in session.run(ExecSpec(shell="true", timeout=30)):
                if isinstance(event, ExecResult):
                    failed = f"{event.outcome.name} {event.exit_code} {event.detail}"
                    if event.outcome is ExecOutcome.EXITED and event.exit_code == 0:
                        failed = ""
        if not failed:
            return session
        log.warning(
            "restored session %s in %s did not answer (%s): a new shell replaces it", name, handle, failed
        )
        await session.close()
        return None

    def restored(self, handle: str, names: set[str]) -> None:
        """The sessions whose shells a restored image holds: each attaches
        to its own on first use."""
        self._attachable[handle] = names

    def release(self, handle: str) -> tuple[list[ShellSession], bool]:
        """Forgets every shell of the sandbox and hands them over (to
        close), with whether they are kept ones: those are best closed once
        the sandbox is gone, as a kept shell's relay would first wait for
        its shell to exit."""
        shells = list(self._sessions.pop(handle, {}).values()) + self._runners.pop(handle, [])
        spare = self._spare.pop(handle, None)
        if spare is not None:
            shells.append(spare)
        self._session_locks.pop(handle, None)
        self._attachable.pop(handle, None)
        return shells, self._kept.pop(handle, None) is not None

    @contextlib.asynccontextmanager
    async def between_commands(self, handle: str) -> AsyncIterator[None]:
        """Holds every shell of the sandbox idle, and no new session starts,
        until the block ends; FailedPrecondition when a command runs on for
        over _QUIET_WAIT_SECONDS."""
        async with contextlib.AsyncExitStack() as quiet:
            try:
                async with asyncio.timeout(_QUIET_WAIT_SECONDS):
                    await quiet.enter_async_context(self._session_locks.setdefault(handle, asyncio.Lock()))
                    for shell in list(self._kept.get(handle, ())):
                        await quiet.enter_async_context(shell.between_commands())
            except TimeoutError:
                raise FailedPrecondition(
                    f"a command has run in the sandbox for over {_QUIET_WAIT_SECONDS:.0f} s: a live snapshot "
                    "is taken between commands; try again when it has ended"
                ) from None
            yield

    async def close(self) -> None:
        """Closes every shell of every sandbox."""
        for handle in list({*self._sessions, *self._spare, *self._runners}):
            for shell in self.release(handle)[0]:
                await shell.close()
        self._kept.clear()
