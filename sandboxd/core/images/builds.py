"""Images built from a Dockerfile and its context through the engine, cached
by a hash of the Dockerfile, every file of the context and the build
arguments: the tag carries the hash, so the same recipe is built once and
found again (after a restart too), and a changed file makes a new image.
Bases come from the engine or a registry it reaches (no pull of a base is
forced), so builds work offline."""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import stat
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sandboxd.backends.base import LABEL_IMAGE_BUILD, LABEL_MANAGED, BuildSpec, ImageStore
from sandboxd.errors import FailedPrecondition, InvalidArgument

DEFAULT_REPOSITORY = "sandboxd-build"
SYNTAX_ARG = "BUILDKIT_SYNTAX"
"""The build argument by which BuildKit runs another Dockerfile frontend (an image)."""
HASH_CHARS = 32


def recipe_hash(context: Path, dockerfile: str, build_args: Mapping[str, str]) -> str:
    """sha256 over the Dockerfile's path and text, each file, directory and
    link of ``context`` (path, mode, content or target) in sorted order, and
    the build arguments. Blocking: run on a worker thread."""
    digest = hashlib.sha256()

    def part(*items: bytes) -> None:
        for item in items:
            digest.update(len(item).to_bytes(8, "big"))
            digest.update(item)

    part(b"dockerfile", dockerfile.encode(), (context / dockerfile).read_bytes())
    for root, dirs, files in os.walk(context):
        dirs.sort()
        for name in sorted([*dirs, *files]):
            path = Path(root) / name
            rel = str(path.relative_to(context)).encode("utf-8", "surrogateescape")
            info = path.lstat()
            mode = stat.S_IMODE(info.st_mode).to_bytes(4, "big")
            if stat.S_ISLNK(info.st_mode):
                part(b"link", rel, mode, os.readlink(path).encode("utf-8", "surrogateescape"))
            elif stat.S_ISDIR(info.st_mode):
                part(b"dir", rel, mode)
            elif stat.S_ISREG(info.st_mode):
                part(b"file", rel, mode, path.read_bytes())
    for key in sorted(build_args):
        part(b"arg", key.encode(), build_args[key].encode())
    return digest.hexdigest()


def names_frontend(dockerfile: str) -> bool:
    """Whether a Dockerfile's parser directives (its leading ``#`` lines)
    name its frontend (``# syntax=IMAGE``)."""
    for line in dockerfile.splitlines():
        text = line.strip()
        if not text:
            continue
        if not text.startswith("#"):
            return False
        key, eq, _ = text[1:].partition("=")
        if eq and key.strip().lower() == "syntax":
            return True
    return False


_ARG_REF = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


def bases_of(dockerfile: str, build_args: Mapping[str, str]) -> list[str]:
    """The images a Dockerfile's FROM lines name, in order, without
    ``scratch``, its own stages and references still holding a variable
    after the build arguments and the ARGs before the first FROM are put in."""
    globals_: dict[str, str] = {}
    stages: set[str] = set()
    out: list[str] = []
    seen_from = False
    for line in dockerfile.replace("\\\n", " ").splitlines():
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        keyword = words[0].upper()
        if keyword == "ARG" and not seen_from and len(words) > 1:
            name, _, default = words[1].partition("=")
            globals_[name] = build_args.get(name, default.strip("\"'"))
        if keyword != "FROM":
            continue
        seen_from = True
        rest = [w for w in words[1:] if not w.startswith("--")]
        if not rest:
            continue
        image = _ARG_REF.sub(lambda m: globals_.get(m.group(1) or m.group(2), m.group(0)), rest[0])
        own_stage = image.lower() in stages
        if len(rest) >= 3 and rest[1].upper() == "AS":
            stages.add(rest[2].lower())
        if "$" in image or image.lower() == "scratch" or own_stage or image in out:
            continue
        out.append(image)
    return out


def _recipe(
    context: Path, dockerfile: str, build_args: Mapping[str, str], repository: str, frontend: str
) -> tuple[str, str, dict[str, str]]:
    if not context.is_dir():
        raise InvalidArgument("context", f"{context} is not a directory")
    if not (context / dockerfile).is_file():
        raise InvalidArgument("dockerfile", f"{dockerfile} is not a file in {context}")
    args = dict(build_args)
    # The frontend decides what the Dockerfile means: part of the recipe.
    if frontend and SYNTAX_ARG not in args:
        text = (context / dockerfile).read_text(errors="replace")
        if not names_frontend(text):
            args[SYNTAX_ARG] = frontend
    digest = recipe_hash(context, dockerfile, args)
    return f"{repository}:{digest[:HASH_CHARS]}", digest, args


Prepare = Callable[[BuildSpec, Callable[[str], None]], Awaitable[BuildSpec]]
"""What a build does before it runs, given its spec and its log; returns the spec to build."""

# Log lines a build keeps for callers who join it late (they see its first
# line and these): a build can print far more than is worth holding.
REPLAY_LINES = 2000


@dataclass
class _Build:
    tag: str
    started: float
    first: str = ""
    log: deque[str] = field(default_factory=lambda: deque(maxlen=REPLAY_LINES))
    dropped: int = 0
    listeners: list[Callable[[str], None]] = field(default_factory=list)
    task: asyncio.Task[None] | None = None

    def replay(self) -> list[str]:
        """What a caller joining now sees of the lines so far."""
        skipped = [f"({self.dropped} lines of this build's log skipped)"] if self.dropped else []
        return ([self.first] if self.first else []) + skipped + list(self.log)

    def latest(self) -> str:
        """The newest line, "queued" before any."""
        return self.log[-1] if self.log else self.first or "queued"

    def emit(self, line: str) -> None:
        if not self.first:
            self.first = line
        else:
            if len(self.log) == self.log.maxlen:
                self.dropped += 1
            self.log.append(line)
        for listener in list(self.listeners):
            listener(line)


class Builds:
    """Builds in flight by tag: callers asking for the same recipe share one
    build and each sees its log from its first line (one who joins a long
    build late: its first line, a note of how many were skipped, and the
    latest REPLAY_LINES)."""

    def __init__(
        self,
        store: ImageStore | None,
        slots: asyncio.Semaphore,
        now: Callable[[], float],
        prepare: Prepare | None = None,
    ) -> None:
        """``prepare`` runs once per build before it takes a slot (pulls of
        its bases take slots of their own) and gives the spec to build."""
        self._store = store
        self._now = now
        self._slots = slots
        self._prepare = prepare
        self._building: dict[str, _Build] = {}

    def cancel(self) -> list[asyncio.Task[None]]:
        """Cancels every build in flight; returns their tasks to wait for."""
        tasks = [b.task for b in self._building.values() if b.task is not None]
        for task in tasks:
            task.cancel()
        return tasks

    def in_flight(self) -> list[tuple[str, float, str]]:
        """(tag, when it started, latest log line) of each build running or waiting."""
        return [(b.tag, b.started, b.latest()) for b in self._building.values()]

    async def recipe(
        self,
        context: Path,
        dockerfile: str,
        build_args: Mapping[str, str],
        repository: str,
        frontend: str = "",
    ) -> tuple[str, str, dict[str, str]]:
        """(tag, hash, build arguments to send) of the recipe: with ``frontend``
        (an image of a Dockerfile frontend) as BUILDKIT_SYNTAX when the
        Dockerfile names none. InvalidArgument when the context or its
        Dockerfile is missing."""
        return await asyncio.to_thread(_recipe, context, dockerfile, build_args, repository, frontend)

    async def build(
        self,
        spec: BuildSpec,
        on_log: Callable[[str], None] | None,
    ) -> None:
        """Builds ``spec`` once however many ask at once, streaming its log
        (from its first line) to ``on_log``. Raises BuildFailed naming the
        failing step, FailedPrecondition when the backend cannot build."""
        if self._store is None:
            raise FailedPrecondition("this backend does not build images")
        running = self._building.get(spec.tag)
        if running is None:
            running = _Build(spec.tag, self._now())
            self._building[spec.tag] = running
            running.task = asyncio.create_task(self._run(running, spec), name=f"build {spec.tag}")
            running.task.add_done_callback(lambda _: self._building.pop(spec.tag, None))
        if on_log is not None:
            for line in running.replay():
                on_log(line)
            running.listeners.append(on_log)
        assert running.task is not None
        try:
            await asyncio.shield(running.task)
        finally:
            if on_log is not None and on_log in running.listeners:
                running.listeners.remove(on_log)

    async def _run(self, build: _Build, spec: BuildSpec) -> None:
        assert self._store is not None
        if self._prepare is not None:
            spec = await self._prepare(spec, build.emit)
        async with self._slots:
            async for line in self._store.build_image(spec):
                build.emit(line)


def build_labels(digest: str) -> dict[str, str]:
    """The labels a built image carries: sandboxd made it, from this recipe."""
    return {LABEL_MANAGED: "true", LABEL_IMAGE_BUILD: digest}
