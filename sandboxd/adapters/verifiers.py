"""A verifiers-style runtime: one sandbox per rollout, created with labels,
commands run by sandbox id, rewards computed from sandbox state before the
sandbox is deleted. Methods that share a name with the Prime SDK's
(``execute_command``, ``upload_file``, ``upload_bytes``, ``download_file``,
``read_file``) take the same arguments with the same meanings: notably
``upload_file``'s third argument is a *local path*, as there. Code that uses
the SDK itself can point it at ``sandboxd prime-api`` instead
(sandboxd.adapters.prime)."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from pathlib import Path

from sandboxd import errors
from sandboxd.client import AsyncClient, Lease
from sandboxd.client.releasing import release_lease

__all__ = ["CommandResult", "CommandTimeoutError", "FileContent", "SandboxdRuntime"]


@dataclass(frozen=True)
class CommandResult:
    """A finished command's decoded output and exit code, with sandboxd's typed ``outcome``."""

    stdout: str
    stderr: str
    exit_code: int
    outcome: str


@dataclass(frozen=True)
class FileContent:
    """A file's text and byte size (the SDK's ReadFileResponse fields)."""

    content: str
    size: int


class CommandTimeoutError(RuntimeError):
    """The command ran past ``timeout`` (its process tree was killed), as the SDK raises."""

    def __init__(self, sandbox_id: str, command: str, timeout: float) -> None:
        super().__init__(f"Command '{command}' timed out after {timeout:g}s in sandbox {sandbox_id}")


class SandboxdRuntime:
    """One leased sandbox per rollout, addressed by sandbox id."""

    def __init__(self, client: AsyncClient, pool: str, *, lease_ttl: float = 3600.0) -> None:
        self._client = client
        self._pool = pool
        self._lease_ttl = lease_ttl
        self._leases: dict[str, Lease] = {}

    async def create_sandbox(self, labels: dict[str, str] | None = None, timeout: float = 300.0) -> str:
        """Leases one sandbox from the pool and returns its id; its lease is held until delete_sandbox."""
        lease = await self._client.lease(
            self._pool, labels=labels, lease_ttl=self._lease_ttl, timeout=timeout
        )
        sandbox_id = lease.sandboxes[0].id
        self._leases[sandbox_id] = lease
        return sandbox_id

    async def execute_command(
        self,
        sandbox_id: str,
        command: str,
        working_dir: str | None = None,
        env: dict[str, str] | None = None,
        timeout: float | None = None,
        user: str | None = None,
    ) -> CommandResult:
        """Runs ``command`` in bash; raises CommandTimeoutError past ``timeout``."""
        r = await self._client.exec(
            sandbox_id,
            command,
            cwd=working_dir or "",
            env=env or {},
            timeout=timeout or 0.0,
            user=user or "",
        )
        if r.outcome == "TIMED_OUT":
            raise CommandTimeoutError(sandbox_id, command, r.duration if timeout is None else timeout)
        return CommandResult(
            r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace"), r.exit_code, r.outcome
        )

    async def upload_file(self, sandbox_id: str, file_path: str, local_file_path: str) -> None:
        """Copies the local file ``local_file_path`` to ``file_path`` in the sandbox."""
        data = await asyncio.to_thread(Path(local_file_path).read_bytes)
        await self._client.write_files(sandbox_id, {file_path: data})

    async def upload_bytes(
        self, sandbox_id: str, file_path: str, file_bytes: bytes, filename: str = ""
    ) -> None:
        """Writes ``file_bytes`` to ``file_path`` (``filename`` is the SDK's form name, unused)."""
        await self._client.write_files(sandbox_id, {file_path: file_bytes})

    async def download_file(self, sandbox_id: str, file_path: str, local_file_path: str) -> None:
        """Copies ``file_path`` out of the sandbox to the local ``local_file_path``."""
        data = (await self._client.read_files(sandbox_id, [file_path]))[file_path]
        local = Path(local_file_path)
        await asyncio.to_thread(local.parent.mkdir, parents=True, exist_ok=True)
        await asyncio.to_thread(local.write_bytes, data)

    async def read_file(self, sandbox_id: str, file_path: str) -> FileContent:
        """The file's text (undecodable bytes replaced) and its size in bytes."""
        data = (await self._client.read_files(sandbox_id, [file_path]))[file_path]
        return FileContent(data.decode(errors="replace"), len(data))

    async def heartbeat(self, sandbox_id: str) -> None:
        """Extends the sandbox's lease by its own TTL; KeyError for an id this runtime did not create."""
        await self._client.heartbeat(self._leases[sandbox_id].id)

    async def delete_sandbox(self, sandbox_id: str) -> None:
        """Releases the sandbox's lease; a no-op for an id already deleted or never created here.
        The lease stays this runtime's until the server confirms its release
        (a failed release raises, and close() tries it again)."""
        lease = self._leases.get(sandbox_id)
        if lease is None:
            return
        with contextlib.suppress(errors.NotFound):
            await self._client.release(lease.id)
        self._leases.pop(sandbox_id, None)

    async def close(self) -> None:
        """Releases every sandbox this runtime still holds (the client stays open),
        each release retried while the server cannot answer it; one that still
        fails is logged and does not stop the others."""

        async def release(sandbox_id: str, lease: Lease) -> None:
            if await release_lease(lease.release, lease.id, "verifiers runtime"):
                self._leases.pop(sandbox_id, None)

        await asyncio.gather(*(release(sid, lease) for sid, lease in list(self._leases.items())))
