"""A Kubernetes sandbox reset in place (sandboxd.backends.recycling), mixed
into KubernetesBackend: the same steps as on Docker (sandboxd.sandbox_reset)
run as one-shot execs in the sandbox's Pod, so a recycled sandbox costs no
Pod delete and create; the pool still replaces the Pod after ``max_uses``
leases or when anything is in doubt. Before the reset the named sessions
are closed (no cwd, environment or jobs carry over); a gVisor sandbox gets
its rescue session again after it (gvisor_pids), before any command runs."""

from __future__ import annotations

import contextlib
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from sandboxd.backends.kubernetes.execs import PodExec, run_oneshot
from sandboxd.backends.recycling import baseline_of, report_of, step_output, step_spec
from sandboxd.backends.session import ShellSession
from sandboxd.sandbox_reset import Baseline, ResetReport, baseline_argv, reset_argv, reset_stdin


class KubeRecycling:
    """take_baseline and reset_in_place for KubernetesBackend."""

    _sessions: dict[str, dict[str, ShellSession]]

    if TYPE_CHECKING:
        # KubernetesBackend's.
        def _transport(self, handle: str) -> PodExec: ...

        def _spawn(self, coro: Coroutine[Any, Any, None]) -> None: ...

        def _gvisor(self, handle: str) -> bool: ...

        async def _rescue(self, handle: str) -> ShellSession: ...

    async def _step(self, handle: str, argv: list[str], stdin: bytes, timeout: float, what: str) -> bytes:
        spec = step_spec(argv, stdin, timeout)
        return await step_output(run_oneshot(self._transport(handle), spec, self._spawn), what)

    async def take_baseline(self, handle: str, timeout: float) -> Baseline:
        """The baseline step's answer for the sandbox's Pod (see sandboxd.sandbox_reset)."""
        return baseline_of(await self._step(handle, baseline_argv(), b"", timeout, "baseline"))

    async def reset_in_place(self, handle: str, baseline: Baseline, timeout: float) -> ResetReport:
        """Closes the sandbox's sessions, runs the reset step in its Pod, starts
        a gVisor sandbox's rescue session again."""
        for session in self._sessions.pop(handle, {}).values():
            with contextlib.suppress(Exception):
                await session.close()
        report = report_of(await self._step(handle, reset_argv(), reset_stdin(baseline), timeout, "reset"))
        if self._gvisor(handle):
            await self._rescue(handle)
        return report
