"""What the E2B front end keeps across restarts when it has a state
directory: the templates built through E2B's template builder (their ready
builds, with what a create needs, and their tags) and the book of E2B
snapshots, in one small JSON file.

The file is rewritten whole after each change worth keeping (a build
requested, ready or failed; tags assigned or removed; a snapshot taken or
deleted): written to a temporary file beside it, flushed to disk and
renamed over it, off the event loop, so a crash leaves the old file or the
new one, never a mix. Writes are serialised and coalesced: a change waits
for a write that includes it. API keys are not stored: each template and
snapshot is kept under a digest of its key (sandboxd.e2b.catalog.owner_of).

At start the file is loaded: a build that was running when the server
stopped is not resumed but becomes an error whose message says the server
restarted (what the SDK's status poll then raises as BuildException, the
same error as a failed build's); a snapshot whose sandboxd snapshot is gone
(deleted, or its lifetime ended) is dropped with a log line; a ready build
whose image is no longer on the engine, nor in a registry the server
reaches, answers creates that it must be built again. A file this version
cannot read (corrupt, or written by a newer one) stops the start with an
error naming it: it holds a user's templates and is not discarded."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
import os
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar, cast

from aiohttp import web

from sandboxd import errors
from sandboxd.client import AsyncClient
from sandboxd.e2b.catalog import BUILDING, ERROR, READY, WAITING, Build, Built, Catalog, owner_of
from sandboxd.e2b.control import Control
from sandboxd.e2b.imagecheck import gone_image, image_missing
from sandboxd.e2b.snapshots import BOOK, Book, Snap

__all__ = ["FORMAT", "VERSION", "StateError", "Store", "attach", "decode", "encode"]

log = logging.getLogger(__name__)

T = TypeVar("T")
ClientOf = Callable[[str], AsyncClient]
"""A snapshot's owner -> the client its calls carry."""

FORMAT = "sandboxd-e2b-state"
VERSION = 1
"""The file's format version; a file of a higher one is refused."""

INTERRUPTED = "interrupted"
"""A build's status in the file when it was requested or running at the last save."""

RESTARTED = (
    "sandboxd's E2B API restarted while this build was waiting or running: builds are not "
    "resumed after a restart; build the template again (the image cache answers steps built before at once)"
)

CHECKS_AT_ONCE = 16
"""Snapshots or images checked with sandboxd at once while loading."""


class StateError(Exception):
    """A state file this version cannot load, naming it and why."""


def _time(t: dt.datetime) -> str:
    return t.isoformat()


def _parse_time(raw: Any) -> dt.datetime:
    if not isinstance(raw, str):
        raise ValueError(f"time {raw!r} is not a string")
    t = dt.datetime.fromisoformat(raw)
    return t if t.tzinfo else t.replace(tzinfo=dt.UTC)


def _encode_build(build: Build) -> dict[str, Any] | None:
    if build.status == READY:
        status = READY
    elif build.status in (WAITING, BUILDING):
        status = INTERRUPTED
    else:
        return None  # a failed build: not kept
    return {
        "id": build.id,
        "created_at": _time(build.created_at),
        "status": status,
        "image": build.image,
        "start_cmd": build.start_cmd,
        "ready_cmd": build.ready_cmd,
        "user": build.user,
        "workdir": build.workdir,
    }


def _encode_template(built: Built) -> dict[str, Any] | None:
    builds = [b for b in (_encode_build(x) for x in built.builds.values()) if b is not None]
    if not builds:
        return None
    kept = {b["id"] for b in builds}
    tags = [
        {"tag": tag, "build": build_id, "at": _time(when)}
        for tag, (build_id, when) in sorted(built.tags.items())
        if build_id in kept
    ]
    return {"id": built.id, "name": built.name, "owner": built.owner, "builds": builds, "tags": tags}


def _encode_snap(snap: Snap) -> dict[str, Any]:
    return {
        "id": snap.id,
        "owner": snap.key,
        "snapshot_id": snap.snapshot_id,
        "pool": snap.pool,
        "image": snap.image,
        "template": snap.template,
        "source": snap.source,
        "live": snap.live,
        "seq": snap.seq,
        "name": snap.name,
        "tag": snap.tag,
    }


def encode(catalog: Catalog, book: Book) -> dict[str, Any]:
    """What the file holds of ``catalog`` and ``book`` now."""
    templates = [t for t in (_encode_template(b) for b in catalog.all()) if t is not None]
    snaps = sorted(book.all(), key=lambda s: s.seq)
    return {
        "format": FORMAT,
        "version": VERSION,
        "templates": templates,
        "snapshots": [_encode_snap(s) for s in snaps],
    }


def _str(d: dict[str, Any], name: str, *, empty: bool = True) -> str:
    value = d.get(name)
    if not isinstance(value, str) or (not empty and not value):
        raise ValueError(f"{name} must be a{'' if empty else ' non-empty'} string, not {value!r}")
    return value


def _decode_build(d: Any, template_id: str) -> Build:
    if not isinstance(d, dict):
        raise ValueError(f"a build must be an object, not {d!r}")
    status = _str(d, "status")
    if status not in (READY, INTERRUPTED):
        raise ValueError(f"build status {status!r} is not {READY!r} or {INTERRUPTED!r}")
    build = Build(
        id=_str(d, "id", empty=False), template_id=template_id, created_at=_parse_time(d.get("created_at"))
    )
    if status == READY:
        build.status = READY
        build.image = _str(d, "image", empty=False)
        build.start_cmd, build.ready_cmd = _str(d, "start_cmd"), _str(d, "ready_cmd")
        build.user, build.workdir = _str(d, "user"), _str(d, "workdir")
        build.log(f"template ready: image {build.image} (loaded after a restart)")
    else:
        build.fail(RESTARTED)
    return build


def _decode_template(d: Any) -> Built:
    if not isinstance(d, dict):
        raise ValueError(f"a template must be an object, not {d!r}")
    built = Built(
        id=_str(d, "id", empty=False), name=_str(d, "name", empty=False), owner=_str(d, "owner", empty=False)
    )
    builds = d.get("builds")
    tags = d.get("tags")
    if not isinstance(builds, list) or not isinstance(tags, list):
        raise ValueError(f"template {built.name!r}: builds and tags must be lists")
    for raw in builds:
        build = _decode_build(raw, built.id)
        built.builds[build.id] = build
    for raw in tags:
        if not isinstance(raw, dict):
            raise ValueError(f"template {built.name!r}: a tag must be an object, not {raw!r}")
        build_id = _str(raw, "build", empty=False)
        if build_id not in built.builds:
            raise ValueError(f"template {built.name!r}: tag {raw.get('tag')!r} names no build of it")
        built.tags[_str(raw, "tag", empty=False)] = (build_id, _parse_time(raw.get("at")))
    return built


def _decode_snap(d: Any, client_of: ClientOf) -> Snap:
    if not isinstance(d, dict):
        raise ValueError(f"a snapshot must be an object, not {d!r}")
    live, seq = d.get("live"), d.get("seq")
    if not isinstance(live, bool) or not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
        raise ValueError(f"snapshot {d.get('id')!r}: live must be a boolean and seq a positive integer")
    owner = _str(d, "owner", empty=False)
    return Snap(
        id=_str(d, "id", empty=False),
        key=owner,
        client=client_of(owner),
        snapshot_id=_str(d, "snapshot_id", empty=False),
        pool=_str(d, "pool", empty=False),
        image=_str(d, "image"),
        template=_str(d, "template"),
        source=_str(d, "source"),
        live=live,
        seq=seq,
        name=_str(d, "name"),
        tag=_str(d, "tag", empty=False),
    )


def _no_client(owner: str) -> AsyncClient:
    return cast(AsyncClient, None)


def decode(path: Path, raw: bytes, client_of: ClientOf = _no_client) -> tuple[list[Built], list[Snap]]:
    """The templates and snapshots of a state file's bytes; ``client_of``
    (owner -> AsyncClient) gives each snapshot its client. Raises StateError
    naming ``path`` when the bytes are not a state file this version reads."""
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise StateError(f"{path}: not a readable E2B state file ({e}); refusing to start over it") from e
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise StateError(
            f"{path}: not an E2B state file of sandboxd (format {FORMAT!r}); refusing to start over it"
        )
    version = data.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise StateError(f"{path}: its version {version!r} is not a number; refusing to start over it")
    if version > VERSION:
        raise StateError(
            f"{path}: written by a newer sandboxd (format version {version}; this one reads up to "
            f"{VERSION}); run that version, or move the file away to start without its templates "
            "and snapshots"
        )
    try:
        templates, snaps = data.get("templates"), data.get("snapshots")
        if not isinstance(templates, list) or not isinstance(snaps, list):
            raise ValueError("templates and snapshots must be lists")
        builts = [_decode_template(t) for t in templates]
        books = [_decode_snap(s, client_of) for s in snaps]
    except (ValueError, TypeError) as e:
        raise StateError(f"{path}: corrupt E2B state file ({e}); refusing to start over it") from e
    return builts, books


def _write(path: Path, raw: bytes) -> None:
    """``raw`` as ``path``'s content, atomically: a temporary file beside it,
    flushed to disk, renamed over it, and the directory flushed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _read(path: Path) -> bytes | None:
    for stale in path.parent.glob(f".{path.name}.*.tmp"):
        # A write a crash cut short: the file itself is whole, old or new.
        with contextlib.suppress(OSError):
            stale.unlink()
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


class Store:
    """The state file of one front end: ``save`` writes the catalog and book
    as they are (serialised, coalesced, off the loop), ``load`` reads them."""

    def __init__(self, path: Path, catalog: Catalog, book: Book) -> None:
        self.path = path
        self.catalog = catalog
        self.book = book
        self._lock = asyncio.Lock()
        self._asked = 0
        self._written = 0

    async def load(self, client_of: ClientOf = _no_client) -> tuple[list[Built], list[Snap]]:
        """The file's templates and snapshots ([] and [] when there is none yet)."""
        try:
            raw = await asyncio.to_thread(_read, self.path)
        except OSError as e:
            raise StateError(f"{self.path}: cannot be read ({e}); refusing to start without it") from e
        if raw is None:
            return [], []
        return decode(self.path, raw, client_of)

    async def save(self) -> None:
        """Writes the state as it is now, or waits for a write begun after
        this call that includes it. A failed write is logged, the state kept
        in memory for the next one."""
        self._asked += 1
        wanted = self._asked
        async with self._lock:
            if self._written >= wanted:
                return  # a write that began after this change was asked for has it
            upto = self._asked
            raw = json.dumps(encode(self.catalog, self.book), indent=1, sort_keys=True).encode()
            try:
                await asyncio.to_thread(_write, self.path, raw)
            except OSError as e:
                log.error(
                    "the E2B state file %s could not be written (kept in memory until the next change): %s",
                    self.path,
                    e,
                )
                return
            self._written = upto


def _client_of(control: Control) -> ClientOf:
    """owner -> the client its calls carry: a tenant key's own client, else the server's."""
    tenants = {owner_of(k): k for k in control.settings.tenant_tokens}

    def client(owner: str) -> AsyncClient:
        key = tenants.get(owner)
        return control.client if key is None else control.client_for(key)

    return client


async def _gone(snap: Snap) -> bool:
    try:
        await snap.client.get_snapshot(snap.snapshot_id)
    except errors.NotFound:
        return True
    except errors.SandboxdError as e:
        log.warning(
            "E2B snapshot %s (sandboxd snapshot %s) could not be checked, kept: %s",
            snap.ref,
            snap.snapshot_id,
            e,
        )
    return False


async def _check(control: Control, store: Store) -> bool:
    """Drops the snapshots sandboxd no longer has and marks the ready builds
    whose image is gone; whether anything was dropped."""
    gate = asyncio.Semaphore(CHECKS_AT_ONCE)

    async def gated(coro: Awaitable[T]) -> T:
        async with gate:
            return await coro

    snaps = store.book.all()
    gone = await asyncio.gather(*(gated(_gone(s)) for s in snaps))
    for snap, is_gone in zip(snaps, gone, strict=True):
        if is_gone:
            log.warning(
                "E2B snapshot %s dropped: its sandboxd snapshot %s is gone (deleted, or its lifetime ended)",
                snap.ref,
                snap.snapshot_id,
            )
            store.book.drop(snap)
    client = _client_of(control)
    ready = [(t, b) for t in store.catalog.all() for b in t.builds.values() if b.status == READY]
    images = {b.image: client(t.owner) for t, b in ready}
    why = await asyncio.gather(*(gated(image_missing(c, image)) for image, c in images.items()))
    missing = dict(zip(images, why, strict=True))
    for built, build in ready:
        if missing[build.image]:
            build.gone = gone_image(build.image, missing[build.image])
            log.warning("E2B template %s (%s) build %s: %s", built.name, built.id, build.id, build.gone)
    return any(gone)


def attach(app: web.Application, control: Control, path: Path) -> None:
    """Keeps the app's templates and snapshots in the state file ``path``:
    loaded and checked at the app's start (StateError when it cannot be
    read), saved after each change; the close then keeps the snapshots."""
    book = app[BOOK]
    store = Store(path, control.catalog, book)

    async def load(app: web.Application) -> None:
        builts, snaps = await store.load(_client_of(control))
        for built in builts:
            control.catalog.add(built)
        book.restore(snaps)
        interrupted = sum(1 for t in builts for b in t.builds.values() if b.status == ERROR)
        dropped = await _check(control, store)
        log.info(
            "E2B state %s: %d templates, %d snapshots loaded (%d builds interrupted by the restart)",
            path,
            len(builts),
            len(book.all()),
            interrupted,
        )
        control.catalog.on_change = book.on_change = store.save
        if dropped or interrupted:
            await store.save()

    app.on_startup.append(load)
