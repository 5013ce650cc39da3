"""A Docker sandbox reset in place (sandboxd.backends.recycling), mixed into
DockerBackend: the steps of sandboxd.sandbox_reset run as engine execs of
their own (as the sandbox's user), never in the sandbox's shells. Before
the reset every shell held for the sandbox (its sessions, idle runners and
spare) is let go and closed, so no session's cwd, environment or jobs reach
the next lease; after it a fresh spare is started, as at create, and its
first command is the health check.

What the reset does not touch stays as the pool made it: the read-only
root, the user tables (read-only mounts from the inbox), the network
(the sandbox's egress link, proxy and resolver are its pool's; the
tenant's connections end with its processes). Limits are the core's to
re-apply (update_limits)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from sandboxd.backends.docker.execs import EngineExec, run_oneshot
from sandboxd.backends.docker.shells import Shells
from sandboxd.backends.recycling import baseline_of, report_of, step_output, step_spec
from sandboxd.sandbox_reset import Baseline, ResetReport, baseline_argv, reset_argv, reset_stdin


class DockerRecycling:
    """take_baseline and reset_in_place for DockerBackend."""

    _shells: Shells

    if TYPE_CHECKING:
        # DockerBackend's.
        async def _transport(self, handle: str, kept: tuple[str, bool] | None = None) -> EngineExec: ...

        def _spawn(self, coro: Coroutine[Any, Any, None]) -> None: ...

    async def _step(self, handle: str, argv: list[str], stdin: bytes, timeout: float, what: str) -> bytes:
        # An engine exec of its own, not a command of the sandbox's shells:
        # the step kills every process but its own chain, and no shell of
        # the sandbox may be in that chain.
        spec = step_spec(argv, stdin, timeout)
        return await step_output(run_oneshot(await self._transport(handle), spec, self._spawn), what)

    async def take_baseline(self, handle: str, timeout: float) -> Baseline:
        """The baseline step's answer for the sandbox (see sandboxd.sandbox_reset)."""
        return baseline_of(await self._step(handle, baseline_argv(), b"", timeout, "baseline"))

    async def reset_in_place(self, handle: str, baseline: Baseline, timeout: float) -> ResetReport:
        """Closes the sandbox's shells, runs the reset step, starts a fresh spare."""
        shells, _ = self._shells.release(handle)
        await asyncio.gather(*(shell.close() for shell in shells), return_exceptions=True)
        report = report_of(await self._step(handle, reset_argv(), reset_stdin(baseline), timeout, "reset"))
        await self._shells.ready_spare(handle, await self._shells.new(handle))
        return report
