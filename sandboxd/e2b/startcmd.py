"""A built template's start and ready commands (``set_start_cmd`` /
``set_ready_cmd``): E2B starts the start command while it builds and keeps
it running in the sandbox's snapshot; sandboxd's images hold no running
processes, so each sandbox of the template starts it as a background
process (listed by ``commands.list``, as in E2B) and create answers once
the ready command exits 0."""

from __future__ import annotations

import asyncio
import contextlib
import time

from sandboxd import errors
from sandboxd.e2b.catalog import Build
from sandboxd.e2b.processes import NO_LIMIT, exec_user, start_process
from sandboxd.e2b.registry import Box

__all__ = ["StartFailed", "start_command"]

READY_TRY_S = 10.0
"""How long one try of the ready command may run."""
READY_EVERY_S = 0.2


class StartFailed(Exception):
    """The start command ended, or the ready command never passed in time."""


async def start_command(box: Box, build: Build, deadline_s: float) -> None:
    """Starts ``build``'s start command in ``box`` as the template's user;
    waits until its ready command exits 0 (at most ``deadline_s``)."""
    message = {"process": {"cmd": "/bin/sh", "args": ["-c", build.start_cmd], "cwd": build.workdir}}
    proc = start_process(box, message, build.user or "user", NO_LIMIT)
    if not build.ready_cmd:
        return
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            result = await box.client.exec(
                box.sandbox_id,
                ["/bin/sh", "-c", build.ready_cmd],
                user=exec_user(build.user or "user"),
                timeout=READY_TRY_S,
            )
        except errors.SandboxdError as e:
            raise StartFailed(f"the ready command could not run: {e}") from e
        if result.outcome == "EXITED" and result.exit_code == 0:
            return
        if proc.done.is_set():
            raise StartFailed("the start command ended before the ready command passed")
        if time.monotonic() >= deadline:
            raise StartFailed(f"the ready command did not pass within {deadline_s:.0f}s")
        # The next try after a pause, sooner if the start command ends.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.done.wait(), READY_EVERY_S)
