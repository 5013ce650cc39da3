"""An in-memory backend: a real adapter for fast tests of everything above
the engine. Sandboxes are dictionaries of files (under /workspace and /tmp,
anywhere below / with a writable root);
exec understands a small shell (echo, cat, pwd, cd, export, env, true, false,
exit N, sleep S, id -u, whoami, and ``;``-separated lists), keeps session
state, runs commands and file transfers as the sandbox's user (a uid of its
own, as the real backends give: SandboxUsers) or root, and
honours timeouts and output caps. Failures can be injected: transient create errors, missing images,
slow starts, sandboxes that die, and a wedged engine (``wedge``: create, destroy and list hang until
``unwedge``; a hung create has made its sandbox, as a real engine does).
"""

from __future__ import annotations

import asyncio
import builtins
import io
import posixpath
import shlex
import tarfile
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field

from sandboxd.backends import fake_snapshot
from sandboxd.backends.base import (
    ROOT_USER,
    RUNTIMES,
    WORKSPACE,
    BackendSandbox,
    ExecEvent,
    ExecOutcome,
    ExecResult,
    ExecSpec,
    HostFacts,
    Limits,
    OutputChunk,
    SandboxSpec,
    SandboxUsage,
)
from sandboxd.backends.fake_images import FakeImages
from sandboxd.backends.fake_reset import FakeReset
from sandboxd.backends.uids import DEFAULT_UIDS, SandboxUids
from sandboxd.errors import (
    InvalidArgument,
    NotFound,
    PermanentBackendError,
    ResourceExhausted,
    TransientBackendError,
)


@dataclass
class _Shell:
    cwd: str = WORKSPACE
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class FakeSandbox:
    """One fake sandbox's whole state: files, directories, sessions, and whether it still runs."""

    spec: SandboxSpec
    handle: str
    files: dict[str, tuple[bytes, int]] = field(default_factory=dict)
    dirs: set[str] = field(default_factory=lambda: {WORKSPACE, _TMP})
    sessions: dict[str, _Shell] = field(default_factory=dict)
    running: bool = True
    limits: Limits | None = None
    # For snapshots (sandboxd.backends.fake_snapshot): symlinks, directory
    # modes, and a change time per path (wall-clock seconds of the last write).
    links: dict[str, str] = field(default_factory=dict)
    dir_modes: dict[str, int] = field(default_factory=dict)
    stamps: dict[str, float] = field(default_factory=dict)
    user: tuple[int, int] = (0, 0)
    """The sandbox user's (uid, gid)."""
    leftover_processes: int = 0
    oom_kills: int = 0
    """Injected for resets in place (sandboxd.backends.fake_reset)."""


_TMP = "/tmp"
_ROOTS = (WORKSPACE, _TMP)


def _in_roots(path: str, anywhere: bool = False) -> bool:
    # ``anywhere``: a sandbox with a writable root, whose files may be anywhere below /.
    return (anywhere and path != "/") or any(path == r or path.startswith(r + "/") for r in _ROOTS)


def _refuse_links(box: FakeSandbox, path: str, *, last: bool = True) -> None:
    """As the real backends' tar scripts: a link on the way to ``path`` (or
    ``path`` itself, with ``last``) is refused, never followed."""
    parts = path.strip("/").split("/")
    for i in range(1, len(parts) + (1 if last else 0)):
        prefix = "/" + "/".join(parts[:i])
        if prefix in box.links:
            raise InvalidArgument(
                "path", f"{prefix} is a symbolic link to {box.links[prefix]!r}: not followed"
            )


class _Exit(Exception):
    def __init__(self, code: int) -> None:
        self.code = code


class FakeBackend(FakeImages, FakeReset):
    """A whole Backend in memory, with failures to inject; the module docstring
    lists them (sandboxd.backends.fake_images those of its images)."""

    def __init__(self, *, start_delay: float = 0.0, images: set[str] | None = None) -> None:
        self.start_delay = start_delay
        self.images: set[str] | None = images
        """Images that exist; None = every image exists."""
        self.runtimes_available: frozenset[str] = frozenset(RUNTIMES)
        """What runtimes() answers: every runtime unless a test takes some away."""
        self.root_refusal_text: str | None = None
        """What root_refusal() answers: None (a writable root is had) unless a test says why not."""
        self.sandboxes: dict[str, FakeSandbox] = {}
        self.memory_bytes = 64 << 30
        self.cpus = 16
        """Capacity the fake reports to pre-flight checks."""
        self.transient_failures = 0
        """The next this-many creates fail with a transient error."""
        self.creates = 0
        self.destroys = 0
        self.max_concurrent_creates = 0
        self._creating = 0
        self._counter = 0
        self.host_facts_value: HostFacts | None = None
        """What ``host_facts`` reports; None = nothing known (no host ceiling)."""
        self._unwedged = asyncio.Event()
        self._unwedged.set()
        self.uids = SandboxUids(DEFAULT_UIDS)
        """Which sandbox holds which uid, as on a real engine."""
        self._init_images()

    # -- a wedged engine ----------------------------------------------------

    def wedge(self) -> None:
        """From now on create, destroy and list hang (the engine accepts, never answers)."""
        self._unwedged = asyncio.Event()

    def unwedge(self) -> None:
        """The engine answers again: hung calls finish."""
        self._unwedged.set()

    async def _answer(self) -> None:
        await self._unwedged.wait()

    async def host_facts(self) -> HostFacts:
        """The facts set in ``host_facts_value`` (the fake's host)."""
        return self.host_facts_value or HostFacts()

    # -- Deployment ---------------------------------------------------------

    async def ping(self) -> None:
        """Always answers: the fake is never unreachable."""
        return None

    async def image_exists(self, image: str) -> bool:
        """Whether ``image`` is in ``images``; with ``images`` None, every image exists."""
        return self.images is None or image in self.images

    async def runtimes(self) -> frozenset[str]:
        """``runtimes_available``."""
        return self.runtimes_available

    async def root_refusal(self, runtime: str) -> str | None:
        """``root_refusal_text``."""
        return self.root_refusal_text

    async def create(self, spec: SandboxSpec) -> str:
        """A new sandbox after ``start_delay``; fails for a missing image or an injected transient error."""
        self.creates += 1
        self._creating += 1
        self.max_concurrent_creates = max(self.max_concurrent_creates, self._creating)
        try:
            if self.start_delay:
                await asyncio.sleep(self.start_delay)
            if not await self.image_exists(spec.image):
                raise PermanentBackendError(f"image {spec.image!r} is not present on the engine")
            if self.transient_failures > 0:
                self.transient_failures -= 1
                raise TransientBackendError("injected transient create failure")
            self._counter += 1
            handle = f"fake-{self._counter}"
            self.sandboxes[handle] = box = FakeSandbox(spec, handle, user=self.uids.allocate(spec.sandbox_id))
            if spec.writable_root:
                box.dirs.add("/")
            await self._answer()
            return handle
        finally:
            self._creating -= 1

    async def capacity(self) -> tuple[int, int]:
        """The ``memory_bytes`` and ``cpus`` set on the fake."""
        return self.memory_bytes, self.cpus

    async def update_limits(self, handle: str, limits: Limits) -> None:
        """Records the limits on the sandbox (nothing enforces them); NotFound for an unknown handle."""
        box = self._get(handle)
        box.limits = limits

    async def destroy(self, handle: str) -> None:
        """Forgets the sandbox; a missing one is not an error. Hangs while wedged."""
        await self._answer()
        box = self.sandboxes.pop(handle, None)
        if box is not None:
            self.uids.release(box.spec.sandbox_id)
            self.destroys += 1

    def sandbox_user(self, handle: str) -> tuple[int, int]:
        """The sandbox's own (uid, gid); NotFound for an unknown handle."""
        return self._get(handle).user

    async def list(self) -> builtins.list[BackendSandbox]:
        """Every sandbox the fake holds, dead ones included. Hangs while wedged."""
        await self._answer()
        return [
            BackendSandbox(
                s.spec.sandbox_id, s.spec.pool, h, s.running, dict(s.spec.labels), image=s.spec.image
            )
            for h, s in self.sandboxes.items()
        ]

    async def close(self) -> None:
        """Nothing to let go of; the sandboxes stay, as on a real engine."""
        return None

    async def alive(self, handles: builtins.list[str]) -> set[str]:
        """Those of ``handles`` whose sandbox exists and still runs."""
        return {h for h in handles if h in self.sandboxes and self.sandboxes[h].running}

    def kill(self, handle: str) -> None:
        """Simulates a sandbox dying (container gone, node lost)."""
        self.sandboxes[handle].running = False

    # -- Runtime ------------------------------------------------------------

    def _get(self, handle: str) -> FakeSandbox:
        box = self.sandboxes.get(handle)
        if box is None:
            raise NotFound(f"no sandbox {handle}")
        return box

    async def exec(self, handle: str, spec: ExecSpec) -> AsyncIterator[ExecEvent]:
        """Runs the command in the fake shell; timeouts, output caps and a dead sandbox are outcomes."""
        started = time.monotonic()
        box = self.sandboxes.get(handle)
        if box is None or not box.running:
            yield ExecResult(
                ExecOutcome.SANDBOX_LOST, -1, 0.0, detail="the sandbox stopped", sandbox_gone=True
            )
            return
        shell = box.sessions.setdefault(spec.session, _Shell()) if spec.session else _Shell()
        if spec.cwd:
            shell.cwd = spec.cwd
        scripted = fake_snapshot.emulate(box, shell, spec.shell, spec.stdin)
        if scripted is not None:
            yield OutputChunk(1, scripted)
            yield ExecResult(ExecOutcome.EXITED, 0, time.monotonic() - started)
            return
        out: list[OutputChunk] = []
        used = 0
        truncated = False

        def emit(stream: int, data: bytes) -> None:
            nonlocal used, truncated
            room = spec.output_limit - used
            if len(data) > room:
                truncated = True
                data = data[: max(room, 0)]
            used += len(data)
            if data:
                out.append(OutputChunk(stream, data))
            if truncated:
                raise _Truncated

        command = spec.shell or " ".join(shlex.quote(a) for a in spec.argv)
        code = 0
        outcome = ExecOutcome.EXITED
        try:
            env = {**dict(spec.env), "_FAKE_USER": spec.user, "_FAKE_UID": str(box.user[0])}
            code = await asyncio.wait_for(self._run(box, shell, command, env, spec.stdin, emit), spec.timeout)
        except TimeoutError:
            outcome = ExecOutcome.TIMED_OUT
        except _Truncated:
            outcome = ExecOutcome.OUTPUT_TRUNCATED
        for chunk in out:
            yield chunk
        if not box.running:
            yield ExecResult(
                ExecOutcome.SANDBOX_LOST,
                -1,
                time.monotonic() - started,
                detail="the sandbox stopped",
                sandbox_gone=True,
            )
            return
        if outcome is not ExecOutcome.EXITED:
            yield ExecResult(outcome, -1, time.monotonic() - started, signal=9, output_truncated=truncated)
            return
        yield ExecResult(ExecOutcome.EXITED, code, time.monotonic() - started)

    async def _run(
        self,
        box: FakeSandbox,
        shell: _Shell,
        command: str,
        env: Mapping[str, str],
        stdin: bytes,
        emit: object,
    ) -> int:
        code = 0
        for part in command.split(";"):
            words = shlex.split(part)
            if not words:
                continue
            try:
                code = await self._builtin(box, shell, words, {**shell.env, **env}, stdin, emit)
            except _Exit as e:
                return e.code
        return code

    async def _builtin(
        self,
        box: FakeSandbox,
        shell: _Shell,
        words: builtins.list[str],
        env: dict[str, str],
        stdin: bytes,
        emit: object,
    ) -> int:
        assert callable(emit)
        name, args = words[0], words[1:]
        if name == "true":
            return 0
        if name == "false":
            return 1
        if name == "echo":
            emit(1, (" ".join(args) + "\n").encode())
            return 0
        if name == "pwd":
            emit(1, (shell.cwd + "\n").encode())
            return 0
        if name == "cd":
            target = posixpath.normpath(posixpath.join(shell.cwd, args[0] if args else WORKSPACE))
            if target not in box.dirs:
                emit(2, f"cd: {target}: No such file or directory\n".encode())
                return 1
            shell.cwd = target
            return 0
        if name == "export":
            for a in args:
                k, _, val = a.partition("=")
                shell.env[k] = val
            return 0
        if name == "env":
            shown = {k: val for k, val in env.items() if k not in ("_FAKE_USER", "_FAKE_UID")}
            emit(1, "".join(f"{k}={val}\n" for k, val in shown.items()).encode())
            return 0
        if name in ("id", "whoami"):
            root = env.get("_FAKE_USER") == ROOT_USER
            as_root, as_sandbox = {"id": ("0", env.get("_FAKE_UID", "")), "whoami": ("root", "sandbox")}[name]
            emit(1, f"{as_root if root else as_sandbox}\n".encode())
            return 0
        if name == "cat":
            if not args:
                emit(1, stdin)
                return 0
            for a in args:
                path = posixpath.normpath(posixpath.join(shell.cwd, a))
                if path not in box.files:
                    emit(2, f"cat: {a}: No such file or directory\n".encode())
                    return 1
                emit(1, box.files[path][0])
            return 0
        if name == "yes":
            while True:
                emit(1, b"y\n" * 512)
                await asyncio.sleep(0)
        if name == "sleep":
            await asyncio.sleep(float(args[0]))
            return 0
        if name == "exit":
            raise _Exit(int(args[0]) if args else 0)
        emit(2, f"{name}: command not found\n".encode())
        return 127

    async def usage(self, handle: str) -> SandboxUsage:
        """Workspace bytes and entries against the limits; the fake reports no memory, pids or CPU."""
        box = self._get(handle)
        return SandboxUsage(
            disk_bytes=sum(len(c) for c, _ in box.files.values()),
            disk_total_bytes=box.spec.limits.disk_bytes,
            files=len(box.files) + len(box.dirs) - 1,
            files_total=box.spec.limits.max_files,
        )

    async def put_tar(self, handle: str, dest: str, chunks: AsyncIterator[bytes]) -> None:
        """Extracts into the sandbox's files; InvalidArgument for a corrupt or escaping archive,
        ResourceExhausted once the files pass the disk limit (checked after extracting)."""
        box = self._get(handle)
        data = b"".join([c async for c in chunks])
        limit = box.spec.limits.disk_bytes
        try:
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
                _refuse_links(box, dest)
                for member in tar:
                    path = posixpath.normpath(posixpath.join(dest, member.name))
                    if not _in_roots(path, box.spec.writable_root):
                        raise InvalidArgument("tar", f"member {member.name} escapes")
                    _refuse_links(box, path, last=member.isdir())
                    self._mkdirs(box, posixpath.dirname(path))
                    box.stamps[path] = time.time()
                    if member.isdir():
                        self._mkdirs(box, path)
                        box.dir_modes[path] = member.mode
                    elif member.isfile():
                        fh = tar.extractfile(member)
                        box.links.pop(path, None)
                        box.files[path] = (fh.read() if fh else b"", member.mode)
                    elif member.issym():
                        box.files.pop(path, None)
                        box.links[path] = member.linkname
        except tarfile.TarError as e:
            raise InvalidArgument("tar", f"extraction failed: {e}") from e
        self._mkdirs(box, dest)
        if limit and sum(len(c) for c, _ in box.files.values()) > limit:
            raise ResourceExhausted("workspace is full (bytes)")

    @staticmethod
    def _mkdirs(box: FakeSandbox, path: str) -> None:
        while _in_roots(path, box.spec.writable_root) and path not in box.dirs:
            box.dirs.add(path)
            path = posixpath.dirname(path)

    async def put_tar_as(self, handle: str, dest: str, chunks: AsyncIterator[bytes], user: str) -> None:
        """As put_tar (the fake keeps no owners)."""
        await self.put_tar(handle, dest, chunks)

    def get_tar_as(self, handle: str, base: str, paths: tuple[str, ...], user: str) -> AsyncIterator[bytes]:
        """As get_tar."""
        return self.get_tar(handle, base, paths)

    async def get_tar(self, handle: str, base: str, paths: tuple[str, ...]) -> AsyncIterator[bytes]:
        """A tar of ``paths`` under ``base`` in one chunk; NotFound names the missing base or first path."""
        box = self._get(handle)
        _refuse_links(box, base)
        if base not in box.dirs:  # as the Docker backend: name the missing base itself
            raise NotFound(f"no such file or directory in the sandbox: {base}")
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for rel in paths:
                root = posixpath.normpath(posixpath.join(base, rel))
                _refuse_links(box, root, last=False)
                if root not in box.files and root not in box.dirs and root not in box.links:
                    raise NotFound(f"no such file or directory in the sandbox: {rel}")
                for path in sorted(box.dirs):  # directory entries, as real tar writes them
                    if path == root or path.startswith(root + "/"):
                        info = tarfile.TarInfo(posixpath.relpath(path, base))
                        info.type, info.mode = tarfile.DIRTYPE, box.dir_modes.get(path, 0o755)
                        tar.addfile(info)
                for path, target in sorted(box.links.items()):
                    if path == root or path.startswith(root + "/"):
                        info = tarfile.TarInfo(posixpath.relpath(path, base))
                        info.type, info.linkname = tarfile.SYMTYPE, target
                        tar.addfile(info)
                for path, (content, mode) in sorted(box.files.items()):
                    if path == root or path.startswith(root + "/"):
                        info = tarfile.TarInfo(posixpath.relpath(path, base))
                        info.size, info.mode = len(content), mode
                        tar.addfile(info, io.BytesIO(content))
        yield buf.getvalue()


class _Truncated(Exception):
    pass
