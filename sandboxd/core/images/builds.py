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
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sandboxd.backends.base import LABEL_IMAGE_BUILD, LABEL_MANAGED, BuildSpec, ImageStore
from sandboxd.errors import FailedPrecondition, InvalidArgument

DEFAULT_REPOSITORY = "sandboxd-build"
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


def _tag_for(
    context: Path, dockerfile: str, build_args: Mapping[str, str], repository: str
) -> tuple[str, str]:
    if not context.is_dir():
        raise InvalidArgument("context", f"{context} is not a directory")
    if not (context / dockerfile).is_file():
        raise InvalidArgument("dockerfile", f"{dockerfile} is not a file in {context}")
    digest = recipe_hash(context, dockerfile, build_args)
    return f"{repository}:{digest[:HASH_CHARS]}", digest


@dataclass
class _Build:
    tag: str
    started: float
    log: list[str] = field(default_factory=list)
    listeners: list[Callable[[str], None]] = field(default_factory=list)
    task: asyncio.Task[None] | None = None

    def emit(self, line: str) -> None:
        self.log.append(line)
        for listener in list(self.listeners):
            listener(line)


class Builds:
    """Builds in flight by tag: callers asking for the same recipe share one
    build and each sees its whole log."""

    def __init__(self, store: ImageStore | None, slots: asyncio.Semaphore, now: Callable[[], float]) -> None:
        self._store = store
        self._now = now
        self._slots = slots
        self._building: dict[str, _Build] = {}

    def cancel(self) -> list[asyncio.Task[None]]:
        """Cancels every build in flight; returns their tasks to wait for."""
        tasks = [b.task for b in self._building.values() if b.task is not None]
        for task in tasks:
            task.cancel()
        return tasks

    def in_flight(self) -> list[tuple[str, float, str]]:
        """(tag, when it started, latest log line) of each build running or waiting."""
        return [(b.tag, b.started, b.log[-1] if b.log else "queued") for b in self._building.values()]

    async def tag_for(
        self, context: Path, dockerfile: str, build_args: Mapping[str, str], repository: str
    ) -> tuple[str, str]:
        """(tag, hash) of the recipe; InvalidArgument when the context or its Dockerfile is missing."""
        return await asyncio.to_thread(_tag_for, context, dockerfile, build_args, repository)

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
            for line in running.log:
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
        async with self._slots:
            async for line in self._store.build_image(spec):
                build.emit(line)


def build_labels(digest: str) -> dict[str, str]:
    """The labels a built image carries: sandboxd made it, from this recipe."""
    return {LABEL_MANAGED: "true", LABEL_IMAGE_BUILD: digest}
