"""Operations inside leased sandboxes: exec (validated, its timeout cut to the
caller's deadline, as the sandbox's user or root where the backend serves it)
and file transfer (write, read, upload and download of directories as tar
streams, checked before they reach the sandbox).

Each operation looks the sandbox up through the registry (the current
tenant's, LEASED) and runs under ``Leasing.using``, so the lease is not
reaped while it runs; an exec that finds its sandbox gone reports it lost.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import IO

from sandboxd.backends.base import (
    WORKSPACE,
    Backend,
    ExecEvent,
    ExecResult,
    ExecSpec,
    InPlaceWrites,
    ModelRoutes,
    RootUser,
    SandboxUsage,
)
from sandboxd.backends.network.egress import model_env
from sandboxd.core import validation as v
from sandboxd.core.deadlines import EXEC_FLOOR_SECONDS, EXEC_MARGIN_SECONDS, within_deadline
from sandboxd.core.files import (
    FileData,
    build_tar,
    check_upload,
    parse_read_tar,
    relative,
    shared_parent,
)
from sandboxd.core.leasing import Leasing
from sandboxd.core.lifecycle import SandboxRecord
from sandboxd.core.model_route import ModelRoute
from sandboxd.core.registry import SandboxRegistry
from sandboxd.core.root_setting import writable_root
from sandboxd.errors import FailedPrecondition, InvalidArgument, ResourceExhausted
from sandboxd.settings import Settings

_IN_PLACE_MAX = 4 << 20
"""Uploads up to this many bytes may be written from the host (the writes
happen on a worker thread, all in memory)."""


@dataclass(frozen=True)
class ExecRequest:
    """An exec as the API received it, before validation."""

    sandbox_id: str
    argv: list[str] | None = None
    shell: str | None = None
    cwd: str = ""
    env: dict[str, str] | None = None
    timeout: float = 0.0
    stdin: bytes = b""
    output_limit: int = 0
    session: str = ""
    user: str = ""
    call_remaining: float | None = None
    """Seconds before the caller's deadline, as the client sent it (None = none)."""


class Operations:
    """Exec and file transfer on the current tenant's leased sandboxes."""

    def __init__(
        self, settings: Settings, backend: Backend, registry: SandboxRegistry, leasing: Leasing
    ) -> None:
        self._settings = settings
        self._backend = backend
        self._registry = registry
        self._leasing = leasing
        self.model_route: ModelRoute | None = None
        """Set where the backend serves the model route: commands in a pool
        with a model endpoint get the gateway's address and their lease's key."""

    # -- exec -------------------------------------------------------------------

    def prepare_exec(self, req: ExecRequest) -> tuple[SandboxRecord, ExecSpec]:
        """Validates the request against the server's exec settings and the
        sandbox's limits; the timeout ends in time for the caller's deadline."""
        rec = self._registry.leased(req.sandbox_id)
        s = self._settings.exec
        if req.argv is not None:
            argv, shell = v.argv("argv", req.argv), ""
        elif req.shell is not None:
            argv, shell = (), v.shell("shell", req.shell)
        else:
            raise InvalidArgument("command", "set argv or shell")
        timeout = (
            v.non_negative("timeout_seconds", req.timeout, s.max_timeout_seconds) or s.default_timeout_seconds
        )
        output_limit = int(v.non_negative("output_limit_bytes", req.output_limit, s.max_output_bytes))
        if len(req.stdin) > s.max_stdin_bytes:
            raise InvalidArgument("stdin", f"at most {s.max_stdin_bytes} bytes, got {len(req.stdin)}")
        session = v.session_name("session", req.session)
        user = self._user("user", req.user, session)
        cwd = v.exec_cwd("cwd", req.cwd)
        spec = ExecSpec(
            argv=argv,
            shell=shell,
            cwd=cwd if (cwd or session) else WORKSPACE,
            env=self._model_env(rec) | v.env("env", req.env or {}),
            timeout=within_deadline(timeout, req.call_remaining, EXEC_MARGIN_SECONDS, EXEC_FLOOR_SECONDS),
            stdin=req.stdin,
            output_limit=output_limit or rec.limits.output_bytes,
            session=session,
            user=user,
        )
        return rec, spec

    def _model_env(self, rec: SandboxRecord) -> dict[str, str]:
        route = self.model_route
        pool = self._registry.pools.get(rec.pool)
        if route is None or pool is None or not pool.config.model_endpoint or not rec.lease_id:
            return {}
        url = self._backend.model_url() if isinstance(self._backend, ModelRoutes) else ""
        return model_env(route.key_for(rec.lease_id, rec.pool, rec.sandbox_id), url)

    def _user(self, field: str, user: str, session: str = "") -> str:
        """A validated exec or file user; root needs a backend that serves it."""
        user = v.exec_user(field, user)
        if user and session:
            raise InvalidArgument(field, "sessions run as the sandbox's user; run root commands one-shot")
        if user and not isinstance(self._backend, RootUser):
            raise FailedPrecondition(f"{field}: {user!r} is not available on this backend")
        return user

    async def exec(self, rec: SandboxRecord, spec: ExecSpec) -> AsyncIterator[ExecEvent]:
        """Runs a prepared exec, streaming its output and then its result."""
        with self._leasing.using(rec):
            async for event in self._backend.exec(rec.handle, spec):
                if isinstance(event, ExecResult) and event.sandbox_gone:
                    self._leasing.lose(rec, event.detail)
                yield event

    async def usage_of(self, sandbox_id: str) -> SandboxUsage:
        """What the leased sandbox uses now (memory, pids, disk, files, CPU)."""
        rec = self._registry.leased(sandbox_id)
        return await self._backend.usage(rec.handle)

    # -- files --------------------------------------------------------------

    async def write_files(self, sandbox_id: str, files: list[FileData], user: str = "") -> int:
        """Writes files into the sandbox's file roots; returns the bytes written."""
        rec = self._registry.leased(sandbox_id)
        if not files:
            raise InvalidArgument("files", "must not be empty")
        user = self._user("user", user)
        anywhere = self._anywhere(rec)
        checked: list[FileData] = []
        seen: set[str] = set()
        for i, f in enumerate(files):
            path = v.file_path(f"files[{i}].path", f.path, anywhere)
            if path in v.file_roots(anywhere):
                raise InvalidArgument(f"files[{i}].path", f"is the directory {path} itself")
            if path in seen:
                raise InvalidArgument(f"files[{i}].path", f"{path} appears twice")
            seen.add(path)
            mode = f.mode or 0o644
            if mode > 0o777:
                raise InvalidArgument(f"files[{i}].mode", f"{oct(mode)}: only permission bits (<= 0o777)")
            checked.append(FileData(path, f.content, mode))
        total = sum(len(f.content) for f in checked)
        with self._leasing.using(rec):
            if await self._written_in_place(rec, checked, user):
                return total
            for root in v.file_roots(anywhere):  # one tar per file root the files lie in
                group = [f for f in checked if v.file_root(f.path) == root]
                if group:
                    # Large archives are built off the event loop.
                    big = total > 1 << 20
                    base = shared_parent(group, root)
                    data = await asyncio.to_thread(build_tar, group, base) if big else build_tar(group, base)
                    await self._put_tar(rec.handle, base, data, user)
        return total

    async def _written_in_place(self, rec: SandboxRecord, files: list[FileData], user: str) -> bool:
        """Small workspace uploads as the sandbox's user, written by a backend
        that can without a process in the sandbox (False: put_tar them)."""
        backend = self._backend
        if (
            user
            or not isinstance(backend, InPlaceWrites)
            or sum(len(f.content) for f in files) > _IN_PLACE_MAX
        ):
            return False
        if any(v.file_root(f.path) != WORKSPACE for f in files):
            return False
        return await backend.write_in_place(
            rec.handle, [(relative(f.path), f.content, f.mode) for f in files]
        )

    def _anywhere(self, rec: SandboxRecord) -> bool:
        """Whether the file calls reach any path of the sandbox: its pool
        gave it a writable root (sandboxd.core.root_setting)."""
        pool = self._registry.pools.get(rec.pool)
        return pool is not None and writable_root(pool.config)

    async def _put_tar(self, handle: str, dest: str, data: bytes, user: str) -> None:
        async def one() -> AsyncIterator[bytes]:
            yield data

        if user:
            assert isinstance(self._backend, RootUser)  # checked by _user
            await self._backend.put_tar_as(handle, dest, one(), user)
        else:
            await self._backend.put_tar(handle, dest, one())

    async def read_files(
        self, sandbox_id: str, paths: list[str], max_bytes: int, user: str = ""
    ) -> list[FileData]:
        """Reads files, in the order asked, within ``max_bytes`` in all."""
        rec = self._registry.leased(sandbox_id)
        if not paths:
            raise InvalidArgument("paths", "must not be empty")
        user = self._user("user", user)
        limit = self._settings.exec.max_read_bytes
        max_bytes = int(v.non_negative("max_bytes", max_bytes, limit)) or min(16 << 20, limit)
        anywhere = self._anywhere(rec)
        full = []
        for i, p in enumerate(paths):
            path = v.file_path(f"paths[{i}]", p, anywhere)
            if path in v.file_roots(anywhere):
                raise InvalidArgument(f"paths[{i}]", f"is the directory {path} itself")
            if path not in full:
                full.append(path)
        # Tar adds headers and padding; allow for them before cutting off.
        cap = max_bytes + 2048 * len(full) + 10240
        size = 0
        found: dict[str, FileData] = {}
        with self._leasing.using(rec):
            for root in v.file_roots(anywhere):  # one tar per file root the paths lie in
                group = [p for p in full if v.file_root(p) == root]
                if not group:
                    continue
                rels = tuple(relative(p, root) for p in group)
                if user:
                    assert isinstance(self._backend, RootUser)  # checked by _user
                    stream = self._backend.get_tar_as(rec.handle, root, rels, user)
                else:
                    stream = self._backend.get_tar(rec.handle, root, rels)
                buf = bytearray()
                try:
                    async for chunk in stream:
                        buf += chunk
                        if size + len(buf) > cap:
                            raise ResourceExhausted(
                                f"files exceed max_bytes ({max_bytes}); read fewer or raise it"
                            )
                finally:
                    await stream.aclose()  # type: ignore[attr-defined]
                size += len(buf)
                found.update(zip(group, parse_read_tar(bytes(buf), group, root), strict=True))
        result = [found[p] for p in full]
        if sum(len(f.content) for f in result) > max_bytes:
            raise ResourceExhausted(f"files exceed max_bytes ({max_bytes}); read fewer or raise it")
        return [
            FileData(p, f.content, f.mode)
            for p, f in zip(paths_in_order(paths, full, anywhere), result, strict=True)
        ]

    async def upload_directory(self, sandbox_id: str, path: str, chunks: AsyncIterator[bytes]) -> int:
        """Extracts an uploaded tar stream at ``path`` once it has been checked
        whole (spooled, so a bad archive leaves nothing behind); returns its size."""
        rec = self._registry.leased(sandbox_id)
        dest = v.file_path("header.path", path, self._anywhere(rec))
        limit = self._settings.exec.max_upload_bytes
        spool: IO[bytes] = tempfile.SpooledTemporaryFile(max_size=16 << 20)  # noqa: SIM115
        try:
            size = 0
            async for chunk in chunks:
                size += len(chunk)
                if size > limit:
                    raise InvalidArgument("data", f"upload exceeds {limit} bytes")
                spool.write(chunk)
            if size == 0:
                raise InvalidArgument("data", "empty upload: send a tar stream after the header")
            spool.seek(0)
            await asyncio.to_thread(check_upload, spool, rec.limits.disk_bytes)

            async def replay() -> AsyncIterator[bytes]:
                spool.seek(0)
                while block := spool.read(1 << 20):
                    yield block

            with self._leasing.using(rec):
                await self._backend.put_tar(rec.handle, dest, replay())
            return size
        finally:
            spool.close()

    def download_directory(self, sandbox_id: str, path: str) -> AsyncIterator[bytes]:
        """A tar stream of the directory at ``path`` (checked now, read as iterated)."""
        rec = self._registry.leased(sandbox_id)
        base = v.file_path("path", path, self._anywhere(rec))
        return self._download(rec, base)

    async def _download(self, rec: SandboxRecord, base: str) -> AsyncIterator[bytes]:
        with self._leasing.using(rec):
            async for chunk in self._backend.get_tar(rec.handle, base, (".",)):
                yield chunk


def paths_in_order(requested: list[str], full: list[str], anywhere: bool = False) -> list[str]:
    """Original spelling of each unique path, in the order read."""
    out: dict[str, str] = {}
    for p in requested:
        out.setdefault(v.file_path("paths", p, anywhere), p)
    return [out[f] for f in full]
