"""Bearer-token authentication: maps ``authorization: Bearer <token>`` to a
tenant and runs the call as that tenant. Health checks and reflection stay
open so probes and tools work without credentials."""

from __future__ import annotations

import hmac
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import grpc.aio

from sandboxd.api.interceptors import MethodCachingInterceptor, rewrap
from sandboxd.core.tenancy import DEFAULT_TENANT, acting_as, current_tenant
from sandboxd.errors import ResourceExhausted, Unauthenticated

OPEN_SERVICES = ("/grpc.health.v1.Health/", "/grpc.reflection.")


class Authenticator:
    """Maps bearer tokens to tenants (compared in constant time) and holds each tenant to its call rate."""

    def __init__(self, tokens: dict[str, str], required: bool, rates: dict[str, float] | None = None) -> None:
        """``tokens`` maps token -> tenant; ``rates`` tenant -> calls per second."""
        self._tokens = tokens
        self.required = required
        self._rates = rates or {}
        self._buckets: dict[str, tuple[float, float]] = {}

    def admit(self, tenant: str) -> None:
        """Token bucket per tenant: bursts of twice the rate, then the rate."""
        rate = self._rates.get(tenant, 0.0)
        if rate <= 0:
            return
        now = time.monotonic()
        tokens, stamp = self._buckets.get(tenant, (2 * rate, now))
        tokens = min(2 * rate, tokens + (now - stamp) * rate)
        if tokens < 1:
            self._buckets[tenant] = (tokens, now)
            raise ResourceExhausted(
                f"tenant {tenant!r} is over its {rate:g} calls per second", round((1 - tokens) / rate, 3)
            )
        self._buckets[tenant] = (tokens - 1, now)

    def tenant_for_call(self, metadata: tuple[tuple[str, str | bytes], ...] | None) -> str:
        """The caller's tenant, charged one call; raises Unauthenticated or ResourceExhausted."""
        tenant = self.tenant_for(metadata)
        self.admit(tenant)
        return tenant

    def tenant_for(self, metadata: tuple[tuple[str, str | bytes], ...] | None) -> str:
        """The tenant the metadata's token names, or the default tenant when none is sent nor required."""
        header = ""
        for key, value in metadata or ():
            if key == "authorization":
                header = value.decode() if isinstance(value, bytes) else value
        if not header:
            if self.required:
                raise Unauthenticated("missing credentials: send 'authorization: Bearer <token>' metadata")
            return DEFAULT_TENANT
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise Unauthenticated("malformed authorization metadata: expected 'Bearer <token>'")
        for known, tenant in self._tokens.items():
            if hmac.compare_digest(known.encode(), token.strip().encode()):
                return tenant
        raise Unauthenticated("unknown token")


class AuthInterceptor(MethodCachingInterceptor):
    """Runs every call, health and reflection aside, as the tenant its bearer token names."""

    def __init__(self, authenticator: Authenticator) -> None:
        super().__init__()
        self._auth = authenticator

    async def wrap(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        """The handler, resolving the tenant afresh on each call; open services pass through as they are."""
        handler = await continuation(details)
        if handler is None or details.method.startswith(OPEN_SERVICES):
            return handler
        auth = self._auth

        def unary(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
            async def call(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
                tenant = auth.tenant_for_call(context.invocation_metadata())
                if tenant == current_tenant():  # each call has a context of its own: the default one
                    return await fn(request, context)
                with acting_as(tenant):
                    return await fn(request, context)

            return call

        def stream(fn: Callable[..., AsyncIterator[Any]]) -> Callable[..., AsyncIterator[Any]]:
            async def call(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
                with acting_as(auth.tenant_for_call(context.invocation_metadata())):
                    async for item in fn(request, context):
                        yield item

            return call

        return rewrap(handler, unary, stream)
