"""Shortcuts to a sandbox's files from the control plane's host: the optional
ports for small uploads written in place, workspaces read in place for
snapshots, and tar files handed over through a read-only inbox.

Re-exported by sandboxd.backends.base, where the port is described."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, runtime_checkable

from sandboxd.backends.hostfs import HostWorkspace


@runtime_checkable
class InPlaceWrites(Protocol):
    """Optional for a backend: it writes small uploads into a sandbox's
    workspace without a process in the sandbox, where it can."""

    async def write_in_place(self, handle: str, files: list[tuple[str, bytes, int]]) -> bool:
        """Writes (path relative to the workspace, content, mode) as the
        sandbox's user, with the result put_tar would give; False, with
        nothing written, where it cannot (then put_tar does it)."""
        ...


@runtime_checkable
class HostWorkspaces(Protocol):
    """Optional for a backend: the control plane runs on the sandboxes' host
    and may read their workspaces in place (sandboxd.backends.hostfs), so a
    snapshot needs no listing command and no tar through the engine."""

    async def host_workspace(self, handle: str) -> HostWorkspace | None:
        """The sandbox's workspace, opened (the caller closes it); None when
        this host cannot see it (read it through the sandbox instead)."""
        ...


@runtime_checkable
class StagedTars(Protocol):
    """Optional for a backend: it hands a tar file on the control plane's host
    to a sandbox without streaming it (Docker: a hard link in the sandbox's
    read-only inbox mount), so one archive restored into n sandboxes is read n
    times from the page cache instead of pushed n times through the engine."""

    def staging_dir(self) -> Path | None:
        """Where archives to hand over must be written (the inboxes'
        filesystem, so a link is free); None when this backend cannot."""
        ...

    async def stage_tar(self, handle: str, path: Path) -> str | None:
        """Makes the tar at ``path`` (inside staging_dir) readable in the
        sandbox and returns its path there, for the caller to extract in a
        shell of its choice (the session a restore sets up: no second shell);
        None when this sandbox has no inbox (stream it instead)."""
        ...

    async def unstage_tar(self, handle: str, staged: str) -> None:
        """Withdraws what stage_tar handed over (idempotent)."""
        ...
