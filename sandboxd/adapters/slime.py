"""A slime-style sandbox: ``async with Sandbox(client, pool) as sb`` then
``exec``, ``write_file``, ``read_file``. As in slime, only calls marked
idempotent are retried, and only on transient failures."""

from __future__ import annotations

from dataclasses import dataclass
from types import TracebackType
from typing import Any

from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_random_exponential

from sandboxd import errors
from sandboxd.client import AsyncClient
from sandboxd.client import Sandbox as ClientSandbox


@dataclass(frozen=True)
class ExecOutput:
    exit_code: int
    stdout: str
    stderr: str
    outcome: str
    """EXITED, TIMED_OUT, OOM_KILLED, ... (sandboxd's typed reason)."""

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


class CommandFailed(RuntimeError):
    def __init__(self, command: str, result: ExecOutput) -> None:
        super().__init__(
            f"{command!r} failed ({result.outcome}, exit {result.exit_code}): {result.stderr[-500:]}"
        )
        self.result = result


class Sandbox:
    def __init__(
        self,
        client: AsyncClient,
        pool: str,
        *,
        labels: dict[str, str] | None = None,
        lease_ttl: float = 600.0,
        acquire_timeout: float = 300.0,
        retries: int = 3,
    ) -> None:
        self._client = client
        self._pool = pool
        self._labels = labels
        self._lease_ttl = lease_ttl
        self._acquire_timeout = acquire_timeout
        self._retries = retries
        self._held: Any = None
        self._sandbox: ClientSandbox | None = None

    async def __aenter__(self) -> Sandbox:
        self._held = self._client.acquire(
            self._pool, labels=self._labels, lease_ttl=self._lease_ttl, timeout=self._acquire_timeout
        )
        self._sandbox = await self._held.__aenter__()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._held is not None:
            await self._held.__aexit__(et, e, tb)
        self._sandbox = None

    @property
    def sandbox(self) -> ClientSandbox:
        if self._sandbox is None:
            raise RuntimeError("use the Sandbox inside 'async with'")
        return self._sandbox

    async def _call(self, idempotent: bool, fn: Any, *args: Any, **kwargs: Any) -> Any:
        if not idempotent:
            return await fn(*args, **kwargs)
        async for attempt in AsyncRetrying(
            retry=retry_if_exception_type(errors.TransientBackendError),
            stop=stop_after_attempt(self._retries),
            wait=wait_random_exponential(multiplier=0.2, max=5),
            reraise=True,
        ):
            with attempt:
                return await fn(*args, **kwargs)
        raise AssertionError("unreachable")

    async def exec(
        self,
        cmd: str,
        user: str | None = None,
        env: dict[str, str] | None = None,
        timeout: float | None = None,
        check: bool = False,
        idempotent: bool = False,
        cwd: str = "",
    ) -> ExecOutput:
        """Runs a shell command. ``user`` is accepted for compatibility;
        sandboxd runs every command as the sandbox's unprivileged user."""
        result = await self._call(
            idempotent, self.sandbox.exec, cmd, env=env or {}, timeout=timeout or 0.0, cwd=cwd
        )
        out = ExecOutput(
            result.exit_code,
            result.stdout.decode(errors="replace"),
            result.stderr.decode(errors="replace"),
            result.outcome,
        )
        if check and (out.outcome != "EXITED" or out.exit_code != 0):
            raise CommandFailed(cmd, out)
        return out

    async def write_file(self, path: str, content: str | bytes, idempotent: bool = True) -> None:
        await self._call(idempotent, self.sandbox.write_file, path, content)

    async def read_file(self, path: str, idempotent: bool = True) -> str:
        data: bytes = await self._call(idempotent, self.sandbox.read_file, path)
        return data.decode(errors="replace")
