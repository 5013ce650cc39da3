"""The client's connection to a server, and the one table that turns gRPC
status codes back into sandboxd's error tree (the server's interceptor maps
the other way)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine, Iterator, Sequence
from types import TracebackType
from typing import Any, Self

import grpc
import grpc.aio

from sandboxd import errors
from sandboxd.v1 import (
    demand_pb2_grpc,
    exec_pb2_grpc,
    files_pb2_grpc,
    pools_pb2_grpc,
    preflight_pb2_grpc,
    sandboxes_pb2_grpc,
    snapshots_pb2_grpc,
)

# Seconds close() waits for clean-up calls started in the background: room for
# a release retried past a busy server (client.releasing).
_BACKGROUND_GRACE = 15.0

_ERROR_OF: dict[grpc.StatusCode, type[errors.SandboxdError]] = {
    grpc.StatusCode.NOT_FOUND: errors.NotFound,
    grpc.StatusCode.ALREADY_EXISTS: errors.AlreadyExists,
    grpc.StatusCode.FAILED_PRECONDITION: errors.FailedPrecondition,
    grpc.StatusCode.PERMISSION_DENIED: errors.PermissionDenied,
    grpc.StatusCode.RESOURCE_EXHAUSTED: errors.ResourceExhausted,
    grpc.StatusCode.DEADLINE_EXCEEDED: errors.DeadlineExceeded,
    grpc.StatusCode.UNAUTHENTICATED: errors.Unauthenticated,
    grpc.StatusCode.UNAVAILABLE: errors.TransientBackendError,
}


def translate(e: grpc.aio.AioRpcError) -> errors.SandboxdError:
    """The sandboxd error a failed call stands for."""
    code, message = e.code(), e.details() or ""
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        field, _, problem = message.partition(": ")
        return (
            errors.InvalidArgument(field, problem) if problem else errors.InvalidArgument("request", message)
        )
    if code in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE):
        retry = None
        for key, value in e.trailing_metadata() or ():
            if key == "retry-after-seconds":
                retry = float(value)
        if code == grpc.StatusCode.UNAVAILABLE:
            # Only an Unavailable answer carries a retry hint; without one it
            # is the engine's transient failure, as before.
            return (
                errors.Unavailable(message, retry)
                if retry is not None
                else errors.TransientBackendError(message)
            )
        return errors.ResourceExhausted(message, retry)
    cls = _ERROR_OF.get(code, errors.SandboxdError)
    return cls(f"{code.name}: {message}" if cls is errors.SandboxdError else message)


@contextlib.contextmanager
def rpc_errors() -> Iterator[None]:
    """Re-raises a failed call inside the block as its sandboxd error."""
    try:
        yield
    except grpc.aio.AioRpcError as e:
        raise translate(e) from e


class Connection:
    """A channel to one server, the service stubs on it, and the metadata
    (credentials) every call carries. The client's call groups build on it."""

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
        self.metadata: tuple[tuple[str, str], ...] = tuple(metadata) + (
            (("authorization", f"Bearer {token}"),) if token else ()
        )
        """Sent with every call."""
        self.pools = pools_pb2_grpc.PoolServiceStub(self._channel)
        self.sandboxes = sandboxes_pb2_grpc.SandboxServiceStub(self._channel)
        self.execs = exec_pb2_grpc.ExecServiceStub(self._channel)
        self.files = files_pb2_grpc.FileServiceStub(self._channel)
        self.demand = demand_pb2_grpc.DemandServiceStub(self._channel)
        self.snapshots = snapshots_pb2_grpc.SnapshotServiceStub(self._channel)
        self.preflight_stub = preflight_pb2_grpc.PreflightServiceStub(self._channel)
        self._background: set[asyncio.Future[None]] = set()

    @property
    def channel(self) -> grpc.aio.Channel:
        """The gRPC channel, for stubs of further services."""
        return self._channel

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def in_background(self, call: Coroutine[Any, Any, None]) -> None:
        """Runs ``call`` (a clean-up RPC) without anyone waiting on it; close()
        gives such calls a moment to finish before the channel goes."""
        task = asyncio.ensure_future(call)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def wait_background(self, timeout: float = _BACKGROUND_GRACE) -> None:
        """Waits up to ``timeout`` seconds for the clean-up calls running in the
        background (the release of what a cancelled acquire may have been granted)."""
        if self._background:
            await asyncio.wait(set(self._background), timeout=timeout)

    async def close(self) -> None:
        """Closes the channel; calls in flight are cancelled (clean-ups started
        in the background first get up to ``_BACKGROUND_GRACE`` seconds)."""
        await self.wait_background()
        await self._channel.close()

    async def wait_ready(self, timeout: float = 10.0) -> None:
        """Waits until the channel is connected."""
        await asyncio.wait_for(self._channel.channel_ready(), timeout)
