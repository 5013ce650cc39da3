"""E2B's control API (api.e2b.app's /sandboxes routes) over sandboxd leases:
create, get, list (with metadata queries), set timeout, kill, connect,
pause, resume and fork (each fork a restore of a workspace snapshot).

The sandbox timeout is the lease's TTL: the server ends the sandbox when it
passes, and set_timeout/connect heartbeat the lease. Pause keeps memory
(the SDK's ``keep_memory``, default true) where sandboxd can freeze the
sandbox (gVisor: memory and processes kept); otherwise, or asked not to,
it keeps the filesystem: the workspace is snapshotted and the sandbox
released, and resume restores the snapshot into a fresh one under the same
E2B id. The pause answer's ``X-Sandboxd-Pause`` header (``live`` or
``filesystem``) and the info's ``pauseKind`` say which was done."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hmac
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from sandboxd import errors
from sandboxd.client import AsyncClient
from sandboxd.e2b.registry import PAUSED, RUNNING, Box, Registry, new_id, now
from sandboxd.e2b.templates import Template

__all__ = ["Control", "E2bSettings", "Refused"]

ENVD_VERSION = "0.5.7"
"""The envd version this server answers as: stdin (0.3.0), default user
(0.4.0), close stdin (0.5.2) and octet-stream uploads (0.5.7)."""

MAX_TIMEOUT = 24 * 3600


@dataclass(frozen=True)
class E2bSettings:
    """What the E2B front end serves: its templates, accepted keys and tenants."""

    templates: dict[str, Template] = field(default_factory=dict)
    """E2B template name -> its pool and image; an unmapped name is the pool
    of that name with the pool's own image."""
    api_keys: frozenset[str] = frozenset()
    """Accepted X-API-Keys; empty = any key (each key its own namespace)."""
    tenant_tokens: dict[str, str] = field(default_factory=dict)
    """X-API-Key -> the sandboxd tenant token its calls carry (others: the server's own)."""
    acquire_timeout: float = 60.0


class Refused(Exception):
    """An error answer of the control API: {"code": status, "message": ...}."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def refused(e: errors.SandboxdError) -> Refused:
    """A sandboxd error as the control API answers it."""
    if isinstance(e, errors.NotFound):
        return Refused(404, str(e))
    if isinstance(e, errors.InvalidArgument):
        return Refused(400, str(e))
    if isinstance(e, errors.ResourceExhausted | errors.Unavailable):
        return Refused(429, str(e))
    if isinstance(e, errors.Unauthenticated | errors.PermissionDenied):
        return Refused(401, str(e))
    if isinstance(e, errors.FailedPrecondition):
        return Refused(409, str(e))
    if isinstance(e, errors.DeadlineExceeded):
        return Refused(504, str(e))
    return Refused(502, str(e))


class Control:
    """The control routes' state: settings, clients per tenant, the registry."""

    def __init__(self, client: AsyncClient, settings: E2bSettings, registry: Registry) -> None:
        self.client = client
        self.settings = settings
        self.registry = registry
        self._tenants: dict[str, AsyncClient] = {}

    def key(self, request: web.Request) -> str:
        key = request.headers.get("X-API-Key", "")
        if not key:
            raise Refused(401, "X-API-Key is required")
        if self.settings.api_keys and not any(hmac.compare_digest(key, k) for k in self.settings.api_keys):
            raise Refused(401, "invalid API key")
        return key

    def client_for(self, key: str) -> AsyncClient:
        token = self.settings.tenant_tokens.get(key)
        if token is None:
            return self.client
        if key not in self._tenants:
            self._tenants[key] = AsyncClient(self.client.target, token=token)
        return self._tenants[key]

    def box(self, request: web.Request) -> Box:
        box_id = request.match_info["sandbox_id"]
        box = self.registry.get(self.key(request), box_id)
        if box is None:
            raise Refused(404, f"sandbox {box_id} not found")
        return box

    async def close(self) -> None:
        for box in self.registry.all():
            await self.end(box)
        for c in self._tenants.values():
            await c.close()

    async def end(self, box: Box) -> None:
        self.registry.drop(box)
        try:
            if box.state == RUNNING or box.paused_live:
                await box.client.release(box.lease_id)
            if box.snapshot_id:
                await box.client.delete_snapshot(box.snapshot_id)
        except errors.NotFound:
            pass  # its lease had already ended


async def body(request: web.Request) -> dict[str, Any]:
    if not request.can_read_body:
        return {}
    try:
        value = await request.json()
    except ValueError as e:
        raise Refused(400, f"body is not JSON: {e}") from e
    if not isinstance(value, dict):
        raise Refused(400, "body must be a JSON object")
    return value


def timeout_of(given: dict[str, Any], default: int) -> int:
    value = given.get("timeout", default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0 or value > MAX_TIMEOUT:
        raise Refused(400, f"timeout must be an integer from 0 to {MAX_TIMEOUT} seconds")
    return value


def strings(given: dict[str, Any], name: str) -> dict[str, str]:
    value = given.get(name) or {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise Refused(400, f"{name} must map strings to strings")
    return dict(value)


def _stamp(t: dt.datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def created(box: Box) -> dict[str, Any]:
    """The Sandbox answer of create, connect and resume."""
    return {
        "templateID": box.template,
        "sandboxID": box.id,
        "alias": box.template,
        "clientID": "sandboxd",
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": box.access_token,
        "trafficAccessToken": box.traffic_token,
        "domain": None,
    }


def detail(box: Box, cpu_millis: int = 0, memory_bytes: int = 0, disk_bytes: int = 0) -> dict[str, Any]:
    """The SandboxDetail / ListedSandbox answer."""
    return {
        **created(box),
        "cpuCount": max(1, cpu_millis // 1000),
        "memoryMB": memory_bytes >> 20,
        "diskSizeMB": disk_bytes >> 20,
        "startedAt": _stamp(box.started_at),
        "endAt": _stamp(box.end_at),
        "state": box.state,
        "metadata": box.metadata,
        "pauseKind": ("live" if box.paused_live else "filesystem") if box.state == PAUSED else "",
    }


def metadata_query(raw: str) -> dict[str, str]:
    """The SDK's ``metadata`` list filter: an url-encoded ``k=v&k2=v2``."""
    if not raw:
        return {}
    try:
        pairs = urllib.parse.parse_qsl(raw, keep_blank_values=True, strict_parsing=True)
    except ValueError as e:
        raise Refused(400, f"metadata filter must be url-encoded key=value pairs: {e}") from e
    return dict(pairs)


async def resolve_template(control: Control, client: AsyncClient, template: str) -> Template:
    """The template's pool and image, the pool checked to exist; an unknown
    template is 404 "template 'x' not found", E2B's answer (the SDK raises
    ``SandboxException`` from create, ``alias_exists`` answers False)."""
    target = control.settings.templates.get(template, Template(template))
    try:
        await client.get_pool(target.pool)
    except errors.NotFound as e:
        raise Refused(404, f"template '{template}' not found (no sandboxd pool {target.pool!r})") from e
    except errors.SandboxdError as e:
        raise refused(e) from e
    return target


async def create(control: Control, request: web.Request) -> web.Response:
    key = control.key(request)
    given = await body(request)
    template = given.get("templateID")
    if not isinstance(template, str) or not template:
        raise Refused(400, "templateID is required")
    timeout = timeout_of(given, 300)
    metadata, envs = strings(given, "metadata"), strings(given, "envVars")
    client = control.client_for(key)
    target = await resolve_template(control, client, template)
    try:
        lease = await client.lease(
            target.pool,
            lease_ttl=max(timeout, 1),
            timeout=control.settings.acquire_timeout,
            image=target.image,
        )
    except errors.SandboxdError as e:
        raise refused(e) from e
    sandbox = lease.sandboxes[0]
    box = Box(
        id=new_id(),
        key=key,
        client=client,
        template=template,
        pool=target.pool,
        image=target.image,
        metadata=metadata,
        envs=envs,
        timeout=timeout,
        sandbox_id=sandbox.id,
        lease_id=lease.id,
    )
    box.extend(timeout)
    control.registry.add(box)
    return web.json_response(created(box), status=201)


async def get_info(control: Control, request: web.Request) -> web.Response:
    box = control.box(request)
    if box.state == PAUSED and not box.paused_live:
        return web.json_response(detail(box))
    try:
        info = await box.client.get_sandbox(box.sandbox_id)
    except errors.NotFound as e:
        control.registry.drop(box)
        raise Refused(404, f"sandbox {box.id} not found: it ended") from e
    except errors.SandboxdError as e:
        raise refused(e) from e
    if info.lease_id != box.lease_id:
        control.registry.drop(box)
        raise Refused(404, f"sandbox {box.id} not found: it ended")
    limits = info.limits
    return web.json_response(detail(box, limits.cpu_millis, limits.memory_bytes, limits.disk_bytes))


async def list_boxes(control: Control, request: web.Request) -> web.Response:
    wanted = metadata_query(request.query.get("metadata", ""))
    states = {s for s in request.query.get("state", "").split(",") if s} or {RUNNING, PAUSED}
    boxes = [
        b
        for b in control.registry.of_key(control.key(request))
        if b.state in states and all(b.metadata.get(k) == v for k, v in wanted.items())
    ]
    return web.json_response([detail(b) for b in boxes])


async def kill(control: Control, request: web.Request) -> web.Response:
    await control.end(control.box(request))
    return web.Response(status=204)


async def set_timeout(control: Control, request: web.Request) -> web.Response:
    box = control.box(request)
    timeout = timeout_of(await body(request), int(box.timeout))
    await _extend(control, box, timeout)
    return web.Response(status=204)


async def _extend(control: Control, box: Box, timeout: int) -> None:
    if box.state == RUNNING:
        try:
            await box.client.heartbeat(box.lease_id, ttl=max(timeout, 1))
        except errors.NotFound as e:
            control.registry.drop(box)
            raise Refused(404, f"sandbox {box.id} not found: it ended") from e
        except errors.SandboxdError as e:
            raise refused(e) from e
    box.extend(timeout)


async def pause(control: Control, request: web.Request) -> web.Response:
    box = control.box(request)
    if box.state == PAUSED:
        raise Refused(409, f"sandbox {box.id} is already paused")
    memory = (await body(request)).get("memory", True)
    if not isinstance(memory, bool):
        raise Refused(400, "memory must be a boolean")
    try:
        box.paused_live = False
        if memory:
            # Only gVisor sandboxes freeze; others keep their filesystem below.
            with contextlib.suppress(errors.FailedPrecondition):
                await box.client.pause(box.sandbox_id)
                box.paused_live = True
        if box.paused_live:
            # A paused E2B sandbox has no timeout: its lease is stretched to
            # the longest the server grants (at worst it keeps its own).
            with contextlib.suppress(errors.SandboxdError):
                await box.client.heartbeat(box.lease_id, ttl=MAX_TIMEOUT)
        if not box.paused_live:
            snap = await box.client.snapshot(box.sandbox_id)
            box.snapshot_id = snap.id
            await box.client.release(box.lease_id)
    except errors.SandboxdError as e:
        raise refused(e) from e
    box.state = PAUSED
    if not box.paused_live:
        # The fresh sandbox of a resume runs none of these.
        for proc in list(box.processes.values()):
            proc.cancel()
        for kernel in box.kernels.values():
            kernel.close()
        box.kernels.clear()
    return web.Response(status=204, headers={"X-Sandboxd-Pause": "live" if box.paused_live else "filesystem"})


async def _resume(control: Control, box: Box, timeout: int) -> None:
    try:
        if box.paused_live:
            await box.client.resume(box.sandbox_id)
            await box.client.heartbeat(box.lease_id, ttl=max(timeout, 1))
        else:
            lease = await box.client.restore(
                box.snapshot_id,
                pool=box.pool,
                lease_ttl=max(timeout, 1),
                timeout=control.settings.acquire_timeout,
            )
            box.sandbox_id, box.lease_id = lease.sandboxes[0].id, lease.id
            await box.client.delete_snapshot(box.snapshot_id)
            box.snapshot_id = ""
    except errors.SandboxdError as e:
        raise refused(e) from e
    box.state, box.paused_live = RUNNING, False
    box.extend(timeout)


async def resume(control: Control, request: web.Request) -> web.Response:
    box = control.box(request)
    if box.state != PAUSED:
        raise Refused(409, f"sandbox {box.id} is not paused")
    await _resume(control, box, timeout_of(await body(request), 300))
    return web.json_response(created(box), status=201)


async def connect(control: Control, request: web.Request) -> web.Response:
    box = control.box(request)
    timeout = timeout_of(await body(request), 300)
    if box.state == PAUSED:
        await _resume(control, box, timeout)
        return web.json_response(created(box), status=201)
    # A running sandbox's timeout only grows on connect.
    if now() + dt.timedelta(seconds=timeout) > box.end_at:
        await _extend(control, box, timeout)
    return web.json_response(created(box), status=200)


MAX_FORKS = 64


async def _fork_one(control: Control, box: Box, snapshot_id: str, timeout: int) -> dict[str, Any]:
    try:
        lease = await box.client.restore(
            snapshot_id, pool=box.pool, lease_ttl=max(timeout, 1), timeout=control.settings.acquire_timeout
        )
    except errors.SandboxdError as e:
        failed = refused(e)
        return {"error": {"code": failed.status, "message": failed.message}}
    child = Box(
        id=new_id(),
        key=box.key,
        client=box.client,
        template=box.template,
        pool=box.pool,
        image=box.image,
        metadata=dict(box.metadata),
        envs=dict(box.envs),
        timeout=timeout,
        sandbox_id=lease.sandboxes[0].id,
        lease_id=lease.id,
    )
    child.extend(timeout)
    control.registry.add(child)
    return {"sandbox": created(child)}


async def fork(control: Control, request: web.Request) -> web.Response:
    """N sandboxes from this one's workspace, each under a lease of its own."""
    box = control.box(request)
    given = await body(request)
    timeout = timeout_of(given, 300)
    count = given.get("count", 1)
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_FORKS:
        raise Refused(400, f"count must be an integer from 1 to {MAX_FORKS}")
    if box.state != RUNNING:
        raise Refused(409, f"sandbox {box.id} is paused; resume it to fork it")
    try:
        snap = await box.client.snapshot(box.sandbox_id)
    except errors.SandboxdError as e:
        raise refused(e) from e
    try:
        results = await asyncio.gather(*(_fork_one(control, box, snap.id, timeout) for _ in range(count)))
    finally:
        with contextlib.suppress(errors.SandboxdError):
            await box.client.delete_snapshot(snap.id)
    return web.json_response(list(results), status=201)


async def template_alias(control: Control, request: web.Request) -> web.Response:
    """Whether a template exists (``Template.alias_exists``): a template is a
    pool, so one exists where its pool does. Builds are not served, so code
    that builds only when the alias is missing (Harbor's E2B environment)
    runs on pools made beforehand."""
    client = control.client_for(control.key(request))
    alias = request.match_info["alias"]
    await resolve_template(control, client, alias)
    return web.json_response({"public": False, "templateID": alias, "aliases": [alias]})
