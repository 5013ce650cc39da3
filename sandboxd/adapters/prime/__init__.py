"""Prime Intellect's sandbox API (what the PyPI ``prime-sandboxes`` SDK speaks,
and through it verifiers, prime-environments and prime-rl) served over
sandboxd, so their code runs unchanged with ``PRIME_API_BASE_URL`` pointed
here::

    sandboxd prime-api --target 127.0.0.1:50051 --port 8000 --image-pool python:3.11-slim=py
    PRIME_API_BASE_URL=http://127.0.0.1:8000 PRIME_API_KEY=... python my_env.py

Served (paths under ``/api/v1``): ``POST /sandbox`` (create), ``GET /sandbox``
(list: page, per_page, status, labels, is_active), ``DELETE /sandbox`` (bulk
delete by ids or labels), ``GET`` / ``DELETE /sandbox/{id}``, ``POST
/sandbox/{id}/auth``, ``GET /sandbox/{id}/error-context``, ``GET
/sandbox/{id}/logs``, ``POST /sandbox/status:batchGet``; and the gateway that
``auth`` points at (``/gateway/<ns>/<id>/...``): ``upload``, ``download``,
``read-file`` and the Connect RPC ``command_session.CommandSession/Start``
that ``execute_command`` streams (so background jobs work too: they are
built on these). Anything else answers 404, which the SDK treats as "not
supported here".

A sandbox is a sandboxd lease. Its image names a pool: one given with
``image_pools``, else one created on first use per (image, CPU, memory,
disk), with those as its limits. ``create`` answers at once with status
PENDING; the lease is acquired behind it (RUNNING), and ``timeout_minutes``
and ``idle_timeout_minutes`` end it (TIMEOUT). ``environment_vars`` and
``secrets`` are set for every command; ``working_dir``, ``env``, ``timeout``
and ``user`` per command mean what they mean in the SDK (a timed-out command
raises CommandTimeoutError, its process tree killed; ``user="root"`` is
sandboxd's root without capabilities). Sandboxes here have no network, so a
``network_allowlist``, GPUs, checkpoints, volumes and a ``start_command``
are refused rather than ignored.

The package, by concept: ``settings`` (PrimeSettings), ``sandbox`` (one
Prime sandbox and its JSON), ``registry`` (PrimeServer: sandboxes, leases,
pools, the heartbeat loop), ``connect`` (the Connect framing and the
``command_session`` messages), ``rest`` and ``gateway`` (the routes),
``app`` (make_app) and ``cli`` (serve, run_cli).

May import: only the public client API (``sandboxd.client``,
``sandboxd.errors``) and aiohttp; nothing of the server (pyproject.toml's
"Client side speaks only the public client API" contract checks it).
"""

from __future__ import annotations

from .app import PRIME_SERVER, make_app
from .cli import run_cli, serve
from .registry import PrimeServer
from .settings import PrimeSettings

__all__ = ["PRIME_SERVER", "PrimeServer", "PrimeSettings", "make_app", "run_cli", "serve"]
