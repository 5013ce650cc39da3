"""Images on a Docker engine (the ImageStore port): pulls through the
engine's /images/create with progress, builds, the image list with sizes,
removal and the disk under the engine's data root (builds on BuildKit:
sandboxd.backends.docker.builds). The SDK's low-level
client streams on worker threads of their own, so a long pull never holds a
thread the sandboxes' calls need; its events reach the event loop through
a queue."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import docker.errors
import requests

from sandboxd.backends.base import BuildSpec, EngineImage, ImageDisk, PullStatus, RegistryAuth, RemoteImage
from sandboxd.backends.docker.builds import CLASSIC, Builder, EngineBuild, NoBuildKit, builder_of, context_tar
from sandboxd.backends.registry_api import remote_image
from sandboxd.errors import FailedPrecondition, TransientBackendError, Unavailable

# What the engine says when the registry answered but has no such image or
# refuses us: asking again cannot help.
_REFUSED = (
    "manifest unknown",
    "not found",
    "does not exist",
    "pull access denied",
    "unauthorized",
    "authentication required",
    "no basic auth credentials",
    "denied",
    "invalid reference format",
    "server gave http response to https client",
)
# What it says when the registry could not be reached at all.
_UNREACHABLE = (
    "connection refused",
    "no such host",
    "i/o timeout",
    "dial tcp",
    "tls handshake timeout",
    "connection reset",
    "network is unreachable",
    "no route to host",
    "eof",
    "timeout exceeded",
)
_T = TypeVar("_T")
# Threads streaming pulls and builds; more wait in the cache's queue anyway.
_STREAM_THREADS = 8
_END = object()
# The engine's disk-usage view is busy (another caller's): tries and the first pause between them.
_DF_TRIES = 5
_DF_FIRST_PAUSE = 0.2


def classify(reference: str, message: str) -> Exception:
    """The sandboxd error for an engine's refusal of a pull of ``reference``."""
    low = message.lower()
    if any(word in low for word in _REFUSED):
        return FailedPrecondition(f"cannot pull image {reference!r}: {message}")
    if any(word in low for word in _UNREACHABLE):
        return Unavailable(f"registry for image {reference!r} cannot be reached: {message}")
    return TransientBackendError(f"pull of image {reference!r} failed: {message}")


def _auth_config(auth: RegistryAuth | None) -> dict[str, str] | None:
    if auth is None:
        return None
    config = {"serveraddress": auth.server, "username": auth.username, "password": auth.password}
    if auth.identity_token:
        config["identitytoken"] = auth.identity_token
    return config


class _Layers:
    """Bytes fetched per layer, from the engine's pull events."""

    def __init__(self) -> None:
        self.done: dict[str, int] = {}
        self.total: dict[str, int] = {}

    def update(self, event: dict[str, Any]) -> PullStatus:
        layer = str(event.get("id", ""))
        status = str(event.get("status", ""))
        detail = event.get("progressDetail") or {}
        if layer and status == "Downloading" and detail.get("total"):
            self.total[layer] = int(detail["total"])
            self.done[layer] = int(detail.get("current", 0))
        elif layer and status in ("Download complete", "Pull complete", "Already exists"):
            self.done[layer] = self.total.get(layer, self.done.get(layer, 0))
        return PullStatus(sum(self.done.values()), sum(self.total.values()), status)


def _image_of(entry: dict[str, Any]) -> EngineImage:
    refs = [r for r in (entry.get("RepoTags") or []) + (entry.get("RepoDigests") or []) if "<none>" not in r]
    shared = int(entry.get("SharedSize") or 0)
    return EngineImage(
        image_id=str(entry["Id"]),
        references=tuple(refs),
        size_bytes=int(entry.get("Size") or 0),
        shared_bytes=max(0, shared),
        labels=dict(entry.get("Labels") or {}),
    )


class DockerImages:
    """The ImageStore half of DockerBackend (mixed into it); ``_images_api``
    is the SDK's low-level client, ``_data_root`` the engine's."""

    _images_api: Any

    def _init_images(self, api: Any, local: bool = True) -> None:
        """``local``: the engine runs on this host, so its data root's filesystem is seen here."""
        self._images_api = api
        self._engine_local = local
        self._streams = ThreadPoolExecutor(max_workers=_STREAM_THREADS, thread_name_prefix="sandboxd-pull")
        self._data_root = ""
        self._listing: asyncio.Future[list[EngineImage]] | None = None
        self._build_with: Builder | None = None

    async def _stream(self, produce: Callable[[], Iterator[_T]]) -> AsyncIterator[_T]:
        """The events ``produce`` yields on a stream thread, handed over as
        they come; an exception it raises is raised here. Leaving early
        stops the thread at its next event."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        stop = threading.Event()

        def pump() -> None:
            try:
                for event in produce():
                    loop.call_soon_threadsafe(queue.put_nowait, event)
                    if stop.is_set():
                        return
                loop.call_soon_threadsafe(queue.put_nowait, _END)
            except BaseException as e:
                loop.call_soon_threadsafe(queue.put_nowait, e)

        done = loop.run_in_executor(self._streams, pump)
        try:
            while True:
                item = await queue.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()
            if done.done():
                await done

    async def pull_image(self, reference: str, auth: RegistryAuth | None) -> AsyncIterator[PullStatus]:
        """Pulls through /images/create; FailedPrecondition (no such image,
        denied), Unavailable (registry unreachable), else TransientBackendError."""
        layers = _Layers()

        def produce() -> Iterator[dict[str, Any]]:
            return self._images_api.pull(  # type: ignore[no-any-return]
                reference, stream=True, decode=True, auth_config=_auth_config(auth)
            )

        try:
            async for event in self._stream(produce):
                if event.get("error"):
                    detail = (event.get("errorDetail") or {}).get("message") or event["error"]
                    raise classify(reference, str(detail))
                yield layers.update(event)
        except docker.errors.APIError as e:
            raise classify(reference, str(e.explanation or e)) from e
        except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
            raise TransientBackendError(f"pull of image {reference!r}: engine failed: {e}") from e

    async def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._streams, lambda: fn(*args, **kwargs))

    async def inspect_image(self, reference: str) -> EngineImage | None:
        """The image ``reference`` names, or None."""
        try:
            found = await self._call(self._images_api.inspect_image, reference)
        except docker.errors.ImageNotFound:
            return None
        except docker.errors.APIError as e:
            if e.status_code in (400, 404):
                return None
            raise TransientBackendError(f"cannot inspect image {reference!r}: {e}") from e
        except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
            raise TransientBackendError(f"cannot inspect image {reference!r}: {e}") from e
        return EngineImage(
            image_id=str(found["Id"]),
            references=tuple((found.get("RepoTags") or []) + (found.get("RepoDigests") or [])),
            size_bytes=int(found.get("Size") or 0),
            labels=dict((found.get("Config") or {}).get("Labels") or {}),
        )

    async def registry_image(self, reference: str, auth: RegistryAuth | None) -> RemoteImage:
        """The registry's manifest facts, over its API from this host (with
        the engine's rule: plain HTTP to loopback registries)."""
        found: RemoteImage = await self._call(remote_image, reference, auth)
        return found

    async def list_images(self) -> list[EngineImage]:
        """Every image with its size and the part of it other images share
        (the engine's disk-usage view, which computes the shared part). The
        engine runs one disk-usage computation at a time, whoever asks: the
        callers here share one listing in flight, and while another's runs
        (a second server, ``docker system df``) it waits a little and asks
        again, and past that lists images without their shared part (each
        then counts in full: more than the truth, never less)."""
        if self._listing is None or self._listing.done():
            self._listing = asyncio.ensure_future(self._list_images())
            # Its error reaches whoever awaits it; none left is no leak to report.
            self._listing.add_done_callback(lambda f: f.cancelled() or f.exception())
        # Shielded: one caller giving up leaves the listing to the others.
        return await asyncio.shield(self._listing)

    async def _list_images(self) -> list[EngineImage]:
        pause = _DF_FIRST_PAUSE
        for _ in range(_DF_TRIES):
            try:
                usage = await self._call(self._images_api.df)
                return [_image_of(entry) for entry in usage.get("Images") or []]
            except docker.errors.APIError as e:
                if "already running" not in str(e.explanation or e):
                    raise TransientBackendError(f"cannot list images: {e}") from e
            except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
                raise TransientBackendError(f"cannot list images: {e}") from e
            await asyncio.sleep(pause)
            pause *= 2
        try:
            listed = await self._call(self._images_api.images)
        except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
            raise TransientBackendError(f"cannot list images: {e}") from e
        return [_image_of(entry) for entry in listed or []]

    async def remove_image(self, reference: str) -> None:
        """Removes the reference (the image goes with its last); FailedPrecondition
        while a container uses it."""
        try:
            await self._call(self._images_api.remove_image, reference, noprune=False)
        except docker.errors.ImageNotFound:
            return
        except docker.errors.APIError as e:
            if e.status_code == 404:
                return
            if e.status_code == 409:
                raise FailedPrecondition(f"image {reference!r} is in use: {e.explanation}") from e
            raise TransientBackendError(f"cannot remove image {reference!r}: {e}") from e
        except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
            raise TransientBackendError(f"cannot remove image {reference!r}: {e}") from e

    async def image_disk(self) -> ImageDisk:
        """The filesystem of the engine's data root (DockerRootDir), as seen
        from here; TransientBackendError when this host cannot see it (a
        remote engine)."""
        if not self._engine_local:
            raise TransientBackendError(
                "the Docker engine is on another host: its image disk cannot be seen from here"
            )
        try:
            if not self._data_root:
                info = await self._call(self._images_api.info)
                self._data_root = str(info.get("DockerRootDir") or "/var/lib/docker")
            st = await asyncio.to_thread(os.statvfs, self._data_root)
        except (docker.errors.DockerException, requests.exceptions.RequestException, OSError) as e:
            raise TransientBackendError(f"cannot tell the engine's image disk: {e}") from e
        return ImageDisk(st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize, self._data_root)

    async def _builder(self) -> Builder:
        """The builder this engine runs builds on, asked once (its /_ping
        headers and whether it has the default bridge network)."""
        if self._build_with is None:
            api = self._images_api
            try:
                ping = await self._call(api.get, f"{api.base_url}/_ping", timeout=30)
                bridges = await self._call(api.networks, names=["bridge"])
            except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
                raise TransientBackendError(f"cannot ask the engine which builder it has: {e}") from e
            has_bridge = any(n.get("Name") == "bridge" for n in bridges or [])
            self._build_with = builder_of(ping.headers, has_bridge)
        return self._build_with

    async def build_image(self, spec: BuildSpec) -> AsyncIterator[str]:
        """Builds through /build with the context sent as a tar, on BuildKit
        unless the engine has none (the first line says which builder ran),
        yielding the build's log lines; BuildFailed names the step that
        failed. Leaving early (a cancelled build) asks the engine to stop it."""
        context = await asyncio.to_thread(context_tar, spec)
        builder = await self._builder()
        yield builder.describe()
        build = EngineBuild(self._images_api, spec, builder, context)
        try:
            async for line in self._stream(build.lines):
                yield line
        except NoBuildKit as e:
            # Said it had BuildKit, then turned a BuildKit build down: the
            # classic builder for this engine from now on.
            self._build_with = Builder(CLASSIC, f"the engine turned BuildKit down: {e}")
            yield self._build_with.describe()
            context.seek(0)
            classic = EngineBuild(self._images_api, spec, self._build_with, context)
            async for line in self._stream(classic.lines):
                yield line
        except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
            raise TransientBackendError(f"build of {spec.tag!r}: engine failed: {e}") from e
        except (asyncio.CancelledError, GeneratorExit):
            await asyncio.to_thread(build.cancel)
            raise

    def _close_images(self) -> None:
        self._streams.shutdown(wait=False, cancel_futures=True)
