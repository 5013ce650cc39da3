"""The fake backend's images (ImageStore): an in-memory registry to pull
from and the engine's images with their sizes, so tests drive pulls,
failures, builds and evictions without an engine. Failures to inject: a
registry that cannot be reached (``unreachable``), one that wants
credentials (``credentials``), pulls held until a test lets them go
(``hold``/``release``), and a build step that fails (a Dockerfile line
``RUN false``)."""

from __future__ import annotations

import asyncio
import builtins
import hashlib
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sandboxd.backends.base import BuildSpec, EngineImage, ImageDisk, PullStatus, RegistryAuth, RemoteImage
from sandboxd.errors import BuildFailed, FailedPrecondition, Unavailable

if TYPE_CHECKING:
    from sandboxd.backends.fake import FakeSandbox


def _spellings(reference: str) -> tuple[str, ...]:
    if "@" in reference:
        return (reference,)
    if reference.endswith(":latest"):
        return (reference, reference.removesuffix(":latest"))
    if ":" not in reference.rsplit("/", 1)[-1]:
        return (reference, f"{reference}:latest")
    return (reference,)


@dataclass(frozen=True)
class RegistryImage:
    """An image a fake registry serves: its size, and the part of it a base shares."""

    size: int
    shared: int = 0


@dataclass
class FakeRegistry:
    """Images by reference (``repo:tag`` or ``repo@sha256:...``) and the failures to inject."""

    images: dict[str, RegistryImage] = field(default_factory=dict)
    unreachable: bool = False
    credentials: RegistryAuth | None = None
    """When set, a pull must send this username and password."""
    pulls: Counter[str] = field(default_factory=Counter)
    """Pulls each reference was asked for (that reached the registry)."""
    _open: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self._open.set()

    def add(self, reference: str, size: int, shared: int = 0) -> None:
        """Serves ``reference``."""
        self.images[reference] = RegistryImage(size, shared)

    def hold(self) -> None:
        """From now on pulls stop after their first progress report, until ``release``."""
        self._open = asyncio.Event()

    def release(self) -> None:
        """Held pulls go on."""
        self._open.set()


class FakeImages:
    """The ImageStore half of FakeBackend (mixed into it)."""

    images: set[str] | None
    sandboxes: dict[str, FakeSandbox]

    def _init_images(self) -> None:
        self.registry = FakeRegistry()
        self.engine_images: dict[str, EngineImage] = {}
        """Images pulled or built on the fake engine, by reference."""
        self.disk_total_bytes = 100 << 30
        self.builds: Counter[str] = Counter()

    def _put(self, reference: str, size: int, shared: int, labels: dict[str, str] | None = None) -> None:
        image_id = "sha256:" + hashlib.sha256(reference.encode()).hexdigest()
        self.engine_images[reference] = EngineImage(image_id, (reference,), size, shared, labels or {})
        if self.images is not None:
            self.images.add(reference)

    def _serve(self, reference: str, auth: RegistryAuth | None) -> RegistryImage:
        registry = self.registry
        if registry.unreachable:
            raise Unavailable(f"registry for {reference!r} cannot be reached (connection refused)")
        wanted = registry.credentials
        if wanted is not None and (
            auth is None or (auth.username, auth.password) != (wanted.username, wanted.password)
        ):
            raise FailedPrecondition(f"pull of {reference!r} denied: authentication required")
        found = registry.images.get(reference)
        if found is None:
            raise FailedPrecondition(f"registry has no image {reference!r} (manifest unknown)")
        return found

    async def registry_image(self, reference: str, auth: RegistryAuth | None) -> RemoteImage:
        """What ``registry`` serves; the compressed size is the image's size,
        its layers the shared part (one blob for every image sharing that
        many bytes, as a common base) and its own."""
        found = self._serve(reference, auth)
        digest = "sha256:" + hashlib.sha256(reference.encode()).hexdigest()
        layers = [(f"sha256:shared-{found.shared}", found.shared)] if found.shared else []
        layers.append((f"{digest}-own", found.size - found.shared))
        return RemoteImage(reference, digest, found.size, tuple(layers))

    async def pull_image(self, reference: str, auth: RegistryAuth | None) -> AsyncIterator[PullStatus]:
        """Pulls from ``registry``: Unavailable while unreachable,
        FailedPrecondition for an unknown reference or wrong credentials."""
        registry = self.registry
        found = self._serve(reference, auth)
        registry.pulls[reference] += 1
        yield PullStatus(0, found.size, "Downloading")
        await registry._open.wait()
        self._put(reference, found.size, found.shared)
        yield PullStatus(found.size, found.size, "Pull complete")

    async def inspect_image(self, reference: str) -> EngineImage | None:
        """The engine's image; with ``images`` None (every image exists) one
        of size 0. A name without a tag is its ``:latest``, as on an engine."""
        for name in _spellings(reference):
            found = self.engine_images.get(name)
            if found is not None:
                return found
            if self.images is None or name in self.images:
                return EngineImage("sha256:" + hashlib.sha256(name.encode()).hexdigest(), (reference,))
        return None

    async def list_images(self) -> builtins.list[EngineImage]:
        """The images pulled or built (those ``images`` names alone are listed with size 0)."""
        listed = dict(self.engine_images)
        for reference in self.images or ():
            if reference not in listed:
                found = await self.inspect_image(reference)
                assert found is not None
                listed[reference] = found
        return list(listed.values())

    async def remove_image(self, reference: str) -> None:
        """Removes ``reference``; FailedPrecondition while a running sandbox uses it."""
        if any(box.running and box.spec.image == reference for box in self.sandboxes.values()):
            raise FailedPrecondition(f"image {reference!r} is used by a running container")
        self.engine_images.pop(reference, None)
        if self.images is not None:
            self.images.discard(reference)

    async def image_disk(self) -> ImageDisk:
        """``disk_total_bytes``, less what the images take."""
        used = sum(i.size_bytes for i in self.engine_images.values())
        return ImageDisk(self.disk_total_bytes, max(0, self.disk_total_bytes - used), "/fake")

    async def build_image(self, spec: BuildSpec) -> AsyncIterator[str]:
        """Runs the Dockerfile's lines as steps (each logs itself; ``RUN false``
        fails); the image's size is its context's. BuildFailed names the step."""
        text = await asyncio.to_thread((spec.context / spec.dockerfile).read_text)
        steps = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]
        log: builtins.list[str] = []
        for number, step in enumerate(steps, 1):
            line = f"#{number} [{number}/{len(steps)}] {step}"
            log.append(line)
            yield line
            if step == "RUN false":
                raise BuildFailed(
                    f"build of {spec.tag!r} failed at step {number} ({step}): exit code 1",
                    step=step,
                    log_tail="\n".join(log[-20:]),
                )
        size = await asyncio.to_thread(
            lambda: sum(p.stat().st_size for p in spec.context.rglob("*") if p.is_file())
        )
        self.builds[spec.tag] += 1
        self._put(spec.tag, size, 0, dict(spec.labels))
        yield f"naming to {spec.tag} done"
