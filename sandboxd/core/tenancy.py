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
    return _tenant.get()


def set_tenant(tenant: str) -> contextvars.Token[str]:
    return _tenant.set(tenant)


@contextlib.contextmanager
def acting_as(tenant: str) -> Iterator[None]:
    token = _tenant.set(tenant)
    try:
        yield
    finally:
        _tenant.reset(token)
