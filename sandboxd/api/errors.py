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


def _trailers(code: grpc.StatusCode, error: SandboxdError) -> tuple[tuple[str, str | bytes], ...]:
    if not isinstance(error, ResourceExhausted) or error.retry_after is None:
        return ()
    retry = error_details_pb2.RetryInfo(
        retry_delay=duration_pb2.Duration(
            seconds=int(error.retry_after), nanos=int(math.modf(error.retry_after)[0] * 1e9)
        )
    )
    status = status_pb2.Status(code=code_pb2.RESOURCE_EXHAUSTED, message=error.message)
    status.details.add().Pack(retry)
    return (
        ("grpc-status-details-bin", status.SerializeToString()),
        (RETRY_AFTER_KEY, f"{error.retry_after:.3f}"),
    )


async def _abort(context: grpc.aio.ServicerContext[Any, Any], error: Exception) -> None:
    if isinstance(error, SandboxdError):
        code = status_for(error)
        await context.abort(code, error.message, _trailers(code, error))
    ref = secrets.token_hex(4)
    log.exception("internal error (ref %s)", ref, exc_info=error)
    await context.abort(grpc.StatusCode.INTERNAL, f"internal error (ref {ref}); see the server log")


def _wrap_unary(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    async def call(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        try:
            return await fn(request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as e:
            await _abort(context, e)

    return call


def _wrap_stream(fn: Callable[..., AsyncIterator[Any]]) -> Callable[..., AsyncIterator[Any]]:
    async def call(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
        try:
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
        return rewrap(handler, _wrap_unary, _wrap_stream)
