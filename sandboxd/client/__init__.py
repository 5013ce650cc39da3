"""Python clients for sandboxd: ``AsyncClient`` (asyncio) and ``Client``
(blocking, generated from the async one).

Owns the calls of every service (``pools``, ``execs``, ``files``,
``snapshots``, composed in ``aio``), the status-to-exception translation
(``rpc``), the release retried while the server cannot answer it
(``releasing``), the blocking proxy (``sync``) and the rollout queue's client
(``rollouts``).

May import: the generated ``sandboxd.v1``, ``sandboxd.errors`` and the
``grpc`` package; nothing of the server (core, api, backends, stores, app,
settings), and not the adapters, loop or E2B front end built on it
(contracts in pyproject.toml).
"""

from sandboxd.client.aio import AsyncClient, ExecResult, Lease, Sandbox
from sandboxd.client.sync import Client

__all__ = ["AsyncClient", "Client", "ExecResult", "Lease", "Sandbox"]
