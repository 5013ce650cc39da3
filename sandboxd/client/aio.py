"""The async client.

    async with AsyncClient("127.0.0.1:50051") as client:
        async with client.acquire("default") as sb:
            result = await sb.exec("echo hi")
        async with client.acquire_group("default", n=8) as group:
            results = await asyncio.gather(*(s.exec(["python3", "-V"]) for s in group))

A lease held through a context manager is heartbeated in the background and
released on exit, whatever happens inside.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import tarfile
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc
import grpc.aio

from sandboxd import errors
from sandboxd.v1 import (
    common_pb2,
    demand_pb2,
    demand_pb2_grpc,
    exec_pb2,
    exec_pb2_grpc,
    files_pb2,
    files_pb2_grpc,
    pools_pb2,
    pools_pb2_grpc,
    preflight_pb2,
    preflight_pb2_grpc,
    sandboxes_pb2,
    sandboxes_pb2_grpc,
    snapshots_pb2,
    snapshots_pb2_grpc,
)

_ERROR_OF: dict[grpc.StatusCode, type[errors.SandboxdError]] = {
    grpc.StatusCode.NOT_FOUND: errors.NotFound,
    grpc.StatusCode.ALREADY_EXISTS: errors.AlreadyExists,
    grpc.StatusCode.FAILED_PRECONDITION: errors.FailedPrecondition,
    grpc.StatusCode.RESOURCE_EXHAUSTED: errors.ResourceExhausted,
    grpc.StatusCode.DEADLINE_EXCEEDED: errors.DeadlineExceeded,
    grpc.StatusCode.UNAUTHENTICATED: errors.Unauthenticated,
    grpc.StatusCode.UNAVAILABLE: errors.TransientBackendError,
}

OUTCOMES = {
    v.number: v.name.removeprefix("EXEC_OUTCOME_")
    for v in exec_pb2.DESCRIPTOR.enum_types_by_name["ExecOutcome"].values
}


def _translate(e: grpc.aio.AioRpcError) -> errors.SandboxdError:
    code, message = e.code(), e.details() or ""
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        field, _, problem = message.partition(": ")
        return (
            errors.InvalidArgument(field, problem) if problem else errors.InvalidArgument("request", message)
        )
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        retry = None
        for key, value in e.trailing_metadata() or ():
            if key == "retry-after-seconds":
                retry = float(value)
        return errors.ResourceExhausted(message, retry)
    cls = _ERROR_OF.get(code, errors.SandboxdError)
    return cls(f"{code.name}: {message}" if cls is errors.SandboxdError else message)


@contextlib.contextmanager
def _mapped() -> Iterator[None]:
    try:
        yield
    except grpc.aio.AioRpcError as e:
        raise _translate(e) from e


@dataclass(frozen=True)
class ExecResult:
    outcome: str
    """EXITED, TIMED_OUT, KILLED, OUTPUT_TRUNCATED, SANDBOX_LOST, OOM_KILLED, ..."""
    exit_code: int
    stdout: bytes
    stderr: bytes
    duration: float
    output_truncated: bool = False
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.outcome == "EXITED" and self.exit_code == 0

    @property
    def text(self) -> str:
        return self.stdout.decode(errors="replace")

    @classmethod
    def from_proto(
        cls, r: exec_pb2.ExecResult, stdout: bytes | None = None, stderr: bytes | None = None
    ) -> ExecResult:
        return cls(
            outcome=OUTCOMES.get(r.outcome, str(r.outcome)),
            exit_code=r.exit_code,
            stdout=r.stdout if stdout is None else stdout,
            stderr=r.stderr if stderr is None else stderr,
            duration=r.duration_seconds,
            output_truncated=r.output_truncated,
            detail=r.detail,
        )


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
        return await self.client.exec(self.id, command, **kwargs)

    def exec_stream(self, command: str | Sequence[str], **kwargs: Any) -> AsyncIterator[tuple[str, Any]]:
        return self.client.exec_stream(self.id, command, **kwargs)

    async def write_files(self, files: Mapping[str, bytes | str]) -> int:
        return await self.client.write_files(self.id, files)

    async def write_file(self, path: str, content: bytes | str, mode: int = 0) -> int:
        return await self.client.write_files(self.id, {path: content}, modes={path: mode} if mode else None)

    async def read_files(self, paths: Sequence[str]) -> dict[str, bytes]:
        return await self.client.read_files(self.id, paths)

    async def read_file(self, path: str) -> bytes:
        return (await self.client.read_files(self.id, [path]))[path]

    async def upload_dir(self, local: str | Path, dest: str = ".") -> int:
        return await self.client.upload_dir(self.id, local, dest)

    async def download_dir(self, path: str = ".") -> bytes:
        return await self.client.download_dir(self.id, path)

    async def release(self) -> None:
        await self.client.release(self.lease_id, [self.id])

    async def snapshot(self, **kwargs: Any) -> snapshots_pb2.Snapshot:
        """Snapshots this sandbox; keywords as AsyncClient.snapshot."""
        return await self.client.snapshot(self.id, **kwargs)


class Lease:
    """Sandboxes held under one lease (a group when there are several)."""

    def __init__(self, client: AsyncClient, response: sandboxes_pb2.AcquireResponse) -> None:
        self.client = client
        self.id = response.lease.id
        self.ttl = response.lease.ttl_seconds
        self.sandboxes = [Sandbox(client, s, self.id) for s in response.sandboxes]

    def __iter__(self) -> Iterator[Sandbox]:
        return iter(self.sandboxes)

    def __len__(self) -> int:
        return len(self.sandboxes)

    def __getitem__(self, i: int) -> Sandbox:
        return self.sandboxes[i]

    async def heartbeat(self, ttl: float = 0.0) -> None:
        await self.client.heartbeat(self.id, ttl)

    async def release(self) -> None:
        await self.client.release(self.id)


class _Held:
    """Async context manager behind acquire()/acquire_group()."""

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
            with contextlib.suppress(errors.NotFound):
                await asyncio.shield(self._lease.release())


class AsyncClient:
    def __init__(
        self,
        target: str,
        *,
        token: str | None = None,
        tls: bool = False,
        root_certificates: bytes | None = None,
        client_certificate: tuple[bytes, bytes] | None = None,
        max_message_bytes: int = 64 << 20,
        metadata: Sequence[tuple[str, str]] = (),
    ) -> None:
        """``token`` is the tenant's bearer token, when the server requires one.
        ``tls`` (implied by the other two) speaks TLS, trusting
        ``root_certificates`` (PEM; None = the system's); ``client_certificate``
        is a (PEM chain, PEM key) pair for servers that require mutual TLS."""
        self.target = target
        options = [
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
        ]
        if tls or root_certificates or client_certificate:
            chain, key = client_certificate or (None, None)
            credentials = grpc.ssl_channel_credentials(
                root_certificates=root_certificates, private_key=key, certificate_chain=chain
            )
            self._channel = grpc.aio.secure_channel(target, credentials, options=options)
        else:
            self._channel = grpc.aio.insecure_channel(target, options=options)
        self._metadata = tuple(metadata) + ((("authorization", f"Bearer {token}"),) if token else ())
        self.pools = pools_pb2_grpc.PoolServiceStub(self._channel)
        self.sandboxes = sandboxes_pb2_grpc.SandboxServiceStub(self._channel)
        self.execs = exec_pb2_grpc.ExecServiceStub(self._channel)
        self.files = files_pb2_grpc.FileServiceStub(self._channel)
        self.demand = demand_pb2_grpc.DemandServiceStub(self._channel)
        self.snapshots = snapshots_pb2_grpc.SnapshotServiceStub(self._channel)
        self.preflight_stub = preflight_pb2_grpc.PreflightServiceStub(self._channel)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    async def wait_ready(self, timeout: float = 10.0) -> None:
        await asyncio.wait_for(self._channel.channel_ready(), timeout)

    # -- pools --------------------------------------------------------------

    async def create_pool(
        self,
        name: str,
        image: str,
        *,
        min_ready: int = 0,
        max_size: int = 64,
        limits: Mapping[str, int] | None = None,
        env: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
        max_ready: int = 0,
        idle_seconds: float = 0.0,
    ) -> pools_pb2.Pool:
        """``max_ready`` above ``min_ready`` makes the pool follow demand
        between the two; ``idle_seconds`` is its scale-down delay."""
        spec = pools_pb2.PoolSpec(
            name=name,
            image=image,
            min_ready=min_ready,
            max_size=max_size,
            limits=common_pb2.Limits(**(limits or {})),
            env=env or {},
            labels=labels or {},
            max_ready=max_ready,
            idle_seconds=idle_seconds,
        )
        with _mapped():
            response: pools_pb2.CreatePoolResponse = await self.pools.CreatePool(
                pools_pb2.CreatePoolRequest(spec=spec), metadata=self._metadata
            )
        return response.pool

    async def get_pool(self, name: str) -> pools_pb2.Pool:
        with _mapped():
            response: pools_pb2.GetPoolResponse = await self.pools.GetPool(
                pools_pb2.GetPoolRequest(name=name), metadata=self._metadata
            )
        return response.pool

    async def list_pools(self) -> list[pools_pb2.Pool]:
        with _mapped():
            return list(
                (await self.pools.ListPools(pools_pb2.ListPoolsRequest(), metadata=self._metadata)).pools
            )

    async def update_pool(
        self,
        name: str,
        *,
        min_ready: int | None = None,
        max_size: int | None = None,
        max_ready: int | None = None,
    ) -> pools_pb2.Pool:
        request = pools_pb2.UpdatePoolRequest(
            name=name, min_ready=min_ready, max_size=max_size, max_ready=max_ready
        )
        with _mapped():
            response: pools_pb2.UpdatePoolResponse = await self.pools.UpdatePool(
                request, metadata=self._metadata
            )
        return response.pool

    async def delete_pool(self, name: str, *, force: bool = False) -> None:
        with _mapped():
            await self.pools.DeletePool(
                pools_pb2.DeletePoolRequest(name=name, force=force), metadata=self._metadata
            )

    # -- demand -------------------------------------------------------------

    async def set_demand(
        self, pool: str, count: int, *, in_seconds: float = 0.0, ttl: float = 0.0, source: str = ""
    ) -> demand_pb2.PoolScaling:
        """Announces "in ~in_seconds I will acquire ``count`` sandboxes of
        ``pool``" (replacing this source's previous announcement; 0 withdraws)."""
        request = demand_pb2.SetDemandRequest(
            pool=pool, source=source, count=count, in_seconds=in_seconds, ttl_seconds=ttl
        )
        with _mapped():
            response: demand_pb2.SetDemandResponse = await self.demand.SetDemand(
                request, metadata=self._metadata
            )
        return response.pool

    async def prewarm(
        self,
        pool: str,
        count: int,
        *,
        wait: bool = False,
        timeout: float = 0.0,
        ttl: float = 0.0,
        source: str = "",
    ) -> demand_pb2.PoolScaling:
        """Warms ``count`` sandboxes now; with ``wait``, returns once they are READY."""
        request = demand_pb2.PrewarmRequest(
            pool=pool, count=count, wait=wait, timeout_seconds=timeout, ttl_seconds=ttl, source=source
        )
        with _mapped():
            response: demand_pb2.PrewarmResponse = await self.demand.Prewarm(
                request, timeout=timeout + 5.0 if wait and timeout else None, metadata=self._metadata
            )
        return response.pool

    async def watch_pools(
        self, pool: str = "", *, interval: float = 1.0
    ) -> AsyncIterator[demand_pb2.WatchPoolResponse]:
        """Yields the scaling state of ``pool`` (or of every pool) every ``interval`` seconds."""
        call = self.demand.WatchPool(
            demand_pb2.WatchPoolRequest(pool=pool, interval_seconds=interval), metadata=self._metadata
        )
        try:
            with _mapped():
                async for update in call:
                    yield update
        finally:
            call.cancel()

    # -- leases -------------------------------------------------------------

    @staticmethod
    def _acquire_request(
        pool: str,
        n: int,
        min_n: int,
        labels: Mapping[str, str] | None,
        lease_ttl: float,
        timeout: float | None,
        limits: Mapping[str, int] | None,
    ) -> sandboxes_pb2.AcquireRequest:
        request = sandboxes_pb2.AcquireRequest(
            pool=pool,
            n=n,
            min_n=min_n,
            labels=labels or {},
            lease_ttl_seconds=lease_ttl,
            timeout_seconds=timeout or 0.0,
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
    ) -> _Held:
        """``async with client.acquire(pool) as sandbox``: one sandbox.
        ``limits`` (memory_bytes, cpu_millis, pids, ...) lowers the pool's."""
        request = self._acquire_request(pool, 1, 0, labels, lease_ttl, timeout, limits)
        return _Held(self, request, timeout, single=True)

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
    ) -> _Held:
        """``async with client.acquire_group(pool, n=8) as group``: a Lease of n
        sandboxes (all-or-nothing, or at least min_n)."""
        request = self._acquire_request(pool, n, min_n, labels, lease_ttl, timeout, limits)
        return _Held(self, request, timeout, single=False)

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
    ) -> Lease:
        """Acquire without a context manager: the caller heartbeats and releases."""
        request = self._acquire_request(pool, n, min_n, labels, lease_ttl, timeout, limits)
        return await self._acquire(request, timeout)

    async def _acquire(self, request: sandboxes_pb2.AcquireRequest, timeout: float | None) -> Lease:
        # The RPC deadline leaves the server room to answer DEADLINE_EXCEEDED itself.
        deadline = None if timeout is None else timeout + 5.0
        with _mapped():
            response = await self.sandboxes.Acquire(request, timeout=deadline, metadata=self._metadata)
        return Lease(self, response)

    async def heartbeat(self, lease_id: str, ttl: float = 0.0) -> sandboxes_pb2.Lease:
        with _mapped():
            response: sandboxes_pb2.HeartbeatResponse = await self.sandboxes.Heartbeat(
                sandboxes_pb2.HeartbeatRequest(lease_id=lease_id, ttl_seconds=ttl), metadata=self._metadata
            )
        return response.lease

    async def release(self, lease_id: str, sandbox_ids: Sequence[str] = ()) -> list[str]:
        with _mapped():
            response = await self.sandboxes.Release(
                sandboxes_pb2.ReleaseRequest(lease_id=lease_id, sandbox_ids=list(sandbox_ids)),
                metadata=self._metadata,
            )
        return list(response.released)

    async def get_sandbox(self, sandbox_id: str) -> common_pb2.Sandbox:
        with _mapped():
            response: sandboxes_pb2.GetSandboxResponse = await self.sandboxes.GetSandbox(
                sandboxes_pb2.GetSandboxRequest(sandbox_id=sandbox_id), metadata=self._metadata
            )
        return response.sandbox

    async def list_sandboxes(
        self, pool: str = "", *, state: int = 0, labels: Mapping[str, str] | None = None
    ) -> list[common_pb2.Sandbox]:
        request = sandboxes_pb2.ListSandboxesRequest(pool=pool, state=state, labels=labels or {})  # type: ignore[arg-type]
        with _mapped():
            return list((await self.sandboxes.ListSandboxes(request, metadata=self._metadata)).sandboxes)

    async def usage(self, sandbox_id: str) -> sandboxes_pb2.Usage:
        """Memory (and peak), pids, workspace bytes and files, CPU seconds."""
        with _mapped():
            response: sandboxes_pb2.GetUsageResponse = await self.sandboxes.GetUsage(
                sandboxes_pb2.GetUsageRequest(sandbox_id=sandbox_id), metadata=self._metadata
            )
        return response.usage

    async def preflight(
        self,
        *,
        concurrent: int,
        pool: str = "",
        image: str = "",
        limits: Mapping[str, int] | None = None,
        duration: float = 0.0,
    ) -> preflight_pb2.PreflightResponse:
        """Checks a planned run (an existing pool, or an image and limits)
        before anything is created; the answer lists every problem found."""
        request = preflight_pb2.PreflightRequest(concurrent=concurrent, expected_duration_seconds=duration)
        if pool:
            request.pool = pool
        else:
            request.template.CopyFrom(
                preflight_pb2.Template(image=image, limits=common_pb2.Limits(**(limits or {})))
            )
        with _mapped():
            response: preflight_pb2.PreflightResponse = await self.preflight_stub.Preflight(
                request, metadata=self._metadata
            )
        return response

    # -- exec ---------------------------------------------------------------

    @staticmethod
    def _exec_request(
        sandbox_id: str,
        command: str | Sequence[str],
        *,
        cwd: str = "",
        env: Mapping[str, str] | None = None,
        timeout: float = 0.0,
        stdin: bytes | str = b"",
        output_limit: int = 0,
        session: str = "",
    ) -> exec_pb2.ExecRequest:
        request = exec_pb2.ExecRequest(
            sandbox_id=sandbox_id,
            cwd=cwd,
            env=env or {},
            timeout_seconds=timeout,
            stdin=stdin.encode() if isinstance(stdin, str) else stdin,
            output_limit_bytes=output_limit,
            session=session,
        )
        if isinstance(command, str):
            request.shell = command
        else:
            request.argv.args.extend(command)
        return request

    async def exec(self, sandbox_id: str, command: str | Sequence[str], **kwargs: Any) -> ExecResult:
        """Runs ``command`` (a shell string, or an argv list run without a
        shell). Keywords: cwd, env, timeout, stdin, output_limit, session."""
        request = self._exec_request(sandbox_id, command, **kwargs)
        deadline = request.timeout_seconds + 30.0 if request.timeout_seconds else None
        with _mapped():
            response = await self.execs.Exec(request, timeout=deadline, metadata=self._metadata)
        return ExecResult.from_proto(response.result)

    async def exec_stream(
        self, sandbox_id: str, command: str | Sequence[str], **kwargs: Any
    ) -> AsyncIterator[tuple[str, Any]]:
        """Yields ("stdout", bytes), ("stderr", bytes) as output comes, then ("result", ExecResult)."""
        request = self._exec_request(sandbox_id, command, **kwargs)
        call = self.execs.ExecStream(request, metadata=self._metadata)
        try:
            with _mapped():
                async for event in call:
                    kind = event.WhichOneof("event")
                    if kind == "result":
                        yield "result", ExecResult.from_proto(event.result)
                    else:
                        yield kind, getattr(event, kind)
        finally:
            # Leaving early cancels the call; the server then kills the command.
            call.cancel()

    # -- files --------------------------------------------------------------

    async def write_files(
        self, sandbox_id: str, files: Mapping[str, bytes | str], modes: Mapping[str, int] | None = None
    ) -> int:
        request = files_pb2.WriteFilesRequest(
            sandbox_id=sandbox_id,
            files=[
                files_pb2.File(
                    path=p, content=c.encode() if isinstance(c, str) else c, mode=(modes or {}).get(p, 0)
                )
                for p, c in files.items()
            ],
        )
        with _mapped():
            return int((await self.files.WriteFiles(request, metadata=self._metadata)).bytes_written)

    async def read_files(self, sandbox_id: str, paths: Sequence[str], max_bytes: int = 0) -> dict[str, bytes]:
        request = files_pb2.ReadFilesRequest(sandbox_id=sandbox_id, paths=list(paths), max_bytes=max_bytes)
        with _mapped():
            response = await self.files.ReadFiles(request, metadata=self._metadata)
        return {f.path: f.content for f in response.files}

    async def upload_dir(self, sandbox_id: str, local: str | Path | bytes, dest: str = ".") -> int:
        """Uploads a local directory (or ready-made tar bytes) under ``dest``."""
        data = local if isinstance(local, bytes) else await asyncio.to_thread(_tar_dir, Path(local))

        async def chunks() -> AsyncIterator[files_pb2.UploadChunk]:
            yield files_pb2.UploadChunk(header=files_pb2.UploadHeader(sandbox_id=sandbox_id, path=dest))
            for i in range(0, len(data), 1 << 20):
                yield files_pb2.UploadChunk(data=data[i : i + (1 << 20)])

        with _mapped():
            return int((await self.files.UploadDirectory(chunks(), metadata=self._metadata)).bytes_received)

    async def download_dir(self, sandbox_id: str, path: str = ".") -> bytes:
        """A tar of the directory, paths relative to it."""
        request = files_pb2.DownloadDirectoryRequest(sandbox_id=sandbox_id, path=path)
        out = bytearray()
        with _mapped():
            async for chunk in self.files.DownloadDirectory(request, metadata=self._metadata):
                out += chunk.data
        return bytes(out)

    # -- snapshots ----------------------------------------------------------

    async def snapshot(
        self,
        sandbox_id: str,
        *,
        session: str = "",
        labels: Mapping[str, str] | None = None,
        policy_version: int | None = None,
        turn: int = 0,
        ttl: float = 0.0,
    ) -> snapshots_pb2.Snapshot:
        """Snapshots a leased sandbox's workspace and the cwd and exported
        environment of ``session`` (if given)."""
        request = snapshots_pb2.SnapshotRequest(
            sandbox_id=sandbox_id,
            session=session,
            labels=labels or {},
            policy_version=policy_version,
            turn=turn,
            ttl_seconds=ttl,
        )
        with _mapped():
            response: snapshots_pb2.SnapshotResponse = await self.snapshots.Snapshot(
                request, metadata=self._metadata
            )
        return response.snapshot

    async def restore(
        self,
        snapshot_id: str,
        n: int = 1,
        *,
        pool: str = "",
        labels: Mapping[str, str] | None = None,
        lease_ttl: float = 0.0,
        timeout: float | None = None,
    ) -> Lease:
        """Restores a snapshot into n fresh sandboxes (a fork when n > 1) under
        a new lease, which the caller heartbeats and releases."""
        request = snapshots_pb2.RestoreRequest(
            snapshot_id=snapshot_id,
            n=n,
            pool=pool,
            labels=labels or {},
            lease_ttl_seconds=lease_ttl,
            timeout_seconds=timeout or 0.0,
        )
        deadline = None if timeout is None else timeout + 60.0
        with _mapped():
            response: snapshots_pb2.RestoreResponse = await self.snapshots.Restore(
                request, timeout=deadline, metadata=self._metadata
            )
        return Lease(self, sandboxes_pb2.AcquireResponse(lease=response.lease, sandboxes=response.sandboxes))

    async def get_snapshot(self, snapshot_id: str) -> snapshots_pb2.Snapshot:
        """A snapshot with its lineage (``chain``, oldest first)."""
        with _mapped():
            response: snapshots_pb2.GetSnapshotResponse = await self.snapshots.GetSnapshot(
                snapshots_pb2.GetSnapshotRequest(snapshot_id=snapshot_id), metadata=self._metadata
            )
        return response.snapshot

    async def list_snapshots(
        self, *, labels: Mapping[str, str] | None = None, pool: str = "", parent_id: str = ""
    ) -> list[snapshots_pb2.Snapshot]:
        request = snapshots_pb2.ListSnapshotsRequest(labels=labels or {}, pool=pool, parent_id=parent_id)
        with _mapped():
            response = await self.snapshots.ListSnapshots(request, metadata=self._metadata)
        return list(response.snapshots)

    async def delete_snapshot(self, snapshot_id: str) -> None:
        with _mapped():
            await self.snapshots.DeleteSnapshot(
                snapshots_pb2.DeleteSnapshotRequest(snapshot_id=snapshot_id), metadata=self._metadata
            )


def _tar_dir(path: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for child in sorted(path.iterdir()):
            tar.add(child, arcname=child.name)
    return buf.getvalue()
