"""Sandboxes as containers on a Docker engine: the backend port.

Where a sandbox runs (its container: spec, create, remove, list, adoption by
labels, capacity, limits, its inbox) is containers.py; files in and out (tar
streams, archives staged in the inbox) are files.py. This module composes
them with what runs inside: the shells held in each sandbox (shells.py: the
spare that is its health check, named sessions, idle shells that fork
one-shot commands), engine execs of their own (execs.py, over the async raw
client, rawapi), live checkpoints (live.py, on checkpoints.py), and the host's view of a
container (usage, its workspace in place).
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import functools
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from sandboxd.backends.background import Background
from sandboxd.backends.base import (
    GVISOR,
    ROOT_USER,
    RUNC,
    BackendSandbox,
    ExecEvent,
    ExecOutcome,
    ExecResult,
    ExecSpec,
    HostFacts,
    Limits,
    SandboxSpec,
    SandboxUsage,
)
from sandboxd.backends.docker.cgroups import ContainerProbe
from sandboxd.backends.docker.checkpoints import Checkpoints
from sandboxd.backends.docker.containers import Containers
from sandboxd.backends.docker.containerspec import INBOX, DockerOptions
from sandboxd.backends.docker.egress import DockerEgress
from sandboxd.backends.docker.execs import EngineExec, run_oneshot
from sandboxd.backends.docker.files import ContainerFiles
from sandboxd.backends.docker.hostcap import host_facts
from sandboxd.backends.docker.images import DockerImages
from sandboxd.backends.docker.live import DockerLiveCheckpoints
from sandboxd.backends.docker.model_routes import DockerModelRoutes
from sandboxd.backends.docker.rawapi import EngineAddress, RawEngine
from sandboxd.backends.docker.recycling import DockerRecycling
from sandboxd.backends.docker.runsc_exec import RunscExec, find_runsc
from sandboxd.backends.docker.shells import Shells
from sandboxd.backends.docker.subshell import in_subshell
from sandboxd.backends.hostfs import HostWorkspace
from sandboxd.backends.hostwrite import write_files
from sandboxd.backends.network.proxy import EgressLimits
from sandboxd.backends.session import SessionClosed, ShellSession
from sandboxd.errors import BackendError, NotFound, SandboxLost

T = TypeVar("T")

# Larger stdin goes through a real engine exec rather than the shell's command line.
_RUNNER_STDIN_MAX = 64 << 10
# How long a failed or cancelled create waits for its cleanup before it
# reports; the cleanup goes on in the background.
_CLEANUP_WAIT_SECONDS = 5.0


# How the engine names ROOT_USER: uid and gid 0. The container keeps its
# capability set (none), no-new-privileges, read-only root and limits.
_ROOT_ENGINE_USER = "0:0"


class _RootEngineExec(EngineExec):
    """An engine exec as uid 0 (ExecSpec.user == ROOT_USER). Without
    capabilities a process may signal only its own uid's processes, so where
    the host cannot kill the tree, the killer runs as uid 0 too."""

    def __init__(self, engine: RawEngine, container: str, **kwargs: Any) -> None:
        super().__init__(engine, container, user=_ROOT_ENGINE_USER, kill_user=_ROOT_ENGINE_USER, **kwargs)


class DockerBackend(DockerImages, DockerRecycling, DockerModelRoutes, DockerLiveCheckpoints):
    """The backend port on one Docker engine: containers and files composed
    with the shells and execs that run inside the sandboxes; its images
    (pulls, builds, removal) are DockerImages', its live checkpoints
    DockerLiveCheckpoints'."""

    def __init__(self, options: DockerOptions) -> None:
        self._options = options
        self._containers = Containers(options)
        self._pool = self._containers.pool
        self._init_images(
            self._containers.api, local=not options.base_url or options.base_url.startswith("unix://")
        )
        self._raw = RawEngine(EngineAddress.parse(options.base_url))
        self._files = ContainerFiles(
            self._raw,
            self._containers,
            # The engine's default for an exec: the container's own user,
            # which is the sandbox's (its uid of its own).
            user="",
            inbox_dir=options.inbox_dir,
            exec_in=self.exec,
            shell_stdin_max=_RUNNER_STDIN_MAX,
        )
        self._background = Background()
        self._shells = Shells(self._transport, self._kept, self._spawn)
        self._probes: dict[str, ContainerProbe | None] = {}
        # Each sandbox's isolation runtime, looked up once for adopted ones.
        self._runtimes: dict[str, str] = {}
        # gVisor sandboxes started without the keeper (SandboxSpec.live_snapshots).
        self._keeperless: set[str] = set()
        address = options.base_url or ""
        self._checkpoints = Checkpoints(self._containers, local=not address or address.startswith("unix://"))
        # Paused containers: thawed before removal (the engine cannot remove a paused runsc one).
        self._paused: set[str] = set()
        # Sandboxes whose shells could not open their FIFOs: the engine stream for them.
        self._no_pipes: set[str] = set()
        # gVisor sandboxes' `runsc exec` (None: not gVisor, or not from this host).
        self._runsc: dict[str, RunscExec | None] = {}
        self._egress = DockerEgress(
            local=not address or address.startswith("unix://"),
            hosts=options.egress_hosts,
            limits=EgressLimits(
                max_connections=options.egress_max_connections,
                bytes_per_second=options.egress_bytes_per_second,
            ),
            instance=options.instance,
        )

    async def _run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))

    # -- Deployment ---------------------------------------------------------

    async def ping(self) -> None:
        await self._containers.ping()

    async def image_exists(self, image: str) -> bool:
        return await self._containers.image_exists(image)

    async def create(self, spec: SandboxSpec) -> str:
        spec = self._egress.prepare(spec)
        creating = asyncio.ensure_future(self._containers.create(spec))
        session: ShellSession | None = None
        try:
            handle, pid = await asyncio.shield(creating)
            self._runtimes[handle] = spec.runtime
            if spec.runtime == GVISOR and not spec.live_snapshots:
                self._keeperless.add(handle)
            # Under gVisor the host's view of the container (its cgroup's
            # pids, /proc/<pid>/root) is gVisor's own, not the sandbox's.
            host_view = pid and spec.runtime != GVISOR
            self._probes[handle] = probe = ContainerProbe.open(pid) if host_view else None
            if probe is not None:
                probe.writable_root = spec.writable_root
            # Linked before any command runs: a sandbox never sees its network half-made.
            await self._egress.attach(spec, handle, pid)
            # The keeper (if any) has started the spare's shell with the sandbox.
            session = await self._shells.new(handle, env=spec.env, first=True)
            await self._shells.ready_spare(handle, session)
            return handle
        except BaseException:
            self._egress.abandon(spec.sandbox_id)
            # Failed or cancelled half-way: the container must not outlive us,
            # even one the engine is still creating in the worker thread.
            cleanup = self._background.spawn(self._cleanup_create(creating, spec.sandbox_id, session))
            # Bounded: on a wedged engine the cleanup itself hangs, and the
            # caller must hear of the failure now (it books the sandbox as in
            # doubt and settles it by listing once the engine answers).
            await asyncio.wait({cleanup}, timeout=_CLEANUP_WAIT_SECONDS)
            raise

    async def _cleanup_create(
        self, creating: asyncio.Future[tuple[str, int]], sandbox_id: str, session: ShellSession | None
    ) -> None:
        with contextlib.suppress(BaseException):
            await creating
        if session is not None:
            await session.close()
        if creating.done() and not creating.cancelled() and creating.exception() is None:
            await self._egress.detach(creating.result()[0])
        await self._containers.discard(sandbox_id)

    async def capacity(self) -> tuple[int, int]:
        return await self._containers.capacity()

    async def host_facts(self) -> HostFacts:
        """The engine host's limits, with per-container overheads measured
        on live sandboxes where this process sees the host."""
        info = await self._containers.engine_info()
        address = self._options.base_url or ""
        local = not address or address.startswith("unix://")
        pids = [p.pid for p in self._probes.values() if p is not None]
        return await self._run(host_facts, info, local, pids)

    async def update_limits(self, handle: str, limits: Limits) -> None:
        await self._containers.update_limits(handle, limits, await self._runtime(handle))

    async def runtimes(self) -> frozenset[str]:
        """RUNC, and GVISOR when the engine has gVisor's runtime registered."""
        registered = (await self._containers.engine_info()).get("Runtimes") or {}
        return frozenset({RUNC, GVISOR} if self._options.gvisor_runtime in registered else {RUNC})

    async def _runtime(self, handle: str) -> str:
        if handle not in self._runtimes:
            runtime, keeper = await self._containers.runtime_of(handle)
            if runtime == GVISOR and not keeper:
                self._keeperless.add(handle)
            self._runtimes[handle] = runtime or RUNC
        return self._runtimes[handle]

    async def _kept(self, handle: str) -> bool:
        """Whether the sandbox's shells are kept by its keeper (a gVisor one
        started for live snapshots)."""
        return await self._runtime(handle) == GVISOR and handle not in self._keeperless

    async def destroy(self, handle: str) -> None:
        sessions, kept = self._shells.release(handle)
        self._probes.pop(handle, None)
        self._no_pipes.discard(handle)
        self._runsc.pop(handle, None)
        if not kept:
            await asyncio.gather(*(session.close() for session in sessions))
        if handle in self._paused:
            self._paused.discard(handle)
            with contextlib.suppress(BackendError):
                await self._checkpoints.resume(handle)
        self._runtimes.pop(handle, None)
        self._keeperless.discard(handle)
        await self._containers.remove(handle)
        await self._egress.detach(handle)
        await self._raw.cut(handle)
        if kept:
            await asyncio.gather(*(session.close() for session in sessions))

    async def list(self) -> list[BackendSandbox]:
        found = await self._containers.list()
        for i, sandbox in enumerate(found):
            if sandbox.paused and sandbox.handle not in self._paused:
                # Paused by a control plane that has since restarted: this one
                # knows nothing of the pause, so the sandbox runs again.
                with contextlib.suppress(BackendError):
                    await self._checkpoints.resume(sandbox.handle)
                    found[i] = replace(sandbox, paused=False)
        await self._egress.relink(found, self._containers.host_pid)
        return found

    async def alive(self, handles: builtins.list[str]) -> set[str]:
        """One ``containers list`` call for every handle asked about."""
        return await self._containers.alive(handles)

    def network_refusal(self, runtime: str) -> str | None:
        return self._egress.refusal(runtime)

    async def root_refusal(self, runtime: str) -> str | None:
        """The same for every runtime: gVisor's own root overlay lives in the bounded layer too."""
        return await self._containers.root_refusal()

    async def narrowing_refusal(self, runtime: str) -> str | None:
        """None: a sandbox's own proxy and resolver take new rules at once (DockerEgress.narrow)."""
        return None

    async def narrow_egress(self, handle: str, rules: tuple[str, ...]) -> None:
        await self._egress.narrow(handle, rules)

    def expect_narrowed(self, rules: Mapping[str, tuple[str, ...]]) -> None:
        self._egress.expect(rules)

    async def close(self) -> None:
        await self._egress.close()
        await self._background.close()
        await self._shells.close()
        await self._containers.close()
        self._close_images()

    async def _is_running(self, handle: str) -> bool:
        return await self._containers.is_running(handle)

    # -- SandboxUsers ---------------------------------------------------------

    def sandbox_user(self, handle: str) -> tuple[int, int]:
        """From memory: filled by create and by every listing (adoption)."""
        user = self._containers.known_user(handle)
        if user is None:
            raise NotFound(f"sandbox container {handle[:12]} is not known to this control plane")
        return user

    # -- Runtime ------------------------------------------------------------

    async def _probe(self, handle: str) -> ContainerProbe | None:
        if handle not in self._probes:
            # Adopted after a restart: look the container's pid up once.
            pid = await self._containers.host_pid(handle)
            host_view = pid and await self._runtime(handle) != GVISOR
            self._probes[handle] = probe = ContainerProbe.open(pid) if host_view else None
            if probe is not None:
                probe.writable_root = handle in self._containers.writable_roots
        return self._probes[handle]

    async def write_in_place(self, handle: str, files: builtins.list[tuple[str, bytes, int]]) -> bool:
        uid, gid = await self._containers.user_of(handle)
        view = await self.host_workspace(handle)
        if view is None:
            return False
        with view:
            return await self._run(write_files, view.fd, files, uid, gid)

    async def host_workspace(self, handle: str) -> HostWorkspace | None:
        # Under another runtime (gVisor, Kata) the container's files are not
        # what the host sees below its init process's root.
        if not self._options.host_workspaces or self._options.runtime not in (None, "", "runc"):
            return None
        if await self._runtime(handle) == GVISOR:
            return None
        probe = await self._probe(handle)
        if probe is None:
            return None
        return await self._run(HostWorkspace.open, probe.pid, handle)

    async def _root_transport(self, handle: str) -> EngineExec:
        """As _transport, as uid 0 (ROOT_USER)."""
        return _RootEngineExec(
            self._raw,
            handle,
            probe=await self._probe(handle),
            is_running=self._is_running,
            executor=self._pool,
        )

    async def put_tar_as(self, handle: str, dest: str, chunks: AsyncIterator[bytes], user: str) -> None:
        """put_tar as ``user``; root's files are extracted by a uid 0 engine exec."""
        if user == ROOT_USER:
            await self._files.put_tar_by_exec(handle, dest, chunks, engine_user=_ROOT_ENGINE_USER)
        else:
            await self.put_tar(handle, dest, chunks)

    def get_tar_as(self, handle: str, base: str, paths: tuple[str, ...], user: str) -> AsyncIterator[bytes]:
        """get_tar as ``user``."""
        engine_user = _ROOT_ENGINE_USER if user == ROOT_USER else ""
        return self._files.get_tar(handle, base, paths, engine_user=engine_user)

    async def _transport(self, handle: str, kept: tuple[str, bool] | None = None) -> EngineExec:
        """A fresh exec stream into the sandbox, for one session or command;
        a shell's stdio goes over FIFOs in the inbox where the host sees the
        sandbox's processes (sandboxd.backends.docker.pipes); ``kept``: see
        EngineExec."""
        probe = await self._probe(handle)
        piped = probe is not None and self._options.session_pipes and handle not in self._no_pipes
        inbox = await self._containers.find_inbox(handle) if piped else None
        runsc = None
        if probe is None and self._options.session_pipes and handle not in self._no_pipes:
            runsc = await self._runsc_of(handle)
        uid, gid = await self._containers.user_of(handle)
        return EngineExec(
            self._raw,
            handle,
            user=f"{uid}:{gid}",
            probe=probe,
            is_running=self._is_running,
            executor=self._pool,
            pipes=(inbox, INBOX) if inbox is not None else None,
            pipes_refused=functools.partial(self._no_pipes.add, handle),
            runsc=runsc,
            kept=kept,
        )

    async def _runsc_of(self, handle: str) -> RunscExec | None:
        """How to start shells in a gVisor sandbox from the host (looked up
        once per sandbox); None for other runtimes or where this host cannot."""
        if handle not in self._runsc:
            found = None
            if await self._runtime(handle) == GVISOR:
                pid = await self._containers.host_pid(handle)
                # A runsc that cannot serve it fails its first shell, which
                # then falls back to the engine stream (EngineExec).
                found = await self._run(find_runsc, pid, handle)
            self._runsc[handle] = found
        return self._runsc[handle]

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        self._background.spawn(coro)

    async def usage(self, handle: str) -> SandboxUsage:
        probe = await self._probe(handle)
        if probe is None:
            if not await self._is_running(handle):
                raise SandboxLost("the sandbox's container is gone")
            return SandboxUsage()
        return probe.usage()

    async def exec(self, handle: str, spec: ExecSpec) -> AsyncIterator[ExecEvent]:
        try:
            if spec.user == ROOT_USER:
                # An engine exec of its own: no idle root shells are kept.
                async for event in run_oneshot(await self._root_transport(handle), spec, self._spawn):
                    yield event
                return
            if not spec.session and len(spec.stdin) > _RUNNER_STDIN_MAX:
                async for event in run_oneshot(await self._transport(handle), spec, self._spawn):
                    yield event
                return
            for attempt in range(2):
                try:
                    if not spec.session:
                        # A fresh process without an engine exec: a subshell forked by
                        # an idle shell of this sandbox (about 1 ms instead of ~40).
                        runner = await self._shells.take_runner(handle)
                        try:
                            async for event in runner.run(in_subshell(spec)):
                                yield event
                        finally:
                            await self._shells.give_runner(handle, runner)
                        return
                    session = await self._shells.session(handle, spec.session)
                    async for event in session.run(spec):
                        yield event
                    return
                except SessionClosed:
                    # Closed while the command waited for it (a command
                    # abandoned before could not be stopped): a new shell.
                    if attempt:
                        raise
        except (NotFound, SandboxLost):
            yield ExecResult(
                ExecOutcome.SANDBOX_LOST, -1, 0.0, detail="the sandbox is not running", sandbox_gone=True
            )

    async def put_tar(self, handle: str, dest: str, chunks: AsyncIterator[bytes]) -> None:
        await self._files.put_tar(handle, dest, chunks)

    # -- StagedTars ---------------------------------------------------------

    def staging_dir(self) -> Path | None:
        return self._files.staging_dir()

    async def stage_tar(self, handle: str, path: Path) -> str | None:
        return await self._files.stage_tar(handle, path)

    async def unstage_tar(self, handle: str, staged: str) -> None:
        await self._files.unstage_tar(handle, staged)

    def get_tar(self, handle: str, base: str, paths: tuple[str, ...]) -> AsyncIterator[bytes]:
        return self._files.get_tar(handle, base, paths)
