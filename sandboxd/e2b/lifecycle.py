"""E2B's sandbox lifecycle past create: pause and resume (mapped onto
sandboxd's live pause under gVisor or a workspace snapshot otherwise, as
sandboxd.e2b.control's docstring says), connect (which resumes a paused
sandbox), fork (N sandboxes restored from one's workspace snapshot), and
update_network (the running lease's rules replaced, SetLeaseNetwork)."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from typing import Any

from aiohttp import web

from sandboxd import errors
from sandboxd.e2b.control import (
    MAX_TIMEOUT,
    Control,
    Refused,
    body,
    created,
    extend_box,
    narrowing,
    network_of,
    refused,
    timeout_of,
)
from sandboxd.e2b.egress import NarrowedClient
from sandboxd.e2b.registry import PAUSED, RUNNING, Box, new_id, now

__all__ = ["connect", "fork", "pause", "resume", "update_network"]


async def update_network(control: Control, request: web.Request) -> web.Response:
    """``sandbox.update_network``: the whole egress config replaced, mapped
    as a create's (sandboxd.e2b.egress): deny-all with ``allow_out`` those
    hosts, deny-all alone (or ``allow_internet_access`` false) no network at
    all, no deny-all the pool's own rules again. Answered 204 once the new
    rules hold (connections they no longer allow cut); the sandbox's later
    resumes, forks and snapshots carry them. What cannot be served is 400
    naming it; a sandbox paused to its filesystem (no lease runs) is 409."""
    box = control.box(request)
    given = await body(request)
    network = {k: v for k, v in given.items() if k not in ("allow_internet_access", "allowInternetAccess")}
    internet = given.get("allow_internet_access", given.get("allowInternetAccess"))
    try:
        asked = network_of({"network": network, "allow_internet_access": internet})
    except Refused as e:
        raise Refused(400, f"update_network: {e.message}") from e
    if box.state == PAUSED and not box.paused_live:
        raise Refused(
            409, f"sandbox {box.id} is paused to its filesystem (it runs no lease): resume it, then update"
        )
    base = control.client_for(box.key)
    rules, no_network = ((), False) if asked is None else await narrowing(base, box.pool, asked)
    try:
        await base.set_lease_network(box.lease_id, rules, no_network=no_network)
    except errors.NotFound as e:
        control.registry.drop(box)
        raise Refused(404, f"sandbox {box.id} not found: {e}") from e
    except errors.SandboxdError as e:
        raise Refused(refused(e).status, f"update_network: {e}") from e
    # A new client, not this one changed: forks and snapshots taken before keep theirs.
    box.client = base if asked is None else NarrowedClient(base, asked, rules, no_network)
    return web.Response(status=204)


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
    given = await body(request)
    timeout = timeout_of(given, 300)
    # The newer connect's ``memory`` (false: resume from the disk state only)
    # changes nothing for a filesystem pause, which has only that; a live
    # pause resumes with its memory either way.
    if not isinstance(given.get("memory", True), bool):
        raise Refused(400, "memory must be a boolean")
    if box.state == PAUSED:
        await _resume(control, box, timeout)
        return web.json_response(created(box), status=201)
    # A running sandbox's timeout only grows on connect.
    if now() + dt.timedelta(seconds=timeout) > box.end_at:
        await extend_box(control, box, timeout)
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
