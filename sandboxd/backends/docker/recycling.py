"""A Docker sandbox reset in place (sandboxd.backends.recycling), mixed into
DockerBackend: the steps of sandboxd.sandbox_reset run as engine execs of
their own (as the sandbox's user), never in the sandbox's shells. Before
the reset every shell held for the sandbox (its sessions, idle runners and
spare) is let go and closed, so no
session's cwd, environment or jobs reach the next lease; after it a fresh
spare is started, as at create, and its first command is the health check.

What the reset does not touch stays as the pool made it: the read-only
root, the user tables (read-only mounts from the inbox), the network
(the sandbox's egress link, proxy and resolver are its pool's; the
tenant's connections end with its processes). Limits are the core's to
re-apply (update_limits)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from sandboxd.backends.base import ExecOutcome, ExecResult, ExecSpec, OutputChunk
from sandboxd.backends.docker.execs import EngineExec, run_oneshot
from sandboxd.backends.docker.shells import Shells
from sandboxd.errors import TransientBackendError
from sandboxd.sandbox_reset import (
    Baseline,
    ResetReport,
    baseline_argv,
    parse_baseline,
    parse_report,
    reset_argv,
    reset_stdin,
)

# A baseline lists every path of the writable mounts: room for a large one.
_STEP_OUTPUT = 8 << 20


class DockerRecycling:
    """take_baseline and reset_in_place for DockerBackend."""

    _shells: Shells

    if TYPE_CHECKING:
        # DockerBackend's.
        async def _transport(self, handle: str, kept: tuple[str, bool] | None = None) -> EngineExec: ...

        def _spawn(self, coro: Coroutine[Any, Any, None]) -> None: ...

    async def _step(self, handle: str, argv: list[str], stdin: bytes, timeout: float, what: str) -> bytes:
        spec = ExecSpec(argv=tuple(argv), cwd="/", stdin=stdin, timeout=timeout, output_limit=_STEP_OUTPUT)
        out, result = b"", None
        # An engine exec of its own, not a command of the sandbox's shells:
        # the step kills every process but its own chain, and no shell of
        # the sandbox may be in that chain.
        async for event in run_oneshot(await self._transport(handle), spec, self._spawn):
            if isinstance(event, OutputChunk) and event.stream == 1:
                out += event.data
            elif isinstance(event, ExecResult):
                result = event
        if result is None or result.outcome is not ExecOutcome.EXITED or result.exit_code != 0:
            why = (
                "no result" if result is None else f"{result.outcome.name} {result.exit_code} {result.detail}"
            )
            raise TransientBackendError(f"the sandbox's {what} step failed: {why}")
        return out

    async def take_baseline(self, handle: str, timeout: float) -> Baseline:
        """The baseline step's answer for the sandbox (see sandboxd.sandbox_reset)."""
        out = await self._step(handle, baseline_argv(), b"", timeout, "baseline")
        try:
            return parse_baseline(out)
        except ValueError as e:
            raise TransientBackendError(f"the sandbox's baseline step answered no baseline: {e}") from e

    async def reset_in_place(self, handle: str, baseline: Baseline, timeout: float) -> ResetReport:
        """Closes the sandbox's shells, runs the reset step, starts a fresh spare."""
        shells, _ = self._shells.release(handle)
        await asyncio.gather(*(shell.close() for shell in shells), return_exceptions=True)
        out = await self._step(handle, reset_argv(), reset_stdin(baseline), timeout, "reset")
        try:
            report = parse_report(out)
        except ValueError as e:
            raise TransientBackendError(f"the sandbox's reset step answered no report: {e}") from e
        await self._shells.ready_spare(handle, await self._shells.new(handle))
        return report
