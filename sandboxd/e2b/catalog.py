"""The templates built through E2B's template builder (``Template.build``):
each name an API key built, its builds, and the tags naming them.

E2B tags a build when it starts (a tag may name a build still running) and
launches sandboxes from a template by name (its ``default`` tag), by
``name:tag`` or ``name:build_id``, or by the template's id. A built
template's image is one sandboxd built; its sandboxes come from the pool the
server names for built templates.

Without a state directory the catalog is this server's memory: after a
restart a template is built again, which the image cache answers at once
(the same steps and files give the same image). With one
(sandboxd.e2b.state) its ready builds and tags are saved after each change
and loaded at the next start; a build that was running then is an error
saying so, and one whose image left the engine meanwhile answers creates
that it must be built again. Templates are kept by a digest of their API
key (``owner_of``), never the key itself."""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import secrets
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["DEFAULT_TAG", "Build", "Built", "Catalog", "NotBuilt", "owner_of", "split_ref"]

DEFAULT_TAG = "default"
"""The tag a build gets when its name carries none (E2B's)."""

WAITING, BUILDING, READY, ERROR = "waiting", "building", "ready", "error"
MAX_LOG_ENTRIES = 20_000


def owner_of(key: str) -> str:
    """The digest an API key's templates and snapshots are kept under: what
    a state file holds instead of the key (a caller's key is hashed to find them)."""
    return hashlib.sha256(b"sandboxd e2b api key\0" + key.encode()).hexdigest()


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def stamp(t: dt.datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


@dataclass
class Build:
    """One build of a template: its state, its log and, once ready, its image."""

    id: str
    template_id: str
    created_at: dt.datetime = field(default_factory=_now)
    status: str = WAITING
    image: str = ""
    entries: list[dict[str, Any]] = field(default_factory=list)
    """The build's log as E2B's BuildLogEntry objects."""
    reason: dict[str, Any] | None = None
    """Why it failed: E2B's BuildStatusReason (message, step, logEntries)."""
    start_cmd: str = ""
    ready_cmd: str = ""
    user: str = ""
    """The user its last step set (start_cmd runs as it)."""
    workdir: str = ""
    task: asyncio.Task[None] | None = None
    gone: str = ""
    """Why a ready build loaded from the state file can no longer start
    sandboxes (its image left the engine); "" = it can."""

    dropped: int = 0
    """Log lines past MAX_LOG_ENTRIES, not kept."""

    def log(self, message: str, level: str = "info", step: str = "") -> None:
        # A build can print without end; the SDK pages the log by offset, so
        # lines past the cap are dropped (and counted) rather than the first.
        if len(self.entries) >= MAX_LOG_ENTRIES and level != "error":
            self.dropped += 1
            return
        entry: dict[str, Any] = {"timestamp": stamp(_now()), "level": level, "message": message}
        if step:
            entry["step"] = step
        self.entries.append(entry)

    def finish_log(self) -> None:
        if self.dropped:
            note = f"({self.dropped} log lines not kept)"
            self.entries.append({"timestamp": stamp(_now()), "level": "warn", "message": note})

    def fail(self, message: str, step: str = "") -> None:
        self.finish_log()
        self.log(message, "error", step)
        self.status = ERROR
        self.reason = {"message": message, "logEntries": self.entries[-20:]}
        if step:
            self.reason["step"] = step


@dataclass
class Built:
    """A template name an API key builds: its builds and their tags."""

    id: str
    name: str
    owner: str
    """The digest of the API key that built it (``owner_of``)."""
    builds: dict[str, Build] = field(default_factory=dict)
    tags: dict[str, tuple[str, dt.datetime]] = field(default_factory=dict)
    """tag -> (build id, when it was assigned)."""

    def tag(self, tags: list[str], build_id: str) -> None:
        when = _now()
        for t in tags:
            self.tags[t] = (build_id, when)

    def listed_tags(self) -> list[dict[str, Any]]:
        return [{"tag": t, "buildID": b, "createdAt": stamp(w)} for t, (b, w) in sorted(self.tags.items())]


class NotBuilt(LookupError):
    """A reference that names a built template but no ready build of it,
    saying why (E2B's words: "tag 'x' does not exist for template 'y'")."""


def split_ref(ref: str) -> tuple[str, str]:
    """``name:tag`` -> (name, tag); a bare name has E2B's default tag."""
    name, sep, tag = ref.rpartition(":")
    if not sep or not name:
        return ref, ""
    return name, tag


class Catalog:
    """Built templates by API key and name, and by template id."""

    def __init__(self) -> None:
        self._by_name: dict[tuple[str, str], Built] = {}
        self._by_id: dict[str, Built] = {}
        self.on_change: Callable[[], Awaitable[None]] | None = None
        """Saves the catalog (sandboxd.e2b.state); None = kept in memory only."""

    async def changed(self) -> None:
        """Called after a change worth keeping: a build requested, ready or
        failed, tags assigned or removed."""
        if self.on_change is not None:
            await self.on_change()

    def template(self, key: str, name: str) -> Built:
        """The key's template of this name, made on its first build."""
        owner = owner_of(key)
        found = self._by_name.get((owner, name))
        if found is None:
            found = Built(id="t" + secrets.token_hex(10), name=name, owner=owner)
            self.add(found)
        return found

    def add(self, built: Built) -> None:
        """Records a template (one loaded from the state file)."""
        self._by_name[(built.owner, built.name)] = built
        self._by_id[built.id] = built

    def all(self) -> list[Built]:
        return list(self._by_id.values())

    def find(self, key: str, name_or_id: str) -> Built | None:
        """The key's template named, or of that id."""
        owner = owner_of(key)
        found = self._by_name.get((owner, name_or_id)) or self._by_id.get(name_or_id)
        return found if found is not None and found.owner == owner else None

    def new_build(self, built: Built) -> Build:
        build = Build(id=str(uuid.uuid4()), template_id=built.id)
        built.builds[build.id] = build
        return build

    def build(self, key: str, template_id: str, build_id: str) -> tuple[Built, Build] | None:
        built = self.find(key, template_id)
        if built is None or build_id not in built.builds:
            return None
        return built, built.builds[build_id]

    def resolve(self, key: str, ref: str) -> Build | None:
        """The ready build a sandbox's ``template`` names: None when it names
        no built template; NotBuilt when the template has no such ready build."""
        built = self.find(key, ref)
        tag = DEFAULT_TAG
        if built is None:
            name, tag = split_ref(ref)
            built = self.find(key, name) if tag else None
            if built is None:
                return None
        build = built.builds.get(tag)
        if build is None:
            build_id = built.tags.get(tag, ("", _now()))[0]
            build = built.builds.get(build_id)
        if build is None or build.status != READY:
            raise NotBuilt(f"tag '{tag}' does not exist for template '{built.name}'")
        if build.gone:
            raise NotBuilt(f"template '{built.name}' (build {build.id}): {build.gone}")
        return build

    def all_tasks(self) -> list[asyncio.Task[None]]:
        builds = [b for t in self._by_id.values() for b in t.builds.values()]
        return [b.task for b in builds if b.task is not None and not b.task.done()]
