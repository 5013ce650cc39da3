"""E2B's sandbox snapshots over sandboxd snapshots: ``create_snapshot``
(POST /sandboxes/{id}/snapshots), ``list_snapshots`` (GET /snapshots),
``delete_snapshot`` (DELETE /templates/{id}) and ``Sandbox.create`` given a
snapshot's id or name (each create a restore of it into the pool its source
came from; N creates from one snapshot are N concurrent restores, a fork).

A snapshot keeps memory and processes where sandboxd can checkpoint the
running sandbox (gVisor pools with live snapshots), the filesystem (the
workspace) otherwise or when E2B's ``mode="filesystem"`` asks for it; the
``X-Sandboxd-Snapshot`` header of the answer (``live`` or ``filesystem``)
says which. The source keeps running.

Snapshots belong to the API key that took them, not to their sandbox: they
outlive its kill, and only that key sees, restores and deletes them. Each is
taken with the longest lifetime sandboxd grants (SNAPSHOT_TTL, or the
server's default where its ``max_ttl_seconds`` is lower), so it lasts until
deleted or that lifetime ends. With a state directory (sandboxd.e2b.state)
the book of snapshots is saved after each snapshot taken or deleted and
loaded at the next start, dropping those sandboxd no longer has; without
one it is this server's memory, and its close deletes every snapshot it
took. The book keeps each snapshot under a digest of its API key
(``owner_of``), never the key itself.

Naming follows E2B's snapshot templates: an unnamed snapshot is
``<id>:default``; one named ``name`` or ``name:tag`` (tag ``default`` when
none) is ``name:tag``, and a later snapshot of the same name and tag takes
that name over, the earlier one staying reachable by its id. A reference
resolves by id (``<id>`` or ``<id>:default``) or by name (a bare name means
its ``default`` tag for a create; every tag of it for a list filter or a
delete)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from sandboxd import errors
from sandboxd.client import AsyncClient
from sandboxd.e2b.catalog import DEFAULT_TAG, owner_of, split_ref
from sandboxd.e2b.control import (
    Control,
    Refused,
    body,
    created,
    narrowing,
    network_of,
    refused,
    resolve_template,
    strings,
    timeout_of,
)
from sandboxd.e2b.egress import NarrowedClient
from sandboxd.e2b.registry import RUNNING, Box, new_id
from sandboxd.v1 import snapshots_pb2

__all__ = ["BOOK", "Book", "Snap", "add_routes", "from_snapshots", "page"]

Route = Callable[[Control, web.Request], Awaitable[web.StreamResponse]]

SNAPSHOT_TTL = 365 * 24 * 3600.0
"""The lifetime asked for each snapshot: sandboxd's default longest
(``[snapshots] max_ttl_seconds``); a server that allows less gives its default."""

PAGE_LIMIT = 100
"""Snapshots a list page holds unless asked for fewer (and at most)."""

_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,127}$", re.IGNORECASE)
_TAG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_ID = re.compile(r"^s[0-9a-f]{20}$")


@dataclass
class Snap:
    """One E2B snapshot: a sandboxd snapshot an API key took of one of its sandboxes."""

    id: str
    key: str
    """The digest of the API key that took it (``owner_of``)."""
    client: AsyncClient
    snapshot_id: str
    """sandboxd's snapshot."""
    pool: str
    image: str
    template: str
    """The template of the sandbox it was taken of."""
    source: str
    """The E2B id of the sandbox it was taken of."""
    live: bool
    seq: int
    """Its place in the order snapshots were taken (the list's order)."""
    name: str = ""
    tag: str = DEFAULT_TAG

    @property
    def ref(self) -> str:
        """E2B's snapshotID: ``name:tag``, or ``<id>:default`` when unnamed."""
        return f"{self.name}:{self.tag}" if self.name else f"{self.id}:{DEFAULT_TAG}"

    def info(self) -> dict[str, Any]:
        """E2B's SnapshotInfo."""
        return {"snapshotID": self.ref, "names": [self.ref] if self.name else []}


def parse_name(raw: object) -> tuple[str, str]:
    """A create_snapshot's ``name`` as (name, tag); ("", default) when none is given."""
    if raw is None or raw == "":
        return "", DEFAULT_TAG
    if not isinstance(raw, str):
        raise Refused(400, "name must be a string: the snapshot's name (optionally name:tag)")
    name, tag = split_ref(raw)
    if not _NAME.match(name) or _ID.match(name):
        raise Refused(
            400,
            f"snapshot name {name!r} must be 1-128 letters, digits, '.', '_' or '-', starting with a "
            "letter or digit, and not shaped like a snapshot id",
        )
    if tag and not _TAG.match(tag):
        raise Refused(400, f"tag {tag!r} must be letters, digits, '.', '_' or '-'")
    return name, tag or DEFAULT_TAG


class Book:
    """The snapshots this server took, by id, each of one API key."""

    def __init__(self) -> None:
        self._snaps: dict[str, Snap] = {}
        self._seq = itertools.count(1)
        self.on_change: Callable[[], Awaitable[None]] | None = None
        """Saves the book (sandboxd.e2b.state); None = kept in memory only,
        and the front end's close deletes the snapshots."""

    async def changed(self) -> None:
        """Called after a snapshot is taken or deleted."""
        if self.on_change is not None:
            await self.on_change()

    def restore(self, snaps: list[Snap]) -> None:
        """Records snapshots loaded from the state file; later ones list after them."""
        for snap in snaps:
            self._snaps[snap.id] = snap
        self._seq = itertools.count(max((s.seq for s in self._snaps.values()), default=0) + 1)

    @staticmethod
    def new_id() -> str:
        return "s" + secrets.token_hex(10)

    def next_seq(self) -> int:
        return next(self._seq)

    def add(self, snap: Snap) -> Snap | None:
        """Records ``snap``; the key's earlier snapshot of the same name and
        tag, if any, loses that name to it (kept, under its id) and is answered."""
        displaced = None
        if snap.name:
            for other in self.of_key(snap.key):
                if (other.name, other.tag) == (snap.name, snap.tag):
                    other.name, other.tag, displaced = "", DEFAULT_TAG, other
        self._snaps[snap.id] = snap
        return displaced

    def drop(self, snap: Snap) -> None:
        self._snaps.pop(snap.id, None)

    def of_key(self, key: str) -> list[Snap]:
        """The key's snapshots, oldest first."""
        return sorted((s for s in self._snaps.values() if s.key == key), key=lambda s: s.seq)

    def matching(self, key: str, ref: str, *, every_tag: bool) -> list[Snap]:
        """The key's snapshots ``ref`` names: by id (``<id>``, ``<id>:default``)
        or by ``name:tag``; a bare name is its default tag, or with
        ``every_tag`` every tag of it."""
        base, tag = split_ref(ref)

        def named(s: Snap) -> bool:
            if s.id == base:
                return tag in ("", DEFAULT_TAG)
            if not s.name or s.name != base:
                return False
            return tag == s.tag if tag else every_tag or s.tag == DEFAULT_TAG

        return [s for s in self.of_key(key) if named(s)]

    def resolve(self, key: str, ref: str) -> Snap | None:
        """The key's one snapshot a create's templateID names, or None."""
        found = self.matching(key, ref, every_tag=False)
        return found[-1] if found else None

    def all(self) -> list[Snap]:
        return list(self._snaps.values())


BOOK = web.AppKey("e2b_snapshots", Book)


def page(snaps: list[Snap], limit: int, token: str) -> tuple[list[Snap], str]:
    """One page of ``snaps`` (oldest first) after ``token`` (the place of
    the last one answered before; "" = from the start): at most ``limit`` of
    them and the token of the next page, "" when this is the last."""
    after = 0
    if token:
        if not token.isdigit() or len(token) > 18:
            raise Refused(400, f"nextToken {token[:40]!r} is not one this server gave")
        after = int(token)
    rest = [s for s in snaps if s.seq > after]
    shown = rest[:limit]
    return shown, (str(shown[-1].seq) if len(rest) > limit else "")


def parse_limit(raw: str | None) -> int:
    if raw is None or raw == "":
        return PAGE_LIMIT
    if not raw.isdigit() or not 1 <= int(raw) <= PAGE_LIMIT:
        raise Refused(400, f"limit must be an integer from 1 to {PAGE_LIMIT}")
    return int(raw)


async def _take(box: Box, snap_id: str, live: bool) -> snapshots_pb2.Snapshot:
    labels = {"e2b.snapshot": snap_id, "e2b.sandbox": box.id}
    try:
        return await box.client.snapshot(box.sandbox_id, labels=labels, ttl=SNAPSHOT_TTL, live=live)
    except errors.InvalidArgument as e:
        if "ttl" not in str(e):
            raise
    # This server grants less than SNAPSHOT_TTL: its default lifetime, then.
    return await box.client.snapshot(box.sandbox_id, labels=labels, live=live)


async def _check_name_free(control: Control, key: str, name: str) -> None:
    """Refuses a snapshot name that names one of the key's templates: a
    create from it would be ambiguous."""
    taken = name in control.settings.templates or control.catalog.find(key, name) is not None
    if not taken:
        with contextlib.suppress(Refused):
            await resolve_template(control, control.client_for(key), name)
            taken = True
    if taken:
        raise Refused(409, f"snapshot name {name!r} is a template's: name the snapshot otherwise")


async def create_snapshot(control: Control, request: web.Request) -> web.Response:
    """POST /sandboxes/{id}/snapshots: E2B's SnapshotInfo, 201."""
    book = request.app[BOOK]
    box = control.box(request)
    given = await body(request)
    name, tag = parse_name(given.get("name"))
    memory = given.get("memory", True)
    if not isinstance(memory, bool):
        raise Refused(400, "memory must be a boolean (the SDK's mode: 'full' or 'filesystem')")
    if box.state != RUNNING:
        raise Refused(409, f"sandbox {box.id} is paused; resume it to snapshot it")
    if name:
        await _check_name_free(control, box.key, name)
    snap_id = Book.new_id()
    try:
        taken = None
        if memory:
            # Only gVisor sandboxes (of pools with live snapshots) checkpoint; others keep their files.
            with contextlib.suppress(errors.FailedPrecondition):
                taken = await _take(box, snap_id, live=True)
        if taken is None:
            taken = await _take(box, snap_id, live=False)
    except errors.SandboxdError as e:
        raise refused(e) from e
    snap = Snap(
        id=snap_id,
        key=owner_of(box.key),
        client=box.client,
        snapshot_id=taken.id,
        pool=box.pool,
        image=box.image,
        template=box.template,
        source=box.id,
        live=taken.live,
        seq=book.next_seq(),
        name=name,
        tag=tag,
    )
    book.add(snap)
    await book.changed()
    kind = "live" if snap.live else "filesystem"
    return web.json_response(snap.info(), status=201, headers={"X-Sandboxd-Snapshot": kind})


async def list_snapshots(control: Control, request: web.Request) -> web.Response:
    """GET /snapshots: the key's snapshots, oldest first, filtered by source
    sandbox (``sandboxID``) and ``name``; paged by ``limit`` and the
    ``nextToken`` the previous page's ``x-next-token`` header gave."""
    key = owner_of(control.key(request))
    book = request.app[BOOK]
    query = request.query
    limit = parse_limit(query.get("limit"))
    name = query.get("name", "")
    snaps = book.matching(key, name, every_tag=True) if name else book.of_key(key)
    source = query.get("sandboxID", "")
    if source:
        snaps = [s for s in snaps if s.source == source]
    shown, token = page(snaps, limit, query.get("nextToken", ""))
    headers = {"X-Next-Token": token} if token else {}
    return web.json_response([s.info() for s in shown], headers=headers)


async def delete_template(control: Control, request: web.Request) -> web.Response:
    """DELETE /templates/{id}: the snapshots the reference names (a bare
    name: every tag of it), 204; 404 when it names none of the key's. A
    built or configured template is not deleted here: 400 says so."""
    key = control.key(request)
    book = request.app[BOOK]
    ref = request.match_info["template_id"]
    found = book.matching(owner_of(key), ref, every_tag=True)
    if not found:
        if control.catalog.find(key, split_ref(ref)[0]) is not None or ref in control.settings.templates:
            raise Refused(
                400,
                f"template '{ref}' is a template, not a snapshot: deleting templates is not served "
                "(a built template lasts as long as this server; a configured one is its settings')",
            )
        raise Refused(404, f"snapshot '{ref}' not found")
    for snap in found:
        book.drop(snap)
    await book.changed()
    for snap in found:
        try:
            await snap.client.delete_snapshot(snap.snapshot_id)
        except errors.NotFound:
            pass  # its lifetime ended it already
        except errors.SandboxdError as e:
            raise refused(e) from e
    return web.Response(status=204)


async def _restore(control: Control, key: str, snap: Snap, given: dict[str, Any]) -> web.Response:
    # Narrowed as a create from a template is; without network options the
    # restore keeps what the snapshot's sandbox ran under (its client's rules).
    egress = network_of(given)
    rules, none = ((), False) if egress is None else await narrowing(snap.client, snap.pool, egress)
    timeout = timeout_of(given, 300)
    metadata, envs = strings(given, "metadata"), strings(given, "envVars")
    try:
        lease = await snap.client.restore(
            snap.snapshot_id,
            pool=snap.pool,
            lease_ttl=max(timeout, 1),
            timeout=control.settings.acquire_timeout,
            network=rules,
            no_network=none,
        )
    except errors.NotFound as e:
        raise Refused(404, f"snapshot '{snap.ref}' not found: its lifetime ended") from e
    except errors.SandboxdError as e:
        raise refused(e) from e
    box = Box(
        id=new_id(),
        key=key,
        client=snap.client if egress is None else NarrowedClient(snap.client, egress, rules, none),
        template=snap.ref,
        pool=snap.pool,
        image=snap.image,
        metadata=metadata,
        envs=envs,
        timeout=timeout,
        sandbox_id=lease.sandboxes[0].id,
        lease_id=lease.id,
    )
    box.extend(timeout)
    control.registry.add(box)
    return web.json_response(created(box), status=201)


def from_snapshots(create: Route) -> Route:
    """``create`` (a create route), where a templateID that names no
    template (its 404) but one of the key's snapshots restores that
    snapshot instead: templates come first, so a create from a template
    costs nothing more. The create has read and checked the body (its
    timeout, metadata and envs, and what the newer create refuses)."""

    async def handle(control: Control, request: web.Request) -> web.StreamResponse:
        try:
            return await create(control, request)
        except Refused as e:
            if e.status != 404:
                raise
            given = await request.json()  # read by the create already: its copy
            template = given.get("templateID") if isinstance(given, dict) else None
            key = control.key(request)
            book = request.app[BOOK]
            snap = book.resolve(owner_of(key), template) if isinstance(template, str) else None
            if snap is None:
                raise
        return await _restore(control, key, snap, given)

    return handle


def add_routes(app: web.Application, route: Callable[[Route], Any]) -> None:
    """The snapshot routes, and the close that deletes every snapshot taken
    unless the book is saved (added before the control's close, which closes
    the tenants' clients)."""
    app[BOOK] = Book()
    r = app.router
    r.add_post("/sandboxes/{sandbox_id}/snapshots", route(create_snapshot))
    r.add_get("/snapshots", route(list_snapshots))
    r.add_delete("/templates/{template_id}", route(delete_template))

    async def close(app: web.Application) -> None:
        book = app[BOOK]
        if book.on_change is not None:
            return  # saved: E2B's snapshots outlive the front end

        async def delete(snap: Snap) -> None:
            book.drop(snap)
            with contextlib.suppress(errors.SandboxdError):
                await snap.client.delete_snapshot(snap.snapshot_id)

        await asyncio.gather(*(delete(s) for s in book.all()))

    app.on_cleanup.append(close)
