"""One table from sandboxd's error tree to gRPC status codes, applied by one
interceptor to every RPC, unary or streaming."""

from __future__ import annotations

import logging
import math
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import grpc.aio
from google.protobuf import duration_pb2
from google.protobuf.message import DecodeError
from google.rpc import code_pb2, error_details_pb2, status_pb2

from sandboxd.api.interceptors import MethodCachingInterceptor, rewrap
from sandboxd.errors import (
    AlreadyExists,
    BackendError,
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermanentBackendError,
    PermissionDenied,
    ResourceExhausted,
    SandboxdError,
    SandboxLost,
    Unauthenticated,
    Unavailable,
    printable,
)

log = logging.getLogger(__name__)

# Most specific first: the first matching class wins.
STATUS_OF: list[tuple[type[SandboxdError], grpc.StatusCode]] = [
    (InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (NotFound, grpc.StatusCode.NOT_FOUND),
    (AlreadyExists, grpc.StatusCode.ALREADY_EXISTS),
    (FailedPrecondition, grpc.StatusCode.FAILED_PRECONDITION),
    (PermissionDenied, grpc.StatusCode.PERMISSION_DENIED),
    (ResourceExhausted, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (DeadlineExceeded, grpc.StatusCode.DEADLINE_EXCEEDED),
    (Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
    (SandboxLost, grpc.StatusCode.FAILED_PRECONDITION),
    (PermanentBackendError, grpc.StatusCode.FAILED_PRECONDITION),
    (BackendError, grpc.StatusCode.UNAVAILABLE),
]

RETRY_AFTER_KEY = "retry-after-seconds"


def status_for(error: SandboxdError) -> grpc.StatusCode:
    """The status code an error answers with: the first match in STATUS_OF, else INTERNAL."""
    for cls, code in STATUS_OF:
        if isinstance(error, cls):
            return code
    return grpc.StatusCode.INTERNAL


_RPC_CODE = {
    grpc.StatusCode.RESOURCE_EXHAUSTED: code_pb2.RESOURCE_EXHAUSTED,
    grpc.StatusCode.UNAVAILABLE: code_pb2.UNAVAILABLE,
}


def _trailers(code: grpc.StatusCode, error: SandboxdError) -> tuple[tuple[str, str | bytes], ...]:
    if not isinstance(error, ResourceExhausted | Unavailable) or error.retry_after is None:
        return ()
    retry = error_details_pb2.RetryInfo(
        retry_delay=duration_pb2.Duration(
            seconds=int(error.retry_after), nanos=int(math.modf(error.retry_after)[0] * 1e9)
        )
    )
    status = status_pb2.Status(code=_RPC_CODE[code], message=printable(error.message))
    status.details.add().Pack(retry)
    return (
        ("grpc-status-details-bin", status.SerializeToString()),
        (RETRY_AFTER_KEY, f"{error.retry_after:.3f}"),
    )


async def _abort(context: grpc.aio.ServicerContext[Any, Any], error: Exception) -> None:
    if isinstance(error, SandboxdError):
        code = status_for(error)
        # A message naming what a sandbox or a user produced may hold bytes
        # that are not UTF-8: sent as they are, the status could not be
        # encoded and the call would never be answered.
        await context.abort(code, printable(error.message), _trailers(code, error))
    ref = secrets.token_hex(4)
    log.exception("internal error (ref %s)", ref, exc_info=error)
    await context.abort(grpc.StatusCode.INTERNAL, f"internal error (ref {ref}); see the server log")


class Undecodable:
    """What the request deserializer hands on for bytes that are not a valid
    message (a string field that is not UTF-8, a truncated field): the
    handler answers INVALID_ARGUMENT instead of gRPC's own UNKNOWN."""

    def __init__(self, type_name: str, problem: str) -> None:
        self.error = InvalidArgument(
            "request",
            f"not a valid {type_name} message ({printable(problem)}); string fields must be UTF-8",
        )


def _tolerant(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserializer is None:
        return None
    type_name = getattr(getattr(deserializer, "__self__", None), "DESCRIPTOR", None)
    name = type_name.full_name if type_name is not None else "request"

    def parse(data: bytes) -> Any:
        try:
            return deserializer(data)
        except DecodeError as e:
            return Undecodable(name, str(e))

    return parse


async def _checked(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
    async for request in requests:
        if isinstance(request, Undecodable):
            raise request.error
        yield request


def _wrap_unary(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    async def call(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        try:
            if isinstance(request, Undecodable):
                raise request.error
            if hasattr(request, "__aiter__"):
                request = _checked(request)
            return await fn(request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as e:
            await _abort(context, e)

    return call


def _wrap_stream(fn: Callable[..., AsyncIterator[Any]]) -> Callable[..., AsyncIterator[Any]]:
    async def call(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
        try:
            if isinstance(request, Undecodable):
                raise request.error
            if hasattr(request, "__aiter__"):
                request = _checked(request)
            async for item in fn(request, context):
                yield item
        except grpc.aio.AbortError:
            raise
        except Exception as e:
            await _abort(context, e)

    return call


class ErrorInterceptor(MethodCachingInterceptor):
    """Turns every exception an RPC raises into a status; unexpected ones become INTERNAL with a log ref."""

    async def wrap(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        """The handler with its errors mapped through STATUS_OF; aborts already raised pass through."""
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        return rewrap(handler, _wrap_unary, _wrap_stream, _tolerant(handler.request_deserializer))
