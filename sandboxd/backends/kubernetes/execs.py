"""Exec in sandbox Pods: the API server's exec stream (wsexec) as the
transport of sandboxd.backends.session. Limits are named afterwards by the
backend from the Pod's own counters (limits.py), not per stream.

The control plane cannot reach a node's cgroups, so a stream's processes are
contained from inside: it starts behind REAPER (its first process a child
subreaper, which whatever detaches below it is re-parented to), and a kill
is TREE_KILL, run by an exec of its own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence

from sandboxd.backends.base import ExecEvent, ExecOutcome, ExecResult, ExecSpec
from sandboxd.backends.execstream import RootPidLine
from sandboxd.backends.exectransport import Explain, Frame, Spawn, unchanged
from sandboxd.backends.kubernetes.cache import PodCache
from sandboxd.backends.kubernetes.client import KubeClient, KubeError, unavailable, unreachable
from sandboxd.backends.kubernetes.limits import no_process_slot
from sandboxd.backends.kubernetes.wsexec import ExecStream, wrap_argv
from sandboxd.backends.session import OneShot
from sandboxd.backends.shell import Tree, reaper_argv, tree_kill_argv

# How long a kill or a liveness probe may wait on its own exec's output.
_PROBE_READ = 10.0


class PodExec:
    """One exec into one sandbox Pod's container (an ExecTransport); the
    Pod's liveness comes from the backend's watch cache."""

    def __init__(self, client: KubeClient, cache: PodCache, namespace: str, pod: str, container: str) -> None:
        self._client = client
        self._cache = cache
        self._namespace = namespace
        self._pod = pod
        self._container = container
        self._stream: ExecStream | None = None
        self._pid_line = RootPidLine()

    @property
    def clock(self) -> bool:
        """Always: TREE_KILL tells a session command's processes by start time."""
        return True

    async def open(self, argv: Sequence[str], *, env: Mapping[str, str], cwd: str, stdin: bool) -> None:
        """Opens the exec, ``argv`` wrapped to start in ``cwd`` with ``env``
        (Kubernetes exec has neither) behind REAPER. Raises KubeError."""
        self._stream = await ExecStream.open(
            self._client,
            self._namespace,
            self._pod,
            self._container,
            reaper_argv(wrap_argv(argv, cwd, env)),
            stdin=stdin,
        )

    def _opened(self) -> ExecStream:
        if self._stream is None:
            raise ConnectionError("the exec stream is not open")
        return self._stream

    async def write(self, data: bytes) -> None:
        """Sends bytes on the stdin channel."""
        await self._opened().write(data)

    async def close_stdin(self) -> None:
        """Closes the stdin channel (v5 streams; with v4 it stays open)."""
        await self._opened().close_stdin()

    async def read(self, timeout: float) -> Frame | TimeoutError | None:
        """The next stdout/stderr frame (see ExecStream.next_frame), the
        root's pid line (REAPER's) taken off stdout."""
        return await self._pid_line.read(self._opened().next_frame, timeout)

    async def exit_status(self) -> tuple[int | None, str]:
        """The exit code and failure message from the stream's status frame."""
        if self._stream is None:
            return None, ""
        return self._stream.exit_code, self._stream.failure

    async def kill(self, tree: Tree) -> None:
        """Kills the tree through an exec of its own (TREE_KILL)."""
        await self._run(tree_kill_argv(tree, self._pid_line.pid))

    async def settle(self) -> None:
        """Nothing to do: TREE_KILL tells earlier commands' processes by start time."""

    def running(self) -> bool:
        """Whether the watch cache has the Pod running (not being deleted)."""
        pod = self._cache.get(self._pod)
        return pod is not None and pod.running

    async def alive(self) -> bool:
        """running(), and a new exec still starts in the container: the cache
        hears of a container that died under a command only a while later."""
        if not self.running():
            return False
        code = await self._run(["true"])
        return code != 1 and self.running()

    async def _run(self, argv: list[str]) -> int:
        """Runs ``argv`` as is by an exec of its own: 0 if it exited 0, 1 if
        it did not start (the Pod or its container is gone) or failed, -1
        if that says nothing about the container (the API server did not
        answer, or the container's process table is full)."""
        try:
            stream = await ExecStream.open(
                self._client, self._namespace, self._pod, self._container, argv, stdin=False
            )
        except KubeError as e:
            return -1 if unreachable(e) or no_process_slot(str(e)) else 1
        try:
            while isinstance(await stream.next_frame(_PROBE_READ), tuple):
                pass
        finally:
            await stream.close()
        if stream.exit_code == 0:
            return 0
        return -1 if no_process_slot(stream.failure) else 1

    def watch_limits(self) -> Explain:
        """Nothing per command: the backend names limits after the fact."""
        return unchanged

    async def close(self) -> None:
        """Closes the WebSocket; the status frame stays readable."""
        if self._stream is not None:
            await self._stream.close()


async def run_oneshot(transport: PodExec, spec: ExecSpec, spawn: Spawn) -> AsyncIterator[ExecEvent]:
    """Runs ``spec`` as an exec of its own. A stream that does not open is
    SANDBOX_LOST, except while the Pod runs and the API server does not
    answer: then the command never started, which raises UNAVAILABLE."""
    command = OneShot(transport, spec, spawn)
    try:
        await command.start()
    except KubeError as e:
        alive = transport.running()
        if alive and unreachable(e):
            # Not an outcome of the command: the caller gets UNAVAILABLE, and
            # the sandbox and its lease are kept.
            raise unavailable(e, "the command did not start") from e
        yield ExecResult(ExecOutcome.SANDBOX_LOST, -1, 0.0, detail=str(e), sandbox_gone=not alive)
        return
    async for event in command.follow():
        yield event
