"""The backend's part of recycling a sandbox: a baseline taken before any
tenant runs, and a reset in place against it (sandboxd.sandbox_reset holds
the steps and the verdict; sandboxd.core.pools.recycle decides when)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol, runtime_checkable

from sandboxd.backends.base import ExecEvent, ExecSpec
from sandboxd.backends.exectransport import stdout_once_exited
from sandboxd.errors import TransientBackendError
from sandboxd.sandbox_reset import Baseline, ResetReport, parse_baseline, parse_report


@runtime_checkable
class InPlaceReset(Protocol):
    """A backend that can reset a used sandbox in place instead of destroying it."""

    async def take_baseline(self, handle: str, timeout: float) -> Baseline:
        """The sandbox as it is now (before any tenant ran). BackendError when
        the step fails or runs past ``timeout`` seconds."""
        ...

    async def reset_in_place(self, handle: str, baseline: Baseline, timeout: float) -> ResetReport:
        """Ends the sandbox's shells and sessions, kills every process but
        its own, removes every path of its writable mounts that ``baseline``
        does not list and every IPC object of its user, reports what it
        found, and leaves a fresh spare shell (its health check) in place.
        BackendError when the step fails or runs past ``timeout`` seconds;
        the caller destroys the sandbox then."""
        ...


# A baseline lists every path of the writable mounts: room for a large one.
_STEP_OUTPUT = 8 << 20


def step_spec(argv: list[str], stdin: bytes, timeout: float) -> ExecSpec:
    """The one-shot command of a reset step (sandboxd.sandbox_reset), run as
    the sandbox's user from ``/``."""
    return ExecSpec(argv=tuple(argv), cwd="/", stdin=stdin, timeout=timeout, output_limit=_STEP_OUTPUT)


async def step_output(events: AsyncIterator[ExecEvent], what: str) -> bytes:
    """A step's stdout once it exited 0; TransientBackendError naming ``what`` otherwise."""
    return await stdout_once_exited(events, f"the sandbox's {what} step failed", TransientBackendError)


def baseline_of(out: bytes) -> Baseline:
    """The baseline step's answer; TransientBackendError when it is none."""
    try:
        return parse_baseline(out)
    except ValueError as e:
        raise TransientBackendError(f"the sandbox's baseline step answered no baseline: {e}") from e


def report_of(out: bytes) -> ResetReport:
    """The reset step's answer; TransientBackendError when it is none."""
    try:
        return parse_report(out)
    except ValueError as e:
        raise TransientBackendError(f"the sandbox's reset step answered no report: {e}") from e
