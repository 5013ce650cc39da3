"""The image cache: images on the engine by reference, pulled when absent
(one pull per image however many callers wait, a bounded number at once),
kept within a disk budget by removing the least recently used of those
sandboxd pulled or built, never one in use or wanted by announced demand."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
from collections import Counter
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any

from opentelemetry.metrics import Meter

from sandboxd.backends.base import (
    LABEL_IMAGE_BUILD,
    BuildSpec,
    ImagePrefetch,
    ImageStore,
)
from sandboxd.backends.image_refs import normalize
from sandboxd.clock import Clock
from sandboxd.core.images.budget import BudgetKeeping, Demand, image_id_of
from sandboxd.core.images.builds import DEFAULT_REPOSITORY, Builds, bases_of, build_labels
from sandboxd.core.images.credentials import Credentials, config_dir
from sandboxd.core.images.eviction import Footprint
from sandboxd.core.images.ledger import BUILT, PULLED, Entry, ImageLedger
from sandboxd.core.images.meters import ImageMeters
from sandboxd.core.images.prefetch import NodePrefetch
from sandboxd.core.images.progress import DONE, FAILED, PULLING, Flight, PullProgress
from sandboxd.core.images.room import Room
from sandboxd.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    SandboxdError,
    TransientBackendError,
    Unavailable,
)
from sandboxd.settings import ImageSettings

log = logging.getLogger(__name__)

RECENT = 32
"""Ended pulls kept for ``progress`` (the latest ones)."""
ENSURE_GRACE_SECONDS = 120.0
"""An image just ensured is not evicted for this long: its sandbox is being
created and ``use`` comes once it exists."""


class ImageCache(BudgetKeeping):
    """Images on the engine for sandboxes: ``ensure`` before a create, ``use``
    and ``unuse`` around a sandbox's life, ``want`` for what is coming."""

    def __init__(
        self,
        backend: object,
        clock: Clock,
        settings: ImageSettings | None = None,
        *,
        ledger_path: Path | None = None,
        meter: Meter | None = None,
        environ: Mapping[str, str] | None = None,
        evicts: bool = True,
    ) -> None:
        """``backend`` manages images when it is an ImageStore; otherwise
        ``ensure`` only checks that an image is there (``image_exists``).
        ``ledger_path`` None keeps the record of sandboxd's images in memory.
        ``evicts`` False: never removes anything by itself (a command-line
        build beside a server, which alone knows what is in use and wanted)."""
        self._evicts = evicts
        self.settings = settings or ImageSettings()
        self._backend = backend
        self._store = backend if isinstance(backend, ImageStore) else None
        self._clock = clock
        self._ledger = ImageLedger(ledger_path)
        self._entries: dict[str, Entry] = {}
        self._present: set[str] = set()
        self._flights: dict[str, Flight] = {}
        self._recent: list[PullProgress] = []
        self._in_use: Counter[str] = Counter()
        self._ensured: dict[str, float] = {}
        self._demand = Demand()
        self._slots = asyncio.Semaphore(max(1, self.settings.max_concurrent_pulls))
        self._credentials = Credentials(config_dir(self.settings.docker_config, environ or os.environ))
        self._budget = self.settings.cache_bytes
        self._used = 0
        self._listed = False
        self._footprints: dict[str, Footprint] = {}
        """``_used`` comes from a listing of the engine (none yet at start)."""
        self._room = Room(self.settings.unpack_ratio)
        self._evicting: asyncio.Lock = asyncio.Lock()
        self._check_queued = False
        self._background: set[asyncio.Future[None]] = set()
        self._ticker: asyncio.Task[None] | None = None
        self._nodes = (
            NodePrefetch(backend, clock, self._spawn) if isinstance(backend, ImagePrefetch) else None
        )
        self._builds = Builds(self._store, self._slots, clock.monotonic, self._prepare_build)
        self.meters = ImageMeters(meter, self.gauges)

    # -- start and stop ---------------------------------------------------------

    async def start(self) -> None:
        """Reads the ledger, forgets entries whose image is gone or re-pointed
        by someone else, sizes the budget, and starts the periodic budget check."""
        entries = await self._ledger.open()
        if self._store is not None:
            if not self._budget:
                try:
                    disk = await self._store.image_disk()
                    self._budget = int(disk.total_bytes * self.settings.cache_share)
                except TransientBackendError as e:
                    # Without a budget nothing is evicted; pulls still work.
                    log.warning("image cache has no budget (set images.cache_bytes): %s", e)
            on_engine = await self._images_by_reference()
            gone = [e for e in entries if image_id_of(on_engine.get(e.reference)) != e.image_id]
            for entry in gone:
                await self._ledger.delete(entry.reference)
            entries = [e for e in entries if e not in gone]
            self._present.update(on_engine)
        self._entries = {e.reference: e for e in entries}
        if self._store is not None and self._evicts and self.settings.evict_interval_seconds > 0:
            self._ticker = asyncio.create_task(self._tick(), name="image-cache-budget")

    async def stop(self) -> None:
        """Stops the budget check and prefetches, saves last-use times, closes the ledger."""
        tasks = [t for t in (self._ticker, *self._background) if t is not None]
        for task in tasks:
            task.cancel()
        for flight in self._flights.values():
            if flight.task is not None:
                flight.task.cancel()
                tasks.append(flight.task)
        tasks += self._builds.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._ledger.save(list(self._entries.values()))
        await self._ledger.close()

    # -- the interface the pools use ------------------------------------------

    async def ensure(self, image: str, deadline: float | None = None) -> None:
        """The image is on the engine when this returns: pulled if absent (one
        pull per image however many callers wait; bounded pulls per host),
        built images and already-present ones answer at once. Raises
        sandboxd.errors: FailedPrecondition (registry has no such image, or
        access denied), Unavailable with retry info (registry unreachable),
        DeadlineExceeded naming the pull and its progress (``deadline`` is a
        clock time, the injected clock's monotonic)."""
        image = normalize(image)
        self._ensured[image] = self._clock.monotonic() + ENSURE_GRACE_SECONDS
        if image in self._present:
            self._touch(image)
            return
        flight = self._flights.get(image)
        if flight is None:
            flight = self._start_pull(image)
        assert flight.task is not None
        remaining = None if deadline is None else deadline - self._clock.monotonic()
        flight.waiters += 1
        try:
            if remaining is not None and remaining <= 0:
                raise TimeoutError
            async with self._clock.timeout(remaining):
                # Shielded: a caller that gives up leaves the pull running
                # for the others (and for its own retry).
                await asyncio.shield(flight.task)
        except TimeoutError:
            raise DeadlineExceeded(
                f"pull of image {image!r} did not finish by the deadline: {flight.view().describe()}"
            ) from None
        finally:
            flight.waiters -= 1
        self._touch(image)

    async def size_of(self, image: str) -> tuple[int, bool]:
        """(bytes, on the engine): the image's size on the engine when it is
        there, else what its registry serves (compressed: unpacked it takes
        more), without pulling. Raises FailedPrecondition (no such image,
        access denied, or a backend that does not pull and lacks it) and
        Unavailable with retry info (registry unreachable)."""
        image = normalize(image)
        if self._store is None:
            if await self._backend.image_exists(image):  # type: ignore[attr-defined]
                return 0, True
            raise FailedPrecondition(f"image {image!r} is not on the engine (this backend does not pull)")
        found = await self._store.inspect_image(image)
        if found is not None:
            return found.size_bytes, True
        auth = await asyncio.to_thread(self._credentials.for_reference, image)
        try:
            remote = await self._store.registry_image(image, auth)
        except Unavailable as e:
            raise Unavailable(
                e.message, retry_after=e.retry_after or self.settings.unavailable_retry_seconds
            ) from e
        return remote.compressed_bytes, False

    def present(self, image: str) -> bool:
        """Whether ``image`` is known to be on the engine now (no I/O)."""
        return normalize(image) in self._present

    def use(self, image: str) -> None:
        """A sandbox of ``image`` now exists: the image is not evicted while one does."""
        image = normalize(image)
        self._in_use[image] += 1
        self._ensured.pop(image, None)
        self._touch(image)

    def unuse(self, image: str) -> None:
        """One sandbox of ``image`` is gone."""
        image = normalize(image)
        self._in_use[image] -= 1
        if self._in_use[image] <= 0:
            del self._in_use[image]
        self._touch(image)

    def want(self, source: str, images: Mapping[str, int], pull_secrets: tuple[str, ...] = ()) -> None:
        """Announced demand of ``source`` (replacing its previous set): image ->
        sandboxes coming. Wanted images are never evicted, and absent ones are
        pulled ahead (a failed prefetch is logged and shows in ``progress``);
        where nodes pull (Kubernetes), with ``pull_secrets`` besides the
        backend's own."""
        wanted = {normalize(image): n for image, n in images.items() if n > 0}
        if wanted:
            self._demand.by_source[source] = wanted
        else:
            self._demand.by_source.pop(source, None)
        if self._store is None:
            if self._nodes is not None:
                self._nodes.want(wanted, pull_secrets)
            return
        for image in wanted:
            if image not in self._present and image not in self._flights:
                self._start_pull(image)

    def wanted(self) -> set[str]:
        """Every image some source announced demand for."""
        return self._demand.images()

    def progress(self) -> list[PullProgress]:
        """Pulls and builds in flight (first), then the latest ended pulls, newest first."""
        building = [
            PullProgress(tag, PULLING, 0, 0, started, f"building: {line}")
            for tag, started, line in self._builds.in_flight()
        ]
        return [f.view() for f in self._flights.values()] + building + list(reversed(self._recent))

    async def build(
        self,
        context: Path,
        *,
        dockerfile: str = "Dockerfile",
        build_args: Mapping[str, str] | None = None,
        repository: str = DEFAULT_REPOSITORY,
        on_log: Callable[[str], None] | None = None,
    ) -> str:
        """The tag of the image built from ``context`` (a directory holding
        ``dockerfile``) with ``build_args``: ``repository:<hash>``, the hash
        of the Dockerfile, every file of the context and the arguments (and
        ``images.dockerfile_frontend``, sent as BUILDKIT_SYNTAX when the
        Dockerfile names no frontend of its own). An image of that tag
        already on the engine answers at once (no build); else it is built
        through the engine once however many ask, its log lines streamed to
        ``on_log``, and recorded as sandboxd's own (the
        cache may evict it when unused; building again gives the same tag).
        Bases come from the engine or a registry it reaches, so it works
        offline. Raises InvalidArgument (no such context or Dockerfile),
        BuildFailed naming the failing step (with the log's tail),
        FailedPrecondition when the backend cannot build."""
        tag, digest, args = await self._builds.recipe(
            context, dockerfile, build_args or {}, repository, self.settings.dockerfile_frontend
        )
        if self._store is None:
            raise FailedPrecondition("this backend does not build images")
        found = await self._store.inspect_image(tag)
        if found is not None and found.labels.get(LABEL_IMAGE_BUILD) == digest:
            self.meters.builds.add(1, {"result": "cached"})
            self._present.add(tag)
            self._touch(tag)
            return tag
        spec = BuildSpec(context, tag, dockerfile, args, build_labels(digest))
        try:
            await self._builds.build(spec, on_log)
        except SandboxdError:
            self.meters.builds.add(1, {"result": "failed"})
            raise
        built = await self._store.inspect_image(tag)
        if built is None:
            raise TransientBackendError(f"image {tag!r} built but the engine does not list it")
        self.meters.builds.add(1, {"result": "built"})
        entry = Entry(tag, built.image_id, BUILT, built.size_bytes, self._clock.time())
        self._entries[tag] = entry
        self._present.add(tag)
        self._ensured[tag] = self._clock.monotonic() + ENSURE_GRACE_SECONDS
        await self._ledger.save([entry])
        if self._evicts:
            self._check_budget_soon()
        return tag

    async def _prepare_build(self, spec: BuildSpec, log: Callable[[str], None]) -> BuildSpec:
        """Once per build, before it runs: pulls the bases the Docker config
        has credentials for and the engine lacks, through the engine's pull
        API with those credentials (the engine's BuildKit asks a client
        session for registry credentials and ignores the build request's,
        and it takes a base already on the engine from there); the spec
        then carries every registry's credentials (for a classic builder)."""
        assert self._store is not None
        path = spec.context / spec.dockerfile
        text = await asyncio.to_thread(path.read_text, errors="replace")
        for base in bases_of(text, spec.build_args):
            if await asyncio.to_thread(self._credentials.for_reference, base) is None:
                continue
            if await self._store.inspect_image(base) is not None:
                continue
            log(f"pulling base {base} with the Docker config's credentials")
            await self.ensure(base)
        auths = await asyncio.to_thread(self._credentials.every)
        return dataclasses.replace(spec, registry_auths=auths)

    def gauges(self) -> dict[str, float]:
        """Figures for metrics and status: cache and budget bytes, pulls in flight."""
        return {
            "cache_bytes": float(self._used),
            "cache_budget_bytes": float(self._budget),
            "pulls_in_flight": float(len(self._flights)),
            "cache_reserved_bytes": float(self._room.reserved()),
        }

    @property
    def budget(self) -> int:
        """Bytes the cache may take (0 until ``start`` when sized from the engine's disk)."""
        return self._budget

    def entries(self) -> list[Entry]:
        """The images sandboxd put on the engine, as the ledger holds them."""
        return list(self._entries.values())

    # -- pulls ------------------------------------------------------------------

    def _start_pull(self, image: str) -> Flight:
        flight = Flight(image, self._clock.monotonic())
        self._flights[image] = flight
        flight.task = asyncio.create_task(self._pull(flight), name=f"pull {image}")
        flight.task.add_done_callback(lambda t: self._ended(flight, t))
        return flight

    def _ended(self, flight: Flight, task: asyncio.Task[None]) -> None:
        self._flights.pop(flight.image, None)
        error = None if task.cancelled() else task.exception()
        if error is not None:
            flight.state, flight.detail = FAILED, str(error)
            if flight.waiters == 0:
                log.warning("pull of image %s failed: %s", flight.image, error)
        self._recent = ([*self._recent, flight.view()])[-RECENT:]

    async def _pull(self, flight: Flight) -> None:
        image = flight.image
        if self._store is None:
            exists = await self._backend.image_exists(image)  # type: ignore[attr-defined]
            if not exists:
                raise FailedPrecondition(f"image {image!r} is not on the engine (this backend does not pull)")
            flight.state = DONE
            self._present.add(image)
            return
        if await self._store.inspect_image(image) is not None:
            self.meters.pulls.add(1, {"result": "present"})
            flight.state = DONE
            self._present.add(image)
            return
        async with self._slots:
            flight.state = PULLING
            begun = self._clock.monotonic()
            auth = await asyncio.to_thread(self._credentials.for_reference, image)
            await self._make_room(image, auth)
            try:
                async for status in self._store.pull_image(image, auth):
                    flight.bytes_done, flight.bytes_total = status.bytes_done, status.bytes_total
                    flight.detail = status.detail
            except Unavailable as e:
                self.meters.pulls.add(1, {"result": "unavailable"})
                retry = e.retry_after or self.settings.unavailable_retry_seconds
                raise Unavailable(e.message, retry_after=retry) from e
            except FailedPrecondition:
                self.meters.pulls.add(1, {"result": "not_found"})
                raise
            except SandboxdError:
                self.meters.pulls.add(1, {"result": "failed"})
                raise
            finally:
                # Landed, the engine's listing counts the image from now on;
                # until the next listing its room counts as used.
                landed = self._room.release(image)
            self._used += landed
            found = await self._store.inspect_image(image)
            if found is None:
                self.meters.pulls.add(1, {"result": "failed"})
                raise TransientBackendError(f"image {image!r} pulled but the engine does not list it")
            self.meters.pulls.add(1, {"result": "done"})
            self.meters.pull_seconds.record(self._clock.monotonic() - begun)
        flight.state, flight.detail = DONE, ""
        entry = Entry(image, found.image_id, PULLED, found.size_bytes, self._clock.time())
        self._entries[image] = entry
        await self._ledger.save([entry])
        self._present.add(image)
        if self._evicts:
            self._check_budget_soon()

    def _touch(self, image: str) -> None:
        entry = self._entries.get(image)
        if entry is not None:
            entry.last_used = self._clock.time()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Future[None]:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(_log_failure)
        return task


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        with contextlib.suppress(Exception):
            log.warning("image cache background work failed: %s", task.exception())
