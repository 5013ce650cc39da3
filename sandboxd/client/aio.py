"""The async client.

    async with AsyncClient("127.0.0.1:50051") as client:
        async with client.acquire("default") as sb:
            result = await sb.exec("echo hi")
        async with client.acquire_group("default", n=8) as group:
            results = await asyncio.gather(*(s.exec(["python3", "-V"]) for s in group))

A lease held through a context manager is heartbeated in the background and
released on exit, whatever happens inside. The client's calls come in groups
by service (``pools``, ``execs``, ``files``, ``snapshots``); the leases, the
sandboxes they hold and the calls that hand them out are here.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc.aio

from sandboxd import errors
from sandboxd.client.execs import ExecCalls, ExecResult
from sandboxd.client.files import FileCalls
from sandboxd.client.pools import PoolCalls
from sandboxd.client.releasing import release_lease
from sandboxd.client.rpc import rpc_errors, translate
from sandboxd.client.snapshots import SnapshotCalls
from sandboxd.v1 import common_pb2, sandboxes_pb2, snapshots_pb2

__all__ = ["AsyncClient", "ExecResult", "HeldLease", "Lease", "Sandbox"]

# Acquire failures after which the server may have granted a lease all the same.
_OUTCOME_UNKNOWN = frozenset(
    {grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE}
)
# Seconds one try of a background release may take.
_RELEASE_DEADLINE = 10.0


def _request_id() -> str:
    """A fresh id for one Acquire or Restore."""
    return "rq-" + secrets.token_hex(12)


class Sandbox:
    """A leased sandbox. Its methods are shortcuts for the client's."""

    def __init__(self, client: AsyncClient, info: common_pb2.Sandbox, lease_id: str) -> None:
        self.client = client
        self.info = info
        self.id = info.id
        self.lease_id = lease_id

    def __repr__(self) -> str:
        return f"Sandbox({self.id!r}, pool={self.info.pool!r})"

    async def exec(self, command: str | Sequence[str], **kwargs: Any) -> ExecResult:
        """Runs ``command`` here; keywords as AsyncClient.exec."""
        return await self.client.exec(self.id, command, **kwargs)

    def exec_stream(self, command: str | Sequence[str], **kwargs: Any) -> AsyncIterator[tuple[str, Any]]:
        """Streams ``command``'s output here; as AsyncClient.exec_stream."""
        return self.client.exec_stream(self.id, command, **kwargs)

    async def write_files(self, files: Mapping[str, bytes | str], *, user: str = "") -> int:
        """Writes ``files`` (path -> content) here; returns the bytes written."""
        return await self.client.write_files(self.id, files, user=user)

    async def write_file(self, path: str, content: bytes | str, mode: int = 0, *, user: str = "") -> int:
        """Writes one file here (with ``mode``, if given)."""
        modes = {path: mode} if mode else None
        return await self.client.write_files(self.id, {path: content}, modes=modes, user=user)

    async def read_files(self, paths: Sequence[str], *, user: str = "") -> dict[str, bytes]:
        """Reads files from here: path -> content."""
        return await self.client.read_files(self.id, paths, user=user)

    async def read_file(self, path: str, *, user: str = "") -> bytes:
        """Reads one file from here."""
        return (await self.client.read_files(self.id, [path], user=user))[path]

    async def upload_dir(self, local: str | Path, dest: str = ".") -> int:
        """Uploads a local directory here, under ``dest``."""
        return await self.client.upload_dir(self.id, local, dest)

    async def download_dir(self, path: str = ".") -> bytes:
        """A tar of a directory here, paths relative to it."""
        return await self.client.download_dir(self.id, path)

    async def release(self) -> None:
        """Releases this sandbox alone; the rest of its lease stays held."""
        await self.client.release(self.lease_id, [self.id])

    async def snapshot(self, **kwargs: Any) -> snapshots_pb2.Snapshot:
        """Snapshots this sandbox; keywords as AsyncClient.snapshot."""
        return await self.client.snapshot(self.id, **kwargs)

    async def pause(self) -> common_pb2.Sandbox:
        """Freezes this sandbox's processes (gVisor pools); the lease stays held."""
        return await self.client.pause(self.id)

    async def resume(self) -> common_pb2.Sandbox:
        """Thaws this sandbox after ``pause``."""
        return await self.client.resume(self.id)

    async def keep(self, command: str) -> None:
        """Starts the one-line shell ``command`` as a process of the
        sandbox's init tree (gVisor pools), in the workspace with its output
        discarded, tied to no session. A live snapshot carries it, as it
        does what sessions and one-shot commands started."""
        await self.client.keep(self.id, command)


class Lease:
    """Sandboxes held under one lease (a group when there are several)."""

    def __init__(self, client: AsyncClient, response: sandboxes_pb2.AcquireResponse) -> None:
        self.client = client
        self.id = response.lease.id
        self.ttl = response.lease.ttl_seconds
        self.network = list(response.lease.network)
        """Its network rules when narrower than the pool's (empty: the pool's, or none)."""
        self.no_network = response.lease.no_network
        """Its sandboxes have no egress at all (``no_network``)."""
        self.sandboxes = [Sandbox(client, s, self.id) for s in response.sandboxes]

    def __iter__(self) -> Iterator[Sandbox]:
        return iter(self.sandboxes)

    def __len__(self) -> int:
        return len(self.sandboxes)

    def __getitem__(self, i: int) -> Sandbox:
        return self.sandboxes[i]

    async def heartbeat(self, ttl: float = 0.0) -> None:
        """Extends the lease: ``ttl`` seconds from now (0 = its own TTL)."""
        await self.client.heartbeat(self.id, ttl)

    async def release(self) -> None:
        """Releases the lease and all its sandboxes."""
        await self.client.release(self.id)

    async def set_network(self, network: Sequence[str] = (), *, no_network: bool = False) -> None:
        """Changes the lease's network rules now (``AsyncClient.set_lease_network``)."""
        lease = await self.client.set_lease_network(self.id, network, no_network=no_network)
        self.network, self.no_network = list(lease.network), lease.no_network


class HeldLease:
    """What ``acquire`` and ``acquire_group`` return: an async context manager
    that takes the lease on entry, heartbeats it meanwhile, releases it on exit."""

    def __init__(
        self, client: AsyncClient, request: sandboxes_pb2.AcquireRequest, timeout: float | None, single: bool
    ) -> None:
        self._client = client
        self._request = request
        self._timeout = timeout
        self._single = single
        self._lease: Lease | None = None
        self._beat: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Any:
        self._lease = await self._client._acquire(self._request, self._timeout)
        self._beat = asyncio.create_task(self._heartbeat(self._lease))
        return self._lease.sandboxes[0] if self._single else self._lease

    async def _heartbeat(self, lease: Lease) -> None:
        while True:
            await asyncio.sleep(max(0.5, lease.ttl / 3))
            with contextlib.suppress(errors.SandboxdError):
                await lease.heartbeat()

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._beat is not None:
            self._beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._beat
        if self._lease is not None:
            lease = self._lease
            await asyncio.shield(release_lease(lease.release, lease.id, "held lease"))


class AsyncClient(PoolCalls, ExecCalls, FileCalls, SnapshotCalls):
    """The asyncio client: every call of every service, plus leases held as
    context managers. Keywords as ``Connection``."""

    @staticmethod
    def _acquire_request(
        pool: str,
        n: int,
        min_n: int,
        labels: Mapping[str, str] | None,
        lease_ttl: float,
        timeout: float | None,
        limits: Mapping[str, int] | None,
        image: str = "",
        network: Sequence[str] = (),
        no_network: bool = False,
    ) -> sandboxes_pb2.AcquireRequest:
        request = sandboxes_pb2.AcquireRequest(
            pool=pool,
            image=image,
            network=list(network),
            no_network=no_network,
            n=n,
            min_n=min_n,
            labels=labels or {},
            lease_ttl_seconds=lease_ttl,
            timeout_seconds=timeout or 0.0,
            # An id per request, so that a lease granted as the caller gave
            # up can still be found and freed (see _give_up).
            request_id=_request_id(),
        )
        if limits:
            request.limits.CopyFrom(common_pb2.Limits(**limits))
        return request

    def acquire(
        self,
        pool: str,
        *,
        labels: Mapping[str, str] | None = None,
        lease_ttl: float = 0.0,
        timeout: float | None = None,
        limits: Mapping[str, int] | None = None,
        image: str = "",
        network: Sequence[str] = (),
        no_network: bool = False,
    ) -> HeldLease:
        """``async with client.acquire(pool) as sandbox``: one sandbox.
        ``limits`` (memory_bytes, cpu_millis, pids, ...) lowers the pool's;
        ``image`` picks one of the images the pool serves ("" = its own),
        pulled first when the engine lacks it; ``network`` narrows the pool's
        network rules for this lease (each rule within the pool's), and
        ``no_network`` gives it no egress at all."""
        request = self._acquire_request(
            pool, 1, 0, labels, lease_ttl, timeout, limits, image, network, no_network
        )
        return HeldLease(self, request, timeout, single=True)

    def acquire_group(
        self,
        pool: str,
        n: int,
        *,
        min_n: int = 0,
        labels: Mapping[str, str] | None = None,
        lease_ttl: float = 0.0,
        timeout: float | None = None,
        limits: Mapping[str, int] | None = None,
        image: str = "",
        network: Sequence[str] = (),
        no_network: bool = False,
    ) -> HeldLease:
        """``async with client.acquire_group(pool, n=8) as group``: a Lease of n
        sandboxes (all-or-nothing, or at least min_n), of ``image``,
        ``network`` and ``no_network`` as ``acquire``."""
        request = self._acquire_request(
            pool, n, min_n, labels, lease_ttl, timeout, limits, image, network, no_network
        )
        return HeldLease(self, request, timeout, single=False)

    async def lease(
        self,
        pool: str,
        n: int = 1,
        *,
        min_n: int = 0,
        labels: Mapping[str, str] | None = None,
        lease_ttl: float = 0.0,
        timeout: float | None = None,
        limits: Mapping[str, int] | None = None,
        image: str = "",
        network: Sequence[str] = (),
        no_network: bool = False,
    ) -> Lease:
        """Acquire without a context manager: the caller heartbeats and releases."""
        request = self._acquire_request(
            pool, n, min_n, labels, lease_ttl, timeout, limits, image, network, no_network
        )
        return await self._acquire(request, timeout)

    async def _acquire(self, request: sandboxes_pb2.AcquireRequest, timeout: float | None) -> Lease:
        # The RPC deadline leaves the server room to answer DEADLINE_EXCEEDED itself.
        deadline = None if timeout is None else timeout + 5.0
        response = await self._granting(self.sandboxes.Acquire, request, deadline)
        return Lease(self, response)

    async def _granting(self, call: Any, request: Any, deadline: float | None) -> Any:
        """``call`` (Acquire or Restore) of ``request``, whose grant is given
        up (_give_up) when this client will not read the answer."""
        try:  # rpc_errors() inline: this is the hot path
            return await call(request, timeout=deadline, metadata=self.metadata)
        except asyncio.CancelledError:
            self._give_up(request.request_id)
            raise
        except grpc.aio.AioRpcError as e:
            if e.code() in _OUTCOME_UNKNOWN:
                self._give_up(request.request_id)
            raise translate(e) from e

    def _give_up(self, request_id: str) -> None:
        """Frees, in the background, whatever the server granted an Acquire
        or a Restore whose answer this client will not read: the server may have granted it
        before it heard of the cancellation, and then only this client knows."""
        self.in_background(self._release_request(request_id))

    async def _release_request(self, request_id: str) -> None:
        async def release() -> None:
            with rpc_errors():
                await self.sandboxes.Release(
                    sandboxes_pb2.ReleaseRequest(request_id=request_id),
                    metadata=self.metadata,
                    timeout=_RELEASE_DEADLINE,
                )

        # Retried while the server cannot answer: only the TTL would end it otherwise.
        await release_lease(release, f"of request {request_id}", "call given up")

    async def heartbeat(self, lease_id: str, ttl: float = 0.0) -> sandboxes_pb2.Lease:
        """Extends a lease: ``ttl`` seconds from now (0 = its own TTL)."""
        with rpc_errors():
            response: sandboxes_pb2.HeartbeatResponse = await self.sandboxes.Heartbeat(
                sandboxes_pb2.HeartbeatRequest(lease_id=lease_id, ttl_seconds=ttl), metadata=self.metadata
            )
        return response.lease

    async def set_lease_network(
        self, lease_id: str, network: Sequence[str] = (), *, no_network: bool = False
    ) -> sandboxes_pb2.Lease:
        """Puts a running lease's sandboxes under ``network`` (rules within the
        pool's), under none at all with ``no_network``, or back under the pool's
        own rules with neither; returns once they are in force, the
        connections they no longer allow cut."""
        with rpc_errors():
            response: sandboxes_pb2.SetLeaseNetworkResponse = await self.sandboxes.SetLeaseNetwork(
                sandboxes_pb2.SetLeaseNetworkRequest(
                    lease_id=lease_id, network=list(network), no_network=no_network
                ),
                metadata=self.metadata,
            )
        return response.lease

    async def release(self, lease_id: str, sandbox_ids: Sequence[str] = ()) -> list[str]:
        """Releases a lease, or only ``sandbox_ids`` of it; returns the ids released."""
        with rpc_errors():
            response = await self.sandboxes.Release(
                sandboxes_pb2.ReleaseRequest(lease_id=lease_id, sandbox_ids=list(sandbox_ids)),
                metadata=self.metadata,
            )
        return list(response.released)

    async def get_sandbox(self, sandbox_id: str) -> common_pb2.Sandbox:
        """One sandbox as the server sees it."""
        with rpc_errors():
            response: sandboxes_pb2.GetSandboxResponse = await self.sandboxes.GetSandbox(
                sandboxes_pb2.GetSandboxRequest(sandbox_id=sandbox_id), metadata=self.metadata
            )
        return response.sandbox

    async def list_sandboxes(
        self, pool: str = "", *, state: int = 0, labels: Mapping[str, str] | None = None
    ) -> list[common_pb2.Sandbox]:
        """Sandboxes filtered by pool, state and labels (all must match)."""
        request = sandboxes_pb2.ListSandboxesRequest(pool=pool, state=state, labels=labels or {})  # type: ignore[arg-type]
        with rpc_errors():
            return list((await self.sandboxes.ListSandboxes(request, metadata=self.metadata)).sandboxes)

    async def usage(self, sandbox_id: str) -> sandboxes_pb2.Usage:
        """Memory (and peak), pids, workspace bytes and files, CPU seconds."""
        with rpc_errors():
            response: sandboxes_pb2.GetUsageResponse = await self.sandboxes.GetUsage(
                sandboxes_pb2.GetUsageRequest(sandbox_id=sandbox_id), metadata=self.metadata
            )
        return response.usage

    async def pause(self, sandbox_id: str) -> common_pb2.Sandbox:
        """Freezes a leased gVisor sandbox (no CPU; memory and lease kept)."""
        with rpc_errors():
            response: sandboxes_pb2.PauseResponse = await self.sandboxes.Pause(
                sandboxes_pb2.PauseRequest(sandbox_id=sandbox_id), metadata=self.metadata
            )
        return response.sandbox

    async def resume(self, sandbox_id: str) -> common_pb2.Sandbox:
        """Thaws a paused sandbox: its processes continue where they were."""
        with rpc_errors():
            response: sandboxes_pb2.ResumeResponse = await self.sandboxes.Resume(
                sandboxes_pb2.ResumeRequest(sandbox_id=sandbox_id), metadata=self.metadata
            )
        return response.sandbox

    async def keep(self, sandbox_id: str, command: str) -> None:
        """Starts ``command`` (one shell line) through the sandbox's keeper,
        as a process a live snapshot carries; FailedPrecondition where the
        sandbox has no keeper (not gVisor)."""
        if not command.strip() or "\n" in command or "\0" in command:
            raise errors.InvalidArgument("command", "must be one non-empty line without NUL")
        script = '[ -p "${SANDBOXD_KEEP:-}" ] || exit 3; printf "%s\\n" "$1" > "$SANDBOXD_KEEP"'
        result = await self.exec(sandbox_id, ["bash", "-c", script, "keep", command])
        if result.exit_code == 3:
            raise errors.FailedPrecondition(
                f"sandbox {sandbox_id} has no keeper: only gVisor sandboxes of pools with live_snapshots "
                '"on" keep processes for live snapshots'
            )
        if result.exit_code != 0:
            raise errors.BackendError(f"keep in {sandbox_id} failed: {result.stderr[:200]!r}")

    async def restore(
        self,
        snapshot_id: str,
        n: int = 1,
        *,
        pool: str = "",
        labels: Mapping[str, str] | None = None,
        lease_ttl: float = 0.0,
        timeout: float | None = None,
        network: Sequence[str] = (),
        no_network: bool = False,
    ) -> Lease:
        """Restores a snapshot into n fresh sandboxes (a fork when n > 1) under
        a new lease, which the caller heartbeats and releases; ``network``
        narrows the pool's rules for it and ``no_network`` gives it none, as
        ``acquire``'s."""
        request = snapshots_pb2.RestoreRequest(
            snapshot_id=snapshot_id,
            n=n,
            pool=pool,
            network=list(network),
            no_network=no_network,
            labels=labels or {},
            lease_ttl_seconds=lease_ttl,
            timeout_seconds=timeout or 0.0,
            # As an Acquire's: what a Restore given up on was granted can be freed.
            request_id=_request_id(),
        )
        deadline = None if timeout is None else timeout + 60.0
        response: snapshots_pb2.RestoreResponse = await self._granting(
            self.snapshots.Restore, request, deadline
        )
        return Lease(self, sandboxes_pb2.AcquireResponse(lease=response.lease, sandboxes=response.sandboxes))
