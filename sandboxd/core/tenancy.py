"""Which tenant a call acts for. The API layer's auth interceptor sets it per
RPC; the core stamps new objects with it and answers NOT_FOUND for objects of
other tenants, so one tenant cannot learn that another's ids exist."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

DEFAULT_TENANT = "default"

_tenant: contextvars.ContextVar[str] = contextvars.ContextVar("sandboxd_tenant", default=DEFAULT_TENANT)


def current_tenant() -> str:
    """The tenant this call acts for; the default tenant outside any authenticated call."""
    return _tenant.get()


def set_tenant(tenant: str) -> contextvars.Token[str]:
    """Makes the current context act for ``tenant``; the token undoes it. Prefer ``acting_as``."""
    return _tenant.set(tenant)


@contextlib.contextmanager
def acting_as(tenant: str) -> Iterator[None]:
    """Acts for ``tenant`` inside the block; the previous tenant is back afterwards, even on error."""
    token = _tenant.set(tenant)
    try:
        yield
    finally:
        _tenant.reset(token)


def pool_key(tenant: str, name: str) -> str:
    """The internal name of a tenant's pool. Pool names cannot contain '/',
    so keys of different tenants never collide."""
    return name if tenant == DEFAULT_TENANT else f"{tenant}/{name}"


def split_pool_key(key: str) -> tuple[str, str]:
    """(tenant, pool name) of an internal key; the inverse of ``pool_key``."""
    tenant, sep, name = key.partition("/")
    return (tenant, name) if sep else (DEFAULT_TENANT, key)


def owns(key: str) -> bool:
    """Whether the current tenant owns the pool with this internal key."""
    return split_pool_key(key)[0] == current_tenant()
