"""Files into and out of a Docker sandbox: tar streams and staged archives.

put_tar and get_tar run the shared tar scripts (sandboxd.backends.shell) in
the sandbox. A small upload (the usual agent turn) is extracted by a shell
the sandbox already runs, without an engine exec; a larger one, and every
download, gets an engine exec of its own (rawapi). A large archive for a
restore or fork is staged instead: hard-linked into the sandbox's inbox
(containers.py) and extracted by the sandbox itself, so n sandboxes read it
from the page cache instead of having it pushed n times through the engine.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import os
import secrets
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from sandboxd.backends.base import WORKSPACE, ExecEvent, ExecOutcome, ExecResult, ExecSpec
from sandboxd.backends.docker.containers import Containers
from sandboxd.backends.docker.containerspec import INBOX
from sandboxd.backends.docker.rawapi import RawEngine
from sandboxd.backends.extract import put_refusal, put_tar_argv
from sandboxd.backends.shell import LINK_EXIT, get_tar_argv, link_refusal
from sandboxd.errors import (
    BackendError,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    SandboxLost,
    TransientBackendError,
)

Exec = Callable[[str, ExecSpec], AsyncIterator[ExecEvent]]
"""The backend's exec: runs a command in the sandbox with this handle."""


def _raise_for_put(code: int, dest: str, message: str) -> None:
    """Exit codes of the PUT_TAR script, as sandboxd errors."""
    if (refusal := put_refusal(code, dest, message)) is not None:
        raise refusal


class ContainerFiles:
    """Tar in, tar out and archive staging for the sandboxes of one engine."""

    def __init__(
        self,
        raw: RawEngine,
        containers: Containers,
        *,
        user: str,
        inbox_dir: Path | None,
        exec_in: Exec,
        shell_stdin_max: int,
    ) -> None:
        """``exec_in`` runs the small uploads, which go through a sandbox
        shell when they fit its stdin (``shell_stdin_max`` bytes)."""
        self._raw = raw
        self._containers = containers
        self._user = user
        self._inbox_dir = inbox_dir
        self._exec = exec_in
        self._shell_stdin_max = shell_stdin_max

    async def put_tar(self, handle: str, dest: str, chunks: AsyncIterator[bytes]) -> None:
        """Extracts the tar stream at ``dest`` in the workspace, as the sandbox user."""
        head = bytearray()
        stream = aiter(chunks)
        async for chunk in stream:
            head += chunk
            if len(head) > self._shell_stdin_max:
                break
        else:
            # Small (the usual agent turn): extracted by a forked shell, no engine exec.
            await self._put_by_shell(handle, dest, put_tar_argv(dest), bytes(head))
            return

        async def rest() -> AsyncIterator[bytes]:
            yield bytes(head)
            async for chunk in stream:
                yield chunk

        await self.put_tar_by_exec(handle, dest, rest())

    async def _put_by_shell(self, handle: str, dest: str, argv: builtins.list[str], data: bytes) -> None:
        """Runs an extraction through a forked sandbox shell (no engine exec)."""
        spec = ExecSpec(argv=tuple(argv), stdin=data, timeout=300, output_limit=65536)
        stderr = bytearray()
        result: ExecResult | None = None
        async for event in self._exec(handle, spec):
            if isinstance(event, ExecResult):
                result = event
            elif event.stream == 2:
                stderr += event.data
        assert result is not None
        message = stderr.decode(errors="replace").strip()
        if result.outcome is ExecOutcome.SANDBOX_LOST:
            raise SandboxLost(f"upload failed: {result.detail}")
        if result.outcome in (ExecOutcome.DISK_FULL, ExecOutcome.FILE_LIMIT):
            raise ResourceExhausted(f"workspace is full (bytes or files): {message}")
        if result.outcome is not ExecOutcome.EXITED:
            raise TransientBackendError(f"upload did not finish: {result.detail or result.outcome.name}")
        _raise_for_put(result.exit_code, dest, message)

    async def put_tar_by_exec(
        self, handle: str, dest: str, chunks: AsyncIterator[bytes], engine_user: str = ""
    ) -> None:
        """put_tar through an engine exec of its own, as ``engine_user``
        (the engine's name for it; empty: the sandbox user)."""
        exec_id = await self._raw.exec_create(
            handle,
            put_tar_argv(dest),
            stdin=True,
            env={},
            workdir=WORKSPACE,
            user=engine_user or self._user,
        )
        channel = await self._raw.exec_start(exec_id, handle)
        stderr = bytearray()

        async def drain() -> None:
            while (frame := await channel.read_frame()) is not None:
                if frame[0] == 2 and len(stderr) < 8192:
                    stderr.extend(frame[1])

        reader = asyncio.create_task(drain())
        try:
            async for chunk in chunks:
                await channel.write(chunk)
            channel.close_stdin()
            await reader
        except (ConnectionError, OSError) as e:
            raise SandboxLost(f"upload stream cut: {e}") from e
        finally:
            reader.cancel()
            await channel.close()
        info = await self._raw.exec_inspect(exec_id)
        code = info.get("ExitCode")
        _raise_for_put(code if isinstance(code, int) else -1, dest, stderr.decode(errors="replace").strip())

    async def get_tar(
        self, handle: str, base: str, paths: tuple[str, ...], engine_user: str = ""
    ) -> AsyncIterator[bytes]:
        """A tar stream of ``paths`` under ``base``, read by an engine exec
        as ``engine_user`` (empty: the sandbox user); NotFound names a
        missing path."""
        exec_id = await self._raw.exec_create(
            handle,
            get_tar_argv(base, paths),
            stdin=False,
            env={},
            workdir=WORKSPACE,
            user=engine_user or self._user,
        )
        channel = await self._raw.exec_start(exec_id, handle)
        stderr = bytearray()
        try:
            while (frame := await channel.read_frame()) is not None:
                stream, data = frame
                if stream == 1:
                    yield data
                elif len(stderr) < 8192:
                    stderr.extend(data)
        finally:
            await channel.close()
        info = await self._raw.exec_inspect(exec_id)
        code = info.get("ExitCode")
        message = stderr.decode(errors="replace").strip()
        if code == 3:
            missing = message.split("missing:", 1)[-1].splitlines()[0] if "missing:" in message else base
            raise NotFound(f"no such file or directory in the sandbox: {missing}")
        if code == LINK_EXIT:
            raise InvalidArgument("path", f"refused to read under {base}: {link_refusal(message)}")
        if code != 0:
            raise BackendError(f"reading files failed: {message or f'exit {code}'}")

    # -- Staging (the StagedTars port) ---------------------------------------

    def staging_dir(self) -> Path | None:
        """Where archives to stage are written; None without inboxes."""
        root = self._inbox_dir
        # Beside the inboxes: same filesystem, so handing a file over is a link.
        return None if root is None else root.with_name(root.name + "-staged")

    async def stage_tar(self, handle: str, path: Path) -> str | None:
        """Links the archive at ``path`` into the sandbox's inbox; returns
        its path inside the sandbox, or None (then stream it)."""
        inbox = await self._containers.find_inbox(handle)
        if inbox is None:
            return None
        name = secrets.token_hex(8) + ".tar"
        try:
            await self._containers.run(os.link, path, inbox / name)
        except OSError:
            return None  # an inbox gone missing or on another filesystem: stream it
        return f"{INBOX}/{name}"

    async def unstage_tar(self, handle: str, staged: str) -> None:
        """Unlinks an archive stage_tar put in the inbox; anything else is left alone."""
        inbox = self._containers.known_inbox(handle)
        name = staged.rsplit("/", 1)[-1]
        if inbox is None or not staged.startswith(INBOX + "/") or "/" in name or not name.endswith(".tar"):
            return
        with contextlib.suppress(OSError):
            await self._containers.run(os.unlink, inbox / name)
