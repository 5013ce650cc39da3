"""slime's ``Sandbox`` Protocol (THUDM/slime ``slime/agent/sandbox.py``) over
sandboxd, so slime's own helpers (``exec_and_wait``, the harnesses) run
unchanged::

    async with Sandbox(client, "py") as sb:
        exit_code, stdout, stderr = await sb.exec("python3 -V")
        await sb.write_file("/tmp/.run.sh", "echo hi\\n")

Names and meanings are slime's: ``exec`` returns an ``(exit_code, stdout,
stderr)`` tuple (which also carries sandboxd's typed outcome), ``user``
defaults to ``"root"``, ``timeout`` to 120 s, ``idempotent`` to True (only
idempotent calls are retried, and only on transient failures), ``read_file``
answers ``""`` for a missing file, ``write_file`` takes ``str``, ``bytes`` or a
host ``Path``. ``"root"`` is uid 0 inside the sandbox's own namespaces with
no capabilities (sandboxd's ``user="root"``): it owns what it creates and may
write where any user may, ``/tmp``.
"""

from __future__ import annotations

import asyncio
import posixpath
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_random_exponential

from sandboxd import errors
from sandboxd.client import AsyncClient, ExecResult
from sandboxd.client import Sandbox as ClientSandbox

__all__ = ["CommandFailed", "ExecOutput", "Sandbox"]

T = TypeVar("T")

FileContent = str | bytes | Path

# slime's user names -> sandboxd's: only root and the sandbox's own user exist.
DEFAULT_USERS: Mapping[str, str] = {"root": "root", "": ""}

_FILE_ROOTS = ("/workspace", "/tmp")


class ExecOutput(tuple[int, str, str]):
    """slime's ``(exit_code, stdout, stderr)``, carrying sandboxd's outcome too."""

    outcome: str
    """EXITED, TIMED_OUT, OOM_KILLED, OUTPUT_TRUNCATED, ... (sandboxd's typed reason)."""
    detail: str

    def __new__(
        cls, exit_code: int, stdout: str, stderr: str, outcome: str = "EXITED", detail: str = ""
    ) -> ExecOutput:
        self = super().__new__(cls, (exit_code, stdout, stderr))
        self.outcome = outcome
        self.detail = detail
        return self

    def __getnewargs__(self) -> tuple[int, str, str, str, str]:
        # Copies and pickles rebuild it with its outcome.
        return (self[0], self[1], self[2], self.outcome, self.detail)

    @property
    def exit_code(self) -> int:
        """The process's exit code; -1 when it did not exit by itself (see ``outcome``)."""
        return self[0]

    @property
    def stdout(self) -> str:
        """Standard output, decoded with undecodable bytes replaced."""
        return self[1]

    @property
    def stderr(self) -> str:
        """Standard error, decoded with undecodable bytes replaced."""
        return self[2]

    @property
    def output(self) -> str:
        """stdout followed by stderr (concatenated, not interleaved in time)."""
        return self[1] + self[2]


class CommandFailed(RuntimeError):
    """``check=True`` and the command did not exit 0 (slime raises RuntimeError too)."""

    def __init__(self, command: str, result: ExecOutput) -> None:
        super().__init__(
            f"sandboxd exec failed ({result.outcome}, exit={result.exit_code}): {command[:120]}\n"
            f"{result.stderr[:400]}"
        )
        self.result = result


class Sandbox:
    """A leased sandbox that satisfies slime's ``Sandbox`` Protocol."""

    def __init__(
        self,
        client: AsyncClient,
        pool: str,
        *,
        labels: dict[str, str] | None = None,
        lease_ttl: float = 600.0,
        acquire_timeout: float = 300.0,
        retries: int = 3,
        users: Mapping[str, str] | None = None,
    ) -> None:
        """``users`` maps slime's user names to sandboxd's ("" = the sandbox's
        own user, "root"); a name it lacks is refused, never run as another
        user. On a backend without root, ``users={"root": ""}`` is the
        explicit choice to run slime's root commands as the sandbox's user."""
        self._client = client
        self._pool = pool
        self._labels = labels
        self._lease_ttl = lease_ttl
        self._acquire_timeout = acquire_timeout
        self._retries = retries
        self._users = dict(DEFAULT_USERS if users is None else users)
        self._held: Any = None
        self._sandbox: ClientSandbox | None = None
        self.sandbox_id = ""

    async def __aenter__(self) -> Sandbox:
        self._held = self._client.acquire(
            self._pool, labels=self._labels, lease_ttl=self._lease_ttl, timeout=self._acquire_timeout
        )
        self._sandbox = await self._held.__aenter__()
        self.sandbox_id = self._sandbox.id
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._held is not None:
            await self._held.__aexit__(et, e, tb)
        self._held = None
        self._sandbox = None

    @property
    def sandbox(self) -> ClientSandbox:
        """The leased client sandbox; raises RuntimeError outside ``async with``."""
        if self._sandbox is None:
            raise RuntimeError("use the Sandbox inside 'async with'")
        return self._sandbox

    def _user(self, user: str) -> str:
        try:
            return self._users[user]
        except KeyError:
            raise ValueError(
                f"user {user!r} does not exist in a sandboxd sandbox; known: {sorted(self._users)} "
                "(pass users= to map it)"
            ) from None

    async def _call(self, idempotent: bool, fn: Callable[[], Awaitable[T]]) -> T:
        if not idempotent:
            return await fn()
        async for attempt in AsyncRetrying(
            retry=retry_if_exception_type(errors.TransientBackendError),
            stop=stop_after_attempt(self._retries),
            wait=wait_random_exponential(multiplier=0.2, max=5),
            reraise=True,
        ):
            with attempt:
                return await fn()
        raise AssertionError("unreachable")

    async def exec(
        self,
        cmd: str,
        *,
        user: str = "root",
        env: dict[str, str] | None = None,
        timeout: int = 120,
        check: bool = False,
        idempotent: bool = True,
        cwd: str = "",
    ) -> ExecOutput:
        """Runs a shell command as ``user``. A command that did not exit by
        itself (timeout, OOM, ...) answers exit code -1 with its outcome; a
        sandbox lost under it raises SandboxLost (infrastructure, not the
        command)."""
        who = self._user(user)
        sandbox = self.sandbox

        async def run() -> ExecResult:
            return await sandbox.exec(cmd, env=env or {}, timeout=float(timeout), cwd=cwd, user=who)

        result = await self._call(idempotent, run)
        if result.outcome == "SANDBOX_LOST":
            raise errors.SandboxLost(f"the sandbox was lost under {cmd[:120]!r}: {result.detail}")
        out = ExecOutput(
            result.exit_code,
            result.stdout.decode(errors="replace"),
            result.stderr.decode(errors="replace"),
            result.outcome,
            result.detail,
        )
        if check and (out.outcome != "EXITED" or out.exit_code != 0):
            raise CommandFailed(cmd, out)
        return out

    async def write_file(
        self, sandbox_path: str, content: FileContent, *, user: str = "root", idempotent: bool = True
    ) -> None:
        """Writes ``content`` (a host ``Path`` is read and streamed in) as
        ``user``, who owns the file. Paths lie in /workspace or /tmp."""
        who = self._user(user)
        if isinstance(content, Path):
            data: str | bytes = await asyncio.to_thread(content.read_bytes)
        else:
            data = content
        sandbox = self.sandbox

        async def write() -> int:
            return await sandbox.write_file(sandbox_path, data, user=who)

        await self._call(idempotent, write)

    async def read_file(self, sandbox_path: str, *, user: str = "root", idempotent: bool = True) -> str:
        """The file's text, or "" when it is missing or unreadable (as slime's
        own sandbox answers). Files outside /workspace and /tmp (the image's)
        are read by ``cat`` as ``user``."""
        who = self._user(user)
        sandbox = self.sandbox
        if _in_file_roots(sandbox_path):

            async def read() -> bytes:
                return await sandbox.read_file(sandbox_path, user=who)

            try:
                return (await self._call(idempotent, read)).decode(errors="replace")
            except (errors.NotFound, errors.InvalidArgument):
                return ""

        async def cat() -> ExecResult:
            return await sandbox.exec(["cat", "--", sandbox_path], user=who, timeout=120.0)

        result = await self._call(idempotent, cat)
        return result.stdout.decode(errors="replace") if result.ok else ""


def _in_file_roots(path: str) -> bool:
    full = posixpath.normpath(path if path.startswith("/") else f"/workspace/{path}")
    return any(full.startswith(root + "/") for root in _FILE_ROOTS)
