"""Live checkpoints of Docker sandboxes (the LiveCheckpoints port), mixed
into DockerBackend: pause and resume, the processes a checkpoint would not
carry, checkpoint between commands, and restore, after which the sandbox's
shells are started again. The engine's side is checkpoints.py; how
processes survive a restore is keeper.py."""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import AsyncIterator, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandboxd.backends.base import ExecEvent, ExecSpec
from sandboxd.backends.docker.checkpoints import NOT_CARRIED_SCRIPT, Checkpoints, parse_not_carried
from sandboxd.backends.docker.execs import EngineExec, run_oneshot
from sandboxd.backends.docker.keeper import AFTER_RESTORE, parse_session_keys
from sandboxd.backends.docker.shells import Shells
from sandboxd.backends.exectransport import stdout_once_exited
from sandboxd.errors import BackendError, FailedPrecondition, TransientBackendError


class DockerLiveCheckpoints:
    """live_refusal, pause, resume, not_carried, checkpoint and
    restore_checkpoint for DockerBackend."""

    _checkpoints: Checkpoints
    _shells: Shells
    _paused: set[str]
    """Paused containers: thawed before removal (the engine cannot remove a paused runsc one)."""

    if TYPE_CHECKING:
        # DockerBackend's.
        def exec(self, handle: str, spec: ExecSpec) -> AsyncIterator[ExecEvent]: ...

        async def _kept(self, handle: str) -> bool: ...

        async def _transport(self, handle: str, kept: tuple[str, bool] | None = None) -> EngineExec: ...

        def _spawn(self, coro: Coroutine[Any, Any, None]) -> None: ...

    def live_refusal(self, runtime: str) -> str:
        return self._checkpoints.refusal(runtime)

    async def pause(self, handle: str) -> None:
        # Marked first: a listing meanwhile must not take it for a pause of
        # a control plane gone (and thaw it).
        self._paused.add(handle)
        try:
            await self._checkpoints.pause(handle)
        except BaseException:
            self._paused.discard(handle)
            raise

    async def resume(self, handle: str) -> None:
        await self._checkpoints.resume(handle)
        self._paused.discard(handle)

    async def not_carried(self, handle: str) -> builtins.list[str]:
        events = self.exec(handle, ExecSpec(shell=NOT_CARRIED_SCRIPT, timeout=30))
        out = (
            await stdout_once_exited(events, "listing the sandbox's processes failed", BackendError)
        ).decode(errors="replace")
        return parse_not_carried(out)

    async def checkpoint(self, handle: str, dest: Path) -> None:
        if not await self._kept(handle):
            raise FailedPrecondition(
                "the sandbox runs without the keeper (its pool has live_snapshots off): a checkpoint would "
                "lose every shell and what runs in it; use a pool with live_snapshots on"
            )
        # Between commands: a command's input or output in flight would be
        # half in the image, and its caller would be answered by the
        # original only.
        async with self._shells.between_commands(handle):
            await self._checkpoints.checkpoint(handle, dest)

    async def restore_checkpoint(self, handle: str, image: Path) -> None:
        if not await self._kept(handle):
            raise FailedPrecondition(
                "the target sandbox runs without the keeper (its pool has live_snapshots off); restore into "
                "a pool with live_snapshots on"
            )
        # The restore replaces every process the sandbox runs: the shells
        # held for it end with them (closed after, see destroy).
        shells, _ = self._shells.release(handle)
        try:
            await self._checkpoints.restore(handle, image)
        finally:
            await asyncio.gather(*(shell.close() for shell in shells))
        self._shells.restored(handle, await self._after_restore(handle))
        await self._shells.ready_spare(handle, await self._shells.new(handle))

    async def _after_restore(self, handle: str) -> set[str]:
        """Ends the image's idle shells; the names of its sessions' shells."""
        events = run_oneshot(
            await self._transport(handle), ExecSpec(shell=AFTER_RESTORE, timeout=30), self._spawn
        )
        return parse_session_keys(
            (
                await stdout_once_exited(events, "the restored sandbox did not answer", TransientBackendError)
            ).decode(errors="replace")
        )
