"""Images on a backend's engine: the optional ``ImageStore`` port (pull, build,
list, remove, disk use) with its data types, and ``ImagePrefetch`` for
backends whose nodes pull images themselves.

Re-exported by sandboxd.backends.base, where the port is described."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

LABEL_IMAGE_BUILD = "sandboxd.build"
"""Label on an image sandboxd built: the hash of its Dockerfile, context and
build arguments (the image cache may remove such an image; never another)."""


@dataclass(frozen=True)
class RegistryAuth:
    """Credentials for one registry, as a Docker config's ``auths`` entry gives them."""

    server: str
    username: str = ""
    password: str = ""
    identity_token: str = ""


@dataclass(frozen=True)
class EngineImage:
    """An image on the engine: its id, every reference naming it, and its size."""

    image_id: str
    references: tuple[str, ...] = ()
    """Tags (``repo:tag``) and repository digests (``repo@sha256:...``)."""
    size_bytes: int = 0
    """Bytes on disk, shared layers counted in full (what removing it frees at most)."""
    shared_bytes: int = 0
    """Bytes of its layers that other images on the engine also use (removing it never frees those)."""
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PullStatus:
    """How far a pull has come: bytes of its layers fetched of those known so far."""

    bytes_done: int = 0
    bytes_total: int = 0
    """0 = not known yet (the manifest is still being read)."""
    detail: str = ""
    """The engine's latest word on the pull, e.g. "Downloading" or "Pull complete"."""


@dataclass(frozen=True)
class RemoteImage:
    """An image as its registry serves it, known without pulling it."""

    reference: str
    digest: str
    """The manifest's digest (of the linux/amd64 one under an index)."""
    compressed_bytes: int
    """Its layers and config as fetched; unpacked on disk it takes more."""
    layers: tuple[tuple[str, int], ...] = ()
    """(digest, compressed bytes) of each layer blob, in the manifest's order:
    what a pull fetches is those not already on the engine."""


@dataclass(frozen=True)
class ImageDisk:
    """The filesystem holding the engine's images: its size, what is free, where."""

    total_bytes: int
    free_bytes: int
    path: str = ""


@dataclass(frozen=True)
class BuildSpec:
    """An image to build: a context directory with its Dockerfile, the tag to give it."""

    context: Path
    tag: str
    dockerfile: str = "Dockerfile"
    """Path of the Dockerfile inside ``context``."""
    build_args: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    registry_auths: Mapping[str, RegistryAuth] = field(default_factory=dict)
    """Credentials by registry (a Docker config's ``auths`` keys) for the
    bases the Dockerfile pulls; the engine picks each base's registry's."""


@runtime_checkable
class ImageStore(Protocol):
    """Optional for a backend: it pulls, builds, lists and removes images on
    its engine and says how much disk they have (the image cache,
    sandboxd.core.images, manages them through it). Every method raises
    sandboxd errors only."""

    def pull_image(self, reference: str, auth: RegistryAuth | None) -> AsyncIterator[PullStatus]:
        """Pulls ``reference`` (``repo:tag`` or ``repo@sha256:...``), yielding
        progress as the engine reports it; returns once the image is on the
        engine. Raises FailedPrecondition when the registry has no such image
        or refuses the credentials, Unavailable when the registry cannot be
        reached, TransientBackendError when the engine fails."""
        ...

    async def inspect_image(self, reference: str) -> EngineImage | None:
        """The image ``reference`` names on the engine, or None when absent."""
        ...

    async def registry_image(self, reference: str, auth: RegistryAuth | None) -> RemoteImage:
        """What the registry serving ``reference`` says of it, without a
        pull. Raises FailedPrecondition (no such image, credentials refused)
        or Unavailable (registry unreachable), as ``pull_image`` does."""
        ...

    async def list_images(self) -> list[EngineImage]:
        """Every image on the engine with its references and size."""
        ...

    async def remove_image(self, reference: str) -> None:
        """Removes the reference ``reference``; the image itself goes with its
        last reference, and never while a container uses it (FailedPrecondition).
        An absent reference is no error."""
        ...

    async def image_disk(self) -> ImageDisk:
        """The filesystem holding the engine's image data."""
        ...

    def build_image(self, spec: BuildSpec) -> AsyncIterator[str]:
        """Builds ``spec`` through the engine, yielding the build's log lines
        as they come (the first says which builder runs it); returns once
        the image is tagged. Raises BuildFailed naming the
        failing step, TransientBackendError when the engine fails."""
        ...


@runtime_checkable
class PoolPullSecrets(Protocol):
    """Optional for a backend: it pulls a pool's images with Secrets the pool
    names (SandboxSpec.pull_secrets; ImagePrefetch's ``pull_secrets``)."""

    def pulls_with_pool_secrets(self) -> bool:
        """True (the protocol is the claim)."""
        ...


@runtime_checkable
class ImagePrefetch(Protocol):
    """Optional for a backend whose nodes pull images themselves (Kubernetes:
    the kubelets): it pulls an image onto nodes ahead of the sandboxes that
    will need it, so their Pods start without a pull."""

    async def prefetch_image(self, image: str, copies: int, pull_secrets: tuple[str, ...] = ()) -> int:
        """Starts pulls of ``image`` onto up to ``copies`` nodes that do not
        hold it yet, with ``pull_secrets`` besides the backend's own; returns
        how many it started (0: every node has it, or one is pulling it
        there). Raises BackendError when it cannot."""
        ...
