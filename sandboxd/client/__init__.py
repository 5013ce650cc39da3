"""Python clients for sandboxd: ``AsyncClient`` (asyncio) and ``Client``
(blocking, generated from the async one)."""

from sandboxd.client.aio import AsyncClient, ExecResult, Lease, Sandbox
from sandboxd.client.sync import Client

__all__ = ["AsyncClient", "Client", "ExecResult", "Lease", "Sandbox"]
