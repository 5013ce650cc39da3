"""A span per RPC (OpenTelemetry, server kind), with the gRPC status code.
The tracer is injected; without one (or with a no-op tracer) handlers are
not wrapped at all, so spans nobody records cost nothing.

It sits inside the error interceptor, so it sees sandboxd's own errors and
names the status code they map to."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import grpc.aio
from opentelemetry.trace import NoOpTracer, Span, SpanKind, Status, StatusCode, Tracer

from sandboxd.api.errors import status_for
from sandboxd.api.interceptors import MethodCachingInterceptor, rewrap
from sandboxd.errors import SandboxdError

# Codes that mean the server failed (OpenTelemetry's gRPC conventions);
# the rest (NOT_FOUND, INVALID_ARGUMENT, ...) are the caller's doing.
_SERVER_FAULTS = {
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.UNIMPLEMENTED,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DATA_LOSS,
}


def _finish(span: Span, error: BaseException | None) -> None:
    if error is None:
        span.set_attribute("rpc.grpc.status_code", grpc.StatusCode.OK.value[0])
        return
    if isinstance(error, SandboxdError):
        code = status_for(error)
    elif isinstance(error, grpc.aio.AbortError):
        code = grpc.StatusCode.UNKNOWN
    else:
        code = grpc.StatusCode.INTERNAL
    span.set_attribute("rpc.grpc.status_code", code.value[0])
    span.set_attribute("error.type", type(error).__name__)
    if code in _SERVER_FAULTS:
        span.record_exception(error)
        span.set_status(Status(StatusCode.ERROR, str(error)))


class TracingInterceptor(MethodCachingInterceptor):
    """Opens a server span per RPC; only server faults mark the span as an error."""

    def __init__(self, tracer: Tracer | None = None) -> None:
        super().__init__()
        self._tracer = tracer or NoOpTracer()

    async def wrap(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        """The handler inside a span named for the method, tagged with the status code it ends with."""
        handler = await continuation(details)
        if handler is None or isinstance(self._tracer, NoOpTracer):
            return handler
        method = str(details.method).lstrip("/")
        service, _, name = method.partition("/")
        attributes = {"rpc.system": "grpc", "rpc.service": service, "rpc.method": name}
        tracer = self._tracer

        def unary(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
            async def call(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
                with tracer.start_as_current_span(
                    method,
                    kind=SpanKind.SERVER,
                    attributes=attributes,
                    record_exception=False,
                    set_status_on_exception=False,
                ) as span:
                    try:
                        result = await fn(request, context)
                    except BaseException as e:
                        _finish(span, e)
                        raise
                    _finish(span, None)
                    return result

            return call

        def stream(fn: Callable[..., AsyncIterator[Any]]) -> Callable[..., AsyncIterator[Any]]:
            async def call(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
                with tracer.start_as_current_span(
                    method,
                    kind=SpanKind.SERVER,
                    attributes=attributes,
                    record_exception=False,
                    set_status_on_exception=False,
                ) as span:
                    sent = 0
                    try:
                        async for item in fn(request, context):
                            sent += 1
                            yield item
                    except BaseException as e:
                        span.set_attribute("rpc.messages_sent", sent)
                        _finish(span, e)
                        raise
                    span.set_attribute("rpc.messages_sent", sent)
                    _finish(span, None)

            return call

        return rewrap(handler, unary, stream)
