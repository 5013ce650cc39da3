"""Live checkpoints of running sandboxes: the optional ``LiveCheckpoints`` port
(pause, resume, checkpoint, restore) and the keeper FIFO a checkpointable
sandbox starts carried processes through.

Re-exported by sandboxd.backends.base, where the port is described."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, runtime_checkable

KEEP_VAR = "SANDBOXD_KEEP"
"""Environment variable naming, inside a sandbox that can be checkpointed, the
FIFO its keeper reads: each line written there is started as a process of the
sandbox's init tree, which a live snapshot carries (engine execs it does not)."""


@runtime_checkable
class LiveCheckpoints(Protocol):
    """Optional for a backend: it pauses, checkpoints and restores whole
    running sandboxes of some runtimes (Docker with gVisor: memory, the
    processes of the container's init tree, its tmpfs mounts)."""

    def live_refusal(self, runtime: str) -> str:
        """Why sandboxes of ``runtime`` cannot be paused or checkpointed here
        ("" when they can), as a sentence naming the runtime or the engine."""
        ...

    async def pause(self, handle: str) -> None:
        """Freezes every process of the sandbox (idempotent)."""
        ...

    async def resume(self, handle: str) -> None:
        """Thaws a paused sandbox (idempotent)."""
        ...

    async def not_carried(self, handle: str) -> list[str]:
        """The sandbox's processes a checkpoint taken now would not carry
        (started by engine execs of their own, not in a shell its keeper
        started), each as "args (pid N)"; the backend's own plumbing is left
        out."""
        ...

    async def checkpoint(self, handle: str, dest: Path) -> None:
        """Writes the running sandbox's checkpoint image (its files) into the
        new directory ``dest`` on the control plane's host, between commands
        (FailedPrecondition when one runs on too long); the sandbox keeps
        running."""
        ...

    async def restore_checkpoint(self, handle: str, image: Path) -> None:
        """Replaces what runs in the sandbox by the checkpoint image in
        directory ``image``: its processes continue there, its sessions'
        shells among them (each attached to again by its session's next
        command); its engine execs are gone. The sandbox keeps its own
        container (limits, mounts, name)."""
        ...
