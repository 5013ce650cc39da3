"""E2B's control API (api.e2b.app's /sandboxes routes) over sandboxd leases:
create (the older ``POST /sandboxes`` and the newer ``/v2/sandboxes``), get,
list (with metadata queries), set timeout and kill, with the state they
share; connect, pause, resume and fork (each fork a restore of a workspace
snapshot) are in sandboxd.e2b.lifecycle, the template builder in
sandboxd.e2b.builds.

The sandbox timeout is the lease's TTL: the server ends the sandbox when it
passes, and set_timeout/connect heartbeat the lease. Pause keeps memory
(the SDK's ``keep_memory``, default true) where sandboxd can freeze the
sandbox (gVisor: memory and processes kept); otherwise, or asked not to,
it keeps the filesystem: the workspace is snapshotted and the sandbox
released, and resume restores the snapshot into a fresh one under the same
E2B id. The pause answer's ``X-Sandboxd-Pause`` header (``live`` or
``filesystem``) and the info's ``pauseKind`` say which was done.

A create's ``network`` and ``allow_internet_access`` narrow the lease's
network rules within its pool's as sandboxd.e2b.egress maps them (deny-all
alone: no network at all); ``update_network`` replaces them on the running
lease the same way (sandboxd.e2b.lifecycle). Metrics are sampled when asked
(sandboxd.e2b.metrics, over sandboxd.e2b.usage's samples)."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hmac
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web

from sandboxd import errors
from sandboxd.client import AsyncClient
from sandboxd.client.releasing import release_lease
from sandboxd.e2b.catalog import Catalog, NotBuilt
from sandboxd.e2b.egress import BadNetwork, Egress, NarrowedClient, egress_of, info_of, lease_rules
from sandboxd.e2b.imagecheck import gone_image, image_missing
from sandboxd.e2b.registry import PAUSED, RUNNING, Box, Registry, new_id, now
from sandboxd.e2b.startcmd import StartFailed, start_command
from sandboxd.e2b.templates import Template
from sandboxd.e2b.uploads import Uploads
from sandboxd.e2b.usage import Samples
from sandboxd.v1 import common_pb2

__all__ = ["Control", "E2bSettings", "ImageBuilder", "Refused"]

ENVD_VERSION = "0.5.7"
"""The envd version this server answers as: stdin (0.3.0), default user
(0.4.0), close stdin (0.5.2) and octet-stream uploads (0.5.7)."""

MAX_TIMEOUT = 24 * 3600

T = TypeVar("T")

ImageBuilder = Callable[[Path, Callable[[str], None]], Awaitable[str]]
"""Builds the image of a context directory holding a Dockerfile, streaming
its log lines; answers its tag (the server's image cache builds)."""


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
    build_image: ImageBuilder | None = None
    """How templates built through the SDK's template builder are built; None = not served."""
    build_pool: str = ""
    """The pool built templates' sandboxes come from: one serving any image
    (``images = ["*"]``), with ``root = "writable"`` where they should write
    outside the workspace as E2B's do."""
    state_file: Path | None = None
    """Where built templates and E2B snapshots are kept across restarts
    (sandboxd.e2b.state); None = in memory, the close deleting the snapshots."""


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
        self.catalog = Catalog()
        self.uploads = Uploads()
        self.samples = Samples()
        """The metrics samples earlier get_metrics calls took, per E2B id."""
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
        tasks = self.catalog.all_tasks()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

        async def release(box: Box) -> None:
            # Each release is retried while the server is busy, and one that still
            # fails does not keep the other boxes from theirs.
            self.registry.drop(box)
            if box.state == RUNNING or box.paused_live:
                await release_lease(lambda: box.client.release(box.lease_id), box.lease_id, f"e2b {box.id}")
            if box.snapshot_id:
                # A paused box's snapshot holds no sandbox: the server's snapshot TTL ends it.
                with contextlib.suppress(errors.SandboxdError):
                    await box.client.delete_snapshot(box.snapshot_id)

        await asyncio.gather(*(release(box) for box in self.registry.all()))
        for c in self._tenants.values():
            await c.close()
        await self.uploads.close()

    async def end(self, box: Box) -> None:
        self.registry.drop(box)
        self.samples.forget(box.id)
        if box.state == RUNNING or box.paused_live:
            # Retried while the server is busy: a killed box must not hold its sandbox until the TTL.
            await release_lease(lambda: box.client.release(box.lease_id), box.lease_id, f"e2b {box.id}")
        if box.snapshot_id:
            with contextlib.suppress(errors.NotFound):  # the server's snapshot TTL ended it already
                await box.client.delete_snapshot(box.snapshot_id)


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
        **network_info(box),
    }


def network_info(box: Box) -> dict[str, Any]:
    """The info's ``network`` and ``allowInternetAccess`` of a sandbox
    created with them (none: its pool's rules, E2B's "all allowed")."""
    if not isinstance(box.client, NarrowedClient):
        return {}
    egress = box.client.egress
    internet = {} if egress.internet is None else {"allowInternetAccess": egress.internet}
    return {"network": info_of(egress), **internet}


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
    mapped = control.settings.templates.get(template)
    target = mapped or Template(template)
    try:
        await client.get_pool(target.pool)
    except errors.NotFound as e:
        raise Refused(404, f"template '{template}' not found (no sandboxd pool {target.pool!r})") from e
    except errors.InvalidArgument as e:
        if mapped is not None:
            raise refused(e) from e
        # An unmapped name is taken for a pool's; one no pool can have is no template.
        why = f"not in the templates, nor a pool's name: {e}"
        raise Refused(404, f"template '{template}' not found ({why})") from e
    except errors.SandboxdError as e:
        raise refused(e) from e
    return target


# What the newer create (POST /v2/sandboxes) may ask that sandboxd cannot
# give: a sandbox has no volumes, MCP gateway or workload identity, and its
# lease ends it at the timeout rather than pausing it.
_UNSERVED = {
    "volumeMounts": "volumes are not served: copy files in with sandbox.files",
    "mcp": "the MCP gateway is not served",
    "iam": "workload identity tokens are not served",
}


def check_lifecycle(given: dict[str, Any]) -> None:
    """Refuses, naming it, what a create asks that sandboxd does not do
    (``network`` is checked by ``network_of``, for either create)."""
    for name, why in _UNSERVED.items():
        if given.get(name) not in (None, [], {}):
            raise Refused(400, f"{name}: {why}")
    auto_resume = given.get("autoResume")
    if isinstance(auto_resume, dict) and auto_resume.get("enabled"):
        raise Refused(400, "autoResume is not served: a sandbox ends at its timeout")
    if given.get("autoPause") is True:
        raise Refused(
            400, "autoPause (lifecycle on_timeout='pause') is not served: a sandbox ends at its timeout"
        )


def network_of(given: dict[str, Any]) -> Egress | None:
    """A create's ``network`` and ``allow_internet_access`` (the SDK's
    spelling; ``allowInternetAccess`` too) checked: None = the pool's rules."""
    internet = given.get("allow_internet_access", given.get("allowInternetAccess"))
    try:
        return egress_of(given.get("network"), internet)
    except BadNetwork as e:
        raise Refused(400, str(e)) from e


async def narrowing(client: AsyncClient, pool: str, egress: Egress) -> tuple[tuple[str, ...], bool]:
    """The rules a lease of ``pool`` runs under for ``egress``, and whether
    it has no network at all: its allowed entries on the ports the pool
    allows them (sandboxd refuses, naming it, one outside the pool's
    rules); none (sandboxd's ``no_network``, which changes nothing on a pool
    without network) where all is denied and nothing allowed."""
    if not egress.allow:
        return (), True
    try:
        pool_rules = list((await client.get_pool(pool)).spec.network)
    except errors.SandboxdError as e:
        raise refused(e) from e
    return lease_rules(egress.allow, pool_rules), False


async def create_v2(control: Control, request: web.Request) -> web.Response:
    """The newer SDKs' create (e2b 2.36 on): the same sandbox, with lifecycle,
    network and volume options that are checked, not ignored."""
    given = await body(request)
    check_lifecycle(given)
    return await _create(control, request, given)


async def create(control: Control, request: web.Request) -> web.Response:
    return await _create(control, request, await body(request))


async def _create(control: Control, request: web.Request, given: dict[str, Any]) -> web.Response:
    key = control.key(request)
    template = given.get("templateID")
    if not isinstance(template, str) or not template:
        raise Refused(400, "templateID is required")
    timeout = timeout_of(given, 300)
    metadata, envs = strings(given, "metadata"), strings(given, "envVars")
    egress = network_of(given)
    client = control.client_for(key)
    try:
        built = control.catalog.resolve(key, template)
    except NotBuilt as e:
        raise Refused(404, str(e)) from e
    if built is not None:
        target = Template(control.settings.build_pool, built.image)
    else:
        target = await resolve_template(control, client, template)
    rules, no_network = ((), False) if egress is None else await narrowing(client, target.pool, egress)
    try:
        lease = await client.lease(
            target.pool,
            lease_ttl=max(timeout, 1),
            timeout=control.settings.acquire_timeout,
            image=target.image,
            network=rules,
            no_network=no_network,
        )
    except errors.SandboxdError as e:
        if built is not None and not isinstance(e, errors.ResourceExhausted | errors.InvalidArgument):
            # Only this engine ever held a built template's image: a pull of
            # it fails however the registry answers, so say what mends it.
            why = await image_missing(client, built.image)
            if why:
                built.gone = gone_image(built.image, why)
                raise Refused(404, f"template '{template}': {built.gone}") from e
        raise refused(e) from e
    sandbox = lease.sandboxes[0]
    box = Box(
        id=new_id(),
        key=key,
        # A narrowed sandbox's restores (resume, fork) carry its rules.
        client=client if egress is None else NarrowedClient(client, egress, rules, no_network),
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
    if built is not None and built.start_cmd:
        try:
            await start_command(box, built, control.settings.acquire_timeout)
        except StartFailed as e:
            await control.end(box)
            raise Refused(502, f"template '{template}': {e}") from e
    return web.json_response(created(box), status=201)


async def of_running(control: Control, box: Box, call: Awaitable[T]) -> T:
    """``call``'s answer about the box's sandbox; 404 (the box forgotten) once it ended."""
    try:
        return await call
    except errors.NotFound as e:
        control.registry.drop(box)
        raise Refused(404, f"sandbox {box.id} not found: it ended") from e
    except errors.SandboxdError as e:
        raise refused(e) from e


async def running_sandbox(control: Control, box: Box) -> common_pb2.Sandbox:
    """The box's sandbox as sandboxd has it now, still under the box's
    lease; 404 (the box forgotten) once it ended or went to another lease."""
    info = await of_running(control, box, box.client.get_sandbox(box.sandbox_id))
    if info.lease_id != box.lease_id:
        control.registry.drop(box)
        raise Refused(404, f"sandbox {box.id} not found: it ended")
    return info


async def get_info(control: Control, request: web.Request) -> web.Response:
    box = control.box(request)
    if box.state == PAUSED and not box.paused_live:
        return web.json_response(detail(box))
    limits = (await running_sandbox(control, box)).limits
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
    await extend_box(control, box, timeout)
    return web.Response(status=204)


async def refresh(control: Control, request: web.Request) -> web.Response:
    """E2B's keep-alive (``POST /sandboxes/{id}/refreshes``): the sandbox
    runs at least ``duration`` seconds more (default: its timeout); its end
    only grows, as on connect."""
    box = control.box(request)
    given = await body(request)
    duration = given.get("duration", int(box.timeout))
    if not isinstance(duration, int) or isinstance(duration, bool) or not 0 <= duration <= MAX_TIMEOUT:
        raise Refused(400, f"duration must be an integer from 0 to {MAX_TIMEOUT} seconds")
    if now() + dt.timedelta(seconds=duration) > box.end_at:
        await extend_box(control, box, duration)
    return web.Response(status=204)


async def extend_box(control: Control, box: Box, timeout: int) -> None:
    if box.state == RUNNING:
        try:
            await box.client.heartbeat(box.lease_id, ttl=max(timeout, 1))
        except errors.NotFound as e:
            control.registry.drop(box)
            raise Refused(404, f"sandbox {box.id} not found: it ended") from e
        except errors.SandboxdError as e:
            raise refused(e) from e
    box.extend(timeout)


async def template_alias(control: Control, request: web.Request) -> web.Response:
    """Whether a template exists (``Template.alias_exists``): a template is a
    pool, so one exists where its pool does. Builds are not served, so code
    that builds only when the alias is missing (Harbor's E2B environment)
    runs on pools made beforehand."""
    key = control.key(request)
    alias = request.match_info["alias"]
    built = control.catalog.find(key, alias)
    if built is not None:
        return web.json_response({"public": False, "templateID": built.id, "aliases": [built.name]})
    await resolve_template(control, control.client_for(key), alias)
    return web.json_response({"public": False, "templateID": alias, "aliases": [alias]})
