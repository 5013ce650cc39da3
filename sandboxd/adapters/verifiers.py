"""A verifiers-style runtime: one sandbox per rollout, created with labels,
commands run by sandbox id, rewards computed from sandbox state before the
sandbox is deleted."""

from __future__ import annotations

from dataclasses import dataclass

from sandboxd.client import AsyncClient, Lease


@dataclass(frozen=True)
class CommandResult:
    stdout: str
    stderr: str
    exit_code: int
    outcome: str


class SandboxdRuntime:
    def __init__(self, client: AsyncClient, pool: str, *, lease_ttl: float = 3600.0) -> None:
        self._client = client
        self._pool = pool
        self._lease_ttl = lease_ttl
        self._leases: dict[str, Lease] = {}

    async def create_sandbox(self, labels: dict[str, str] | None = None, timeout: float = 300.0) -> str:
        lease = await self._client.lease(
            self._pool, labels=labels, lease_ttl=self._lease_ttl, timeout=timeout
        )
        sandbox_id = lease.sandboxes[0].id
        self._leases[sandbox_id] = lease
        return sandbox_id

    async def execute_command(
        self, sandbox_id: str, command: str, working_dir: str | None = None, timeout: float | None = None
    ) -> CommandResult:
        r = await self._client.exec(sandbox_id, command, cwd=working_dir or "", timeout=timeout or 0.0)
        return CommandResult(
            r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace"), r.exit_code, r.outcome
        )

    async def upload_file(self, sandbox_id: str, path: str, content: bytes | str) -> None:
        await self._client.write_files(sandbox_id, {path: content})

    async def read_file(self, sandbox_id: str, path: str) -> bytes:
        return (await self._client.read_files(sandbox_id, [path]))[path]

    async def heartbeat(self, sandbox_id: str) -> None:
        await self._client.heartbeat(self._leases[sandbox_id].id)

    async def delete_sandbox(self, sandbox_id: str) -> None:
        lease = self._leases.pop(sandbox_id, None)
        if lease is not None:
            await self._client.release(lease.id)

    async def close(self) -> None:
        for sandbox_id in list(self._leases):
            await self.delete_sandbox(sandbox_id)
