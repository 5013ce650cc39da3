"""Sandboxes as containers on a Docker engine.

Management calls (create, remove, list, inspect) go through the ``docker``
SDK on a bounded thread pool, never on the event loop; exec and file traffic
goes through the async raw client (rawapi). Containers are hardened by
default: no network, non-root, no capabilities, no-new-privileges, read-only
root, and a size- and inode-limited tmpfs as the workspace, so the kernel
enforces disk bytes and file count.

Each sandbox also gets a read-only bind mount of its own host directory, the
*inbox*: a large archive (a snapshot restored or forked) is hard-linked there
and extracted by the sandbox itself, so n sandboxes read it from the page
cache instead of having it pushed n times through the engine's exec stream.
Only what is linked for that sandbox is ever in it, and only while it is
being extracted.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import functools
import os
import secrets
import shutil
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import docker
import docker.errors
import docker.types
import requests.exceptions

from sandboxd.backends.base import (
    LABEL_INSTANCE,
    LABEL_MANAGED,
    LABEL_POOL,
    LABEL_SANDBOX,
    WORKSPACE,
    BackendSandbox,
    ExecEvent,
    ExecOutcome,
    ExecResult,
    ExecSpec,
    Limits,
    SandboxSpec,
    SandboxUsage,
)
from sandboxd.backends.docker.cgroups import ContainerProbe
from sandboxd.backends.docker.execs import ShellSession, Target, kill_tree, run_oneshot
from sandboxd.backends.docker.rawapi import EngineAddress, RawEngine
from sandboxd.backends.hostfs import HostWorkspace
from sandboxd.backends.shell import ansi_c_quote, get_tar_argv, put_tar_argv
from sandboxd.errors import (
    BackendError,
    InvalidArgument,
    NotFound,
    PermanentBackendError,
    ResourceExhausted,
    SandboxLost,
    TransientBackendError,
)

T = TypeVar("T")

_TMP_BYTES = 64 << 20
INBOX = "/.sandboxd/inbox"
# An inbox directory without a container is only removed once it is this old,
# so a sweep never races a create that made the directory a moment ago.
_INBOX_GRACE_SECONDS = 300.0


@dataclass(frozen=True)
class DockerOptions:
    instance: str
    base_url: str | None = None
    user: str = "1000:1000"
    threads: int = 16
    runtime: str | None = None
    inbox_dir: Path | None = None
    """Host directory for the sandboxes' inboxes (None: no inboxes; archives
    are streamed). Must be a path on the engine's host."""
    host_workspaces: bool = True
    """Read workspaces in place (sandboxd.backends.hostfs) where this process
    can see the containers' processes; False: always through the sandbox."""


# Larger stdin goes through a real engine exec rather than the shell's command line.
_RUNNER_STDIN_MAX = 64 << 10
_IDLE_RUNNERS = 4


def _in_subshell(spec: ExecSpec) -> ExecSpec:
    """A one-shot exec as a subshell command: its own process, cwd and
    environment, nothing shared with the shell that forks it. The subshell
    execs, so the command's processes carry the exec tag in their environment
    (a bare fork would not) and a timeout finds the whole tree."""
    body = (
        "exec " + " ".join(ansi_c_quote(a) for a in spec.argv)
        if spec.argv
        else f"exec bash -c {ansi_c_quote(spec.shell)}"
    )
    command = f"( cd -- {ansi_c_quote(spec.cwd or WORKSPACE)} || exit 127; {body} )"
    return replace(spec, argv=(), shell=command, cwd="", session="")


def _raise_for_put(code: int, dest: str, message: str) -> None:
    """Exit codes of the PUT_TAR script, as sandboxd errors."""
    if code == 28:
        raise ResourceExhausted(f"workspace is full (bytes or files): {message}")
    if code == 3:
        raise InvalidArgument("path", f"cannot create directory {dest!r}: {message}")
    if code != 0:
        raise InvalidArgument("tar", f"extraction failed: {message or f'exit {code}'}")


def _container_name(sandbox_id: str) -> str:
    return f"sandboxd-{sandbox_id}"


class DockerBackend:
    def __init__(self, options: DockerOptions) -> None:
        self._options = options
        self._pool = ThreadPoolExecutor(max_workers=options.threads, thread_name_prefix="sandboxd-docker")
        self._client = docker.DockerClient(
            base_url=options.base_url or "unix:///var/run/docker.sock",
            timeout=60,
            max_pool_size=options.threads,
        )
        self._raw = RawEngine(EngineAddress.parse(options.base_url))
        self._sessions: dict[str, dict[str, ShellSession]] = {}
        self._spare: dict[str, ShellSession] = {}
        self._session_locks: dict[str, asyncio.Lock] = {}
        self._cleanups: set[asyncio.Future[None]] = set()
        self._probes: dict[str, ContainerProbe | None] = {}
        # Idle shells per sandbox that fork one-shot commands.
        self._runners: dict[str, list[ShellSession]] = {}
        # Host directory of each sandbox's inbox mount (None: it has none).
        self._inboxes: dict[str, Path | None] = {}

    async def _run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))

    # -- Deployment ---------------------------------------------------------

    async def ping(self) -> None:
        try:
            await self._run(self._client.ping)
        except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
            raise TransientBackendError(f"Docker engine unreachable: {e}") from e

    async def image_exists(self, image: str) -> bool:
        try:
            await self._run(self._client.images.get, image)
            return True
        except docker.errors.ImageNotFound:
            return False
        except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
            raise TransientBackendError(f"cannot inspect image {image!r}: {e}") from e

    async def create(self, spec: SandboxSpec) -> str:
        name = _container_name(spec.sandbox_id)
        loop = asyncio.get_running_loop()
        creating = loop.run_in_executor(self._pool, self._create_sync, spec, name)
        session: ShellSession | None = None
        try:
            handle, pid = await asyncio.shield(creating)
            self._probes[handle] = ContainerProbe.open(pid) if pid else None
            self._inboxes[handle] = self._inbox_path(spec.sandbox_id)
            session = ShellSession(await self._target(handle), dict(spec.env))
            await session.start()
            # The spare shell doubles as the health check: a sandbox is READY
            # only once a command has run in it.
            async for event in session.run(ExecSpec(shell="true", timeout=30)):
                if isinstance(event, ExecResult) and (
                    event.outcome is not ExecOutcome.EXITED or event.exit_code != 0
                ):
                    raise TransientBackendError(f"health check failed: {event.detail or event.outcome.name}")
            self._spare[handle] = session
            return handle
        except BaseException:
            # Failed or cancelled half-way: the container must not outlive us,
            # even one the engine is still creating in the worker thread.
            cleanup = asyncio.ensure_future(self._cleanup_create(creating, spec.sandbox_id, session))
            self._cleanups.add(cleanup)
            cleanup.add_done_callback(self._cleanups.discard)
            await asyncio.shield(cleanup)
            raise

    async def _cleanup_create(
        self, creating: asyncio.Future[tuple[str, int]], sandbox_id: str, session: ShellSession | None
    ) -> None:
        with contextlib.suppress(BaseException):
            await creating
        if session is not None:
            await session.close()
        await self._remove_by_name(_container_name(sandbox_id))
        inbox = self._inbox_path(sandbox_id)
        if inbox is not None:
            await self._run(shutil.rmtree, inbox, True)

    def _create_sync(self, spec: SandboxSpec, name: str) -> tuple[str, int]:
        """Creates and starts the container; returns its id and host pid."""
        limits = spec.limits
        uid, _, gid = self._options.user.partition(":")
        owner = f",uid={uid},gid={gid or uid}" if uid.isdigit() else ""
        workspace = "rw,exec,nosuid,nodev,mode=0755" + owner
        if limits.disk_bytes:
            workspace += f",size={limits.disk_bytes}"
        if limits.max_files:
            workspace += f",nr_inodes={limits.max_files}"
        labels = {
            **{k: v for k, v in spec.labels.items()},
            LABEL_MANAGED: "true",
            LABEL_INSTANCE: self._options.instance,
            LABEL_POOL: spec.pool,
            LABEL_SANDBOX: spec.sandbox_id,
        }
        kwargs: dict[str, Any] = dict(
            image=spec.image,
            command=["sleep", "infinity"],
            name=name,
            labels=labels,
            detach=True,
            init=True,
            network_mode="none",
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            read_only=True,
            tmpfs={
                WORKSPACE: workspace,
                "/tmp": f"rw,exec,nosuid,nodev,mode=1777,size={_TMP_BYTES},nr_inodes=4096",
            },
            user=self._options.user,
            working_dir=WORKSPACE,
            environment={"HOME": WORKSPACE, **spec.env},
            hostname="sandbox",
            stop_signal="SIGKILL",
        )
        if limits.memory_bytes:
            kwargs["mem_limit"] = limits.memory_bytes
            kwargs["memswap_limit"] = limits.memory_bytes
        if limits.cpu_millis:
            kwargs["nano_cpus"] = limits.cpu_millis * 1_000_000
        if limits.pids:
            kwargs["pids_limit"] = limits.pids
        if self._options.runtime:
            kwargs["runtime"] = self._options.runtime
        inbox = self._inbox_path(spec.sandbox_id)
        if inbox is not None:
            try:
                inbox.mkdir(parents=True, exist_ok=True)
                inbox.chmod(0o755)  # the sandbox user reads it, whatever our umask
            except OSError as e:
                raise PermanentBackendError(f"cannot create the sandbox's inbox {inbox}: {e}") from e
            mount = docker.types.Mount(target=INBOX, source=str(inbox), type="bind", read_only=True)
            kwargs["mounts"] = [mount]
        try:
            container = self._client.containers.create(**kwargs)
            container.start()
            container.reload()
            return str(container.id), int(container.attrs.get("State", {}).get("Pid") or 0)
        except docker.errors.ImageNotFound as e:
            raise PermanentBackendError(f"image {spec.image!r} is not present on the engine") from e
        except docker.errors.APIError as e:
            if e.is_client_error() and e.status_code != 409:
                raise PermanentBackendError(f"the engine rejected the sandbox spec: {e.explanation}") from e
            raise TransientBackendError(f"container create failed: {e.explanation}") from e
        except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
            raise TransientBackendError(f"container create failed: {e}") from e

    async def capacity(self) -> tuple[int, int]:
        try:
            info = await self._run(self._client.info)
        except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
            raise TransientBackendError(f"cannot read engine info: {e}") from e
        return int(info.get("MemTotal") or 0), int(info.get("NCPU") or 0)

    async def update_limits(self, handle: str, limits: Limits) -> None:
        body: dict[str, int] = {}
        if limits.memory_bytes:
            body["Memory"] = body["MemorySwap"] = limits.memory_bytes
        if limits.cpu_millis:
            body["NanoCpus"] = limits.cpu_millis * 1_000_000
        if limits.pids:
            body["PidsLimit"] = limits.pids
        if body:
            await self._run(self._update_sync, handle, body)

    def _update_sync(self, handle: str, body: dict[str, int]) -> None:
        # The SDK's update_container predates PidsLimit; the API takes it.
        api = self._client.api
        try:
            response = api._post_json(api._url("/containers/{0}/update", handle), data=body)
            api._raise_for_status(response)
        except docker.errors.NotFound as e:
            raise SandboxLost("the sandbox's container is gone") from e
        except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
            raise TransientBackendError(f"cannot update limits: {e}") from e

    async def _remove_by_name(self, name: str) -> None:
        with contextlib.suppress(BackendError):
            await self._run(self._remove_sync, name)

    def _remove_sync(self, ref: str) -> None:
        try:
            self._client.api.remove_container(ref, force=True, v=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as e:
            if e.status_code == 409 and "already in progress" in str(e.explanation):
                return
            raise TransientBackendError(f"container remove failed: {e.explanation}") from e
        except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
            raise TransientBackendError(f"container remove failed: {e}") from e

    async def destroy(self, handle: str) -> None:
        sessions = list(self._sessions.pop(handle, {}).values()) + self._runners.pop(handle, [])
        spare = self._spare.pop(handle, None)
        if spare is not None:
            sessions.append(spare)
        self._session_locks.pop(handle, None)
        self._probes.pop(handle, None)
        inbox = self._inboxes.pop(handle, None)
        for session in sessions:
            await session.close()
        await self._run(self._remove_sync, handle)
        if inbox is not None:
            await self._run(shutil.rmtree, inbox, True)

    async def list(self) -> list[BackendSandbox]:
        try:
            containers = await self._run(
                self._client.api.containers,
                all=True,
                filters={"label": [f"{LABEL_INSTANCE}={self._options.instance}", f"{LABEL_MANAGED}=true"]},
            )
        except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
            raise TransientBackendError(f"cannot list containers: {e}") from e
        out = []
        for c in containers:
            labels = c.get("Labels") or {}
            out.append(
                BackendSandbox(
                    sandbox_id=labels.get(LABEL_SANDBOX, ""),
                    pool=labels.get(LABEL_POOL, ""),
                    handle=str(c["Id"]),
                    running=c.get("State") == "running",
                    labels=labels,
                )
            )
        if self._options.inbox_dir is not None:
            await self._run(self._sweep_inboxes, {s.sandbox_id for s in out})
        return out

    def _inbox_path(self, sandbox_id: str) -> Path | None:
        root = self._options.inbox_dir
        return None if root is None or not sandbox_id else root / sandbox_id

    def _sweep_inboxes(self, keep: set[str]) -> None:
        """Removes inboxes whose sandbox is gone (a crash between remove and
        cleanup, or a container removed behind our back)."""
        root = self._options.inbox_dir
        assert root is not None
        cutoff = time.time() - _INBOX_GRACE_SECONDS
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(root):
                if entry.name not in keep and entry.is_dir(follow_symlinks=False):
                    with contextlib.suppress(OSError):
                        if entry.stat(follow_symlinks=False).st_mtime < cutoff:
                            shutil.rmtree(entry.path, ignore_errors=True)

    async def alive(self, handles: builtins.list[str]) -> set[str]:
        """One ``containers list`` call for every handle asked about."""
        try:
            running = await self._run(
                self._client.api.containers,
                quiet=True,
                filters={
                    "label": [f"{LABEL_INSTANCE}={self._options.instance}", f"{LABEL_MANAGED}=true"],
                    "status": "running",
                },
            )
        except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
            raise TransientBackendError(f"cannot list containers: {e}") from e
        ids = {str(c["Id"]) for c in running}
        return {h for h in handles if h in ids}

    async def close(self) -> None:
        await asyncio.gather(*self._cleanups, return_exceptions=True)
        for sessions in self._sessions.values():
            for session in sessions.values():
                await session.close()
        for session in self._spare.values():
            await session.close()
        for runners in self._runners.values():
            for runner in runners:
                await runner.close()
        self._runners.clear()
        self._sessions.clear()
        self._spare.clear()
        await self._run(self._client.close)
        self._pool.shutdown(wait=False)

    async def _is_running(self, handle: str) -> bool:
        try:
            state = await self._run(self._client.api.inspect_container, handle)
        except docker.errors.NotFound:
            return False
        except (docker.errors.DockerException, requests.exceptions.RequestException):
            # Cannot tell; do not declare it lost on a hiccup.
            return True
        return bool(state.get("State", {}).get("Running"))

    # -- Runtime ------------------------------------------------------------

    async def _probe(self, handle: str) -> ContainerProbe | None:
        if handle not in self._probes:
            # Adopted after a restart: look the container's pid up once.
            try:
                state = await self._run(self._client.api.inspect_container, handle)
                pid = int(state.get("State", {}).get("Pid") or 0)
            except (docker.errors.DockerException, requests.exceptions.RequestException):
                pid = 0
            self._probes[handle] = ContainerProbe.open(pid) if pid else None
        return self._probes[handle]

    async def host_workspace(self, handle: str) -> HostWorkspace | None:
        # Under another runtime (gVisor, Kata) the container's files are not
        # what the host sees below its init process's root.
        if not self._options.host_workspaces or self._options.runtime not in (None, "", "runc"):
            return None
        probe = await self._probe(handle)
        if probe is None:
            return None
        return await self._run(HostWorkspace.open, probe.pid, handle)

    async def _target(self, handle: str) -> Target:
        probe = await self._probe(handle)

        async def alive() -> bool:
            return await self._is_running(handle)

        async def kill(var: str, tag: str) -> None:
            if probe is not None:
                # From the host: works even when the sandbox cannot fork.
                await self._run(probe.kill_tagged, f"{var}={tag}".encode())
            else:
                await kill_tree(self._raw, handle, var, tag)

        return Target(self._raw, handle, self._options.user, alive, kill, self._spawn, probe)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)

    async def usage(self, handle: str) -> SandboxUsage:
        probe = await self._probe(handle)
        if probe is None:
            if not await self._is_running(handle):
                raise SandboxLost("the sandbox's container is gone")
            return SandboxUsage()
        return probe.usage()

    async def exec(self, handle: str, spec: ExecSpec) -> AsyncIterator[ExecEvent]:
        try:
            if not spec.session and len(spec.stdin) > _RUNNER_STDIN_MAX:
                async for event in run_oneshot(await self._target(handle), spec):
                    yield event
                return
            if not spec.session:
                # A fresh process without an engine exec: a subshell forked by
                # an idle shell of this sandbox (about 1 ms instead of ~40).
                runner = await self._take_runner(handle)
                try:
                    async for event in runner.run(_in_subshell(spec)):
                        yield event
                finally:
                    await self._give_runner(handle, runner)
                return
            session = await self._session(handle, spec.session)
            async for event in session.run(spec):
                yield event
        except (NotFound, SandboxLost):
            yield ExecResult(
                ExecOutcome.SANDBOX_LOST, -1, 0.0, detail="the sandbox is not running", sandbox_gone=True
            )

    async def _take_runner(self, handle: str) -> ShellSession:
        idle = self._runners.setdefault(handle, [])
        while idle:
            runner = idle.pop()
            if not runner.dead:
                return runner
        spare = self._spare.pop(handle, None)
        if spare is not None and not spare.dead:
            return spare
        runner = ShellSession(await self._target(handle), {})
        await runner.start()
        return runner

    async def _give_runner(self, handle: str, runner: ShellSession) -> None:
        idle = self._runners.get(handle)
        if idle is not None and not runner.dead and len(idle) < _IDLE_RUNNERS:
            idle.append(runner)
        else:
            await runner.close()

    async def _session(self, handle: str, name: str) -> ShellSession:
        lock = self._session_locks.setdefault(handle, asyncio.Lock())
        async with lock:
            sessions = self._sessions.setdefault(handle, {})
            session = sessions.get(name)
            if session is not None and not session.dead:
                return session
            spare = self._spare.pop(handle, None)
            if spare is not None and not spare.dead:
                session = spare
            else:
                session = ShellSession(await self._target(handle), {})
                await session.start()
            sessions[name] = session
            return session

    async def put_tar(self, handle: str, dest: str, chunks: AsyncIterator[bytes]) -> None:
        head = bytearray()
        stream = aiter(chunks)
        async for chunk in stream:
            head += chunk
            if len(head) > _RUNNER_STDIN_MAX:
                break
        else:
            # Small (the usual agent turn): extracted by a forked shell, no engine exec.
            await self._put_small_tar(handle, dest, bytes(head))
            return

        async def rest() -> AsyncIterator[bytes]:
            yield bytes(head)
            async for chunk in stream:
                yield chunk

        await self._put_tar_by_exec(handle, dest, rest())

    async def _put_small_tar(self, handle: str, dest: str, data: bytes) -> None:
        await self._put_by_shell(handle, dest, put_tar_argv(dest), data)

    # -- StagedTars ---------------------------------------------------------

    def staging_dir(self) -> Path | None:
        root = self._options.inbox_dir
        # Beside the inboxes: same filesystem, so handing a file over is a link.
        return None if root is None else root.with_name(root.name + "-staged")

    async def stage_tar(self, handle: str, path: Path) -> str | None:
        inbox = await self._inbox(handle)
        if inbox is None:
            return None
        name = secrets.token_hex(8) + ".tar"
        try:
            await self._run(os.link, path, inbox / name)
        except OSError:
            return None  # an inbox gone missing or on another filesystem: stream it
        return f"{INBOX}/{name}"

    async def unstage_tar(self, handle: str, staged: str) -> None:
        inbox = self._inboxes.get(handle)
        name = staged.rsplit("/", 1)[-1]
        if inbox is None or not staged.startswith(INBOX + "/") or "/" in name or not name.endswith(".tar"):
            return
        with contextlib.suppress(OSError):
            await self._run(os.unlink, inbox / name)

    async def _inbox(self, handle: str) -> Path | None:
        if handle not in self._inboxes:
            # Adopted after a restart: find its inbox mount once.
            try:
                state = await self._run(self._client.api.inspect_container, handle)
            except (docker.errors.DockerException, requests.exceptions.RequestException):
                return None
            sources = [m.get("Source") for m in state.get("Mounts") or [] if m.get("Destination") == INBOX]
            self._inboxes[handle] = Path(sources[0]) if sources and sources[0] else None
        return self._inboxes[handle]

    async def _put_by_shell(self, handle: str, dest: str, argv: builtins.list[str], data: bytes) -> None:
        """Runs an extraction through a forked sandbox shell (no engine exec)."""
        spec = ExecSpec(argv=tuple(argv), stdin=data, timeout=300, output_limit=65536)
        stderr = bytearray()
        result: ExecResult | None = None
        async for event in self.exec(handle, spec):
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

    async def _put_tar_by_exec(self, handle: str, dest: str, chunks: AsyncIterator[bytes]) -> None:
        exec_id = await self._raw.exec_create(
            handle, put_tar_argv(dest), stdin=True, env={}, workdir=WORKSPACE, user=self._options.user
        )
        channel = await self._raw.exec_start(exec_id)
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

    async def get_tar(self, handle: str, base: str, paths: tuple[str, ...]) -> AsyncIterator[bytes]:
        exec_id = await self._raw.exec_create(
            handle, get_tar_argv(base, paths), stdin=False, env={}, workdir=WORKSPACE, user=self._options.user
        )
        channel = await self._raw.exec_start(exec_id)
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
        if code != 0:
            raise BackendError(f"reading files failed: {message or f'exit {code}'}")
