"""Where a Docker sandbox runs: its container, from spec to removal.

The container spec (hardening, limits, scratch mounts, the inbox mount:
sandboxd.backends.docker.containerspec), create and start, removal, listing
by labels for adoption, liveness, engine capacity and in-place limit
updates. Every call goes through the ``docker`` SDK on a bounded thread
pool, never on the event loop.

Containers are hardened by default: no network, non-root, no capabilities,
no-new-privileges, read-only root, and a size- and inode-limited tmpfs as the
workspace, so the kernel enforces disk bytes and file count. Each sandbox
runs as a host uid of its own (sandboxd.backends.uids; under runc: gVisor
counts nothing per host uid, so its sandboxes share one), recorded in a label
for adoption; the workspace is owned by it, and the image's /etc/passwd and
/etc/group, with the sandbox user's line made to name it, are bind-mounted
read-only from the inbox so that tools that look the user up (id, whoami,
git, ssh) work on the read-only root. A sandbox's
inbox (see backend) is a host directory made with its container, mounted
read-only at INBOX and removed with it; every list sweeps the inboxes whose
container is gone. A pool's sandboxes may have a writable root instead,
bounded by a tmpfs of their own under the container's overlay layer
(sandboxd.backends.docker.rootfs).
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import functools
import os
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import docker
import docker.errors
import requests.exceptions

from sandboxd.backends.base import (
    GVISOR,
    LABEL_IMAGE,
    LABEL_INSTANCE,
    LABEL_MANAGED,
    LABEL_POOL,
    LABEL_SANDBOX,
    BackendSandbox,
    Limits,
    SandboxSpec,
)
from sandboxd.backends.docker import rootfs
from sandboxd.backends.docker.containerspec import (
    INBOX,
    LABEL_KEEPER,
    LABEL_ROOT,
    LABEL_RUNTIME,
    DockerOptions,
    container_name,
    container_spec,
)
from sandboxd.backends.docker.users import ContainerUsers
from sandboxd.backends.gvisor_pids import engine_pids
from sandboxd.errors import BackendError, PermanentBackendError, SandboxLost, TransientBackendError

T = TypeVar("T")

_DEFAULT_ENGINE = "unix:///var/run/docker.sock"
# An inbox directory without a container is only removed once it is this old,
# so a sweep never races a create that made the directory a moment ago.
_INBOX_GRACE_SECONDS = 300.0


class Containers:
    """The containers of one control-plane instance on one engine: create,
    remove, list and inspect them, each call on a worker thread."""

    def __init__(self, options: DockerOptions) -> None:
        self._options = options
        address = options.base_url or _DEFAULT_ENGINE
        try:
            # The SDK asks the engine for its API version here: a wrong
            # address (a stale DOCKER_HOST) fails now, named, as a sandboxd error.
            self._client = docker.DockerClient(base_url=address, timeout=60, max_pool_size=options.threads)
        except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
            raise TransientBackendError(f"Docker engine unreachable at {address}: {e}") from e
        self.pool = ThreadPoolExecutor(max_workers=options.threads, thread_name_prefix="sandboxd-docker")
        """The worker threads for every blocking call of the backend."""
        # Host directory of each sandbox's inbox mount (None: it has none).
        self._inboxes: dict[str, Path | None] = {}
        self.users = ContainerUsers(options.uids, options.user, options.instance)
        """Each container's sandbox user, and which sandbox holds which uid."""
        # The layer directory of each writable root mounted here (rootfs).
        self._roots: dict[str, Path] = {}
        self.writable_roots: set[str] = set()
        """Containers with a writable root, created or listed here."""

    @property
    def api(self) -> Any:
        """The SDK's low-level client, for endpoints the SDK does not wrap;
        only for calls made through run()."""
        return self._client.api

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` on a worker thread."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.pool, functools.partial(fn, *args, **kwargs))

    async def ping(self) -> None:
        """Raises TransientBackendError, naming the address, if the engine does not answer."""
        try:
            await self.run(self._client.ping)
        except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
            address = self._options.base_url or _DEFAULT_ENGINE
            raise TransientBackendError(f"Docker engine unreachable at {address}: {e}") from e

    async def image_exists(self, image: str) -> bool:
        """Whether the engine holds ``image``."""
        try:
            await self.run(self._client.images.get, image)
            return True
        except docker.errors.ImageNotFound:
            return False
        except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
            raise TransientBackendError(f"cannot inspect image {image!r}: {e}") from e

    async def create(self, spec: SandboxSpec) -> tuple[str, int]:
        """Creates and starts the sandbox's container (and its inbox) as a
        host uid of its own; returns the container's id and its init
        process's host pid (0: unknown). A half-made container is left for
        discard(), which frees the uid."""
        # gVisor's sentry is a kernel of its own per sandbox: nothing there is
        # counted per host uid, and a live restore needs every sandbox's spec
        # (its mounts' uid= included) to be alike, so all share one user.
        user = None if spec.runtime == GVISOR else self.users.allocate(spec.sandbox_id)
        handle, pid = await self.run(self._create_sync, spec, user)
        self._inboxes[handle] = self.inbox_path(spec.sandbox_id)
        self.users.created(handle, spec.sandbox_id, user)
        if spec.writable_root:
            self.writable_roots.add(handle)
        return handle, pid

    def _create_sync(self, spec: SandboxSpec, user: tuple[int, int] | None) -> tuple[str, int]:
        inbox = self.inbox_path(spec.sandbox_id)
        if spec.writable_root and inbox is None:
            raise PermanentBackendError("a writable root needs the backend's inbox directory")
        kwargs = container_spec(spec, self._options, inbox, user)
        if inbox is not None:
            try:
                inbox.mkdir(parents=True, exist_ok=True)
                inbox.chmod(0o755)  # the sandbox user reads it, whatever our umask
                if user is not None:
                    self.users.prepare(inbox)
                if spec.writable_root:
                    kwargs["mounts"] += rootfs.network_files_mounts(inbox, bool(spec.network))
            except OSError as e:
                raise PermanentBackendError(f"cannot create the sandbox's inbox {inbox}: {e}") from e
        try:
            container = self._client.containers.create(**kwargs)
            if user is not None:
                self.users.fill(self._client, container, spec.image, inbox, user)
            if spec.writable_root:
                self._bound_root(container, spec.limits)
            container.start()
            container.reload()
            return str(container.id), int(container.attrs.get("State", {}).get("Pid") or 0)
        except docker.errors.ImageNotFound as e:
            raise PermanentBackendError(f"image {spec.image!r} is not present on the engine") from e
        except docker.errors.APIError as e:
            if e.is_client_error() and e.status_code != 409:
                raise PermanentBackendError(f"the engine rejected the sandbox spec: {e.explanation}") from e
            raise TransientBackendError(f"container create failed: {e.explanation}") from e
        except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
            raise TransientBackendError(f"container create failed: {e}") from e

    def _bound_root(self, container: Any, limits: Limits) -> None:
        """Mounts the created container's bounded root (sandboxd.backends.docker.rootfs)."""
        upper = str(((container.attrs.get("GraphDriver") or {}).get("Data") or {}).get("UpperDir") or "")
        if not upper:
            raise PermanentBackendError("the engine names no overlay2 upper layer for a writable root")
        try:
            layer = rootfs.mount_root(upper, self._options.instance, limits.disk_bytes, limits.max_files)
        except OSError as e:
            raise PermanentBackendError(f"cannot bound the sandbox's writable root: {e}") from e
        self._roots[str(container.id)] = layer

    async def root_room(self, handle: str) -> os.statvfs_result | None:
        """The bounded writable root's filesystem, read on the host (what a
        gVisor sandbox's own statfs of / does not tell); None without one."""
        if handle not in self.writable_roots:
            return None
        if handle not in self._roots:
            try:
                state = await self.run(self._client.api.inspect_container, handle)
            except (docker.errors.DockerException, requests.exceptions.RequestException):
                return None
            upper = ((state.get("GraphDriver") or {}).get("Data") or {}).get("UpperDir")
            if not upper:
                return None
            self._roots[handle] = Path(upper).parent
        try:
            return await self.run(os.statvfs, self._roots[handle])
        except OSError:
            return None

    async def discard(self, sandbox_id: str) -> None:
        """Removes what a create that failed or was cancelled may have left
        (the container, found by name, and its inbox); never raises a
        BackendError. The uid is freed once the container is known gone."""
        try:
            await self.run(self._remove_sync, container_name(sandbox_id))
        except BackendError:
            pass
        else:
            self.users.discarded(sandbox_id)
        inbox = self.inbox_path(sandbox_id)
        if inbox is not None:
            await self.run(shutil.rmtree, inbox, True)

    async def remove(self, handle: str) -> None:
        """Removes the container (gone already is fine), then its inbox;
        frees its uid once it is gone."""
        inbox = self._inboxes.pop(handle, None)
        await self.run(self._remove_sync, handle)
        self.users.removed(handle)
        self.writable_roots.discard(handle)
        layer = self._roots.pop(handle, None)
        if layer is not None:
            # The engine unmounts it as it removes the layer; made sure of here.
            await self.run(rootfs.unmount, layer)
        if inbox is not None:
            await self.run(shutil.rmtree, inbox, True)

    def _remove_sync(self, ref: str) -> None:
        try:
            self._client.api.remove_container(ref, force=True, v=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as e:
            if e.status_code == 409 and "already in progress" in str(e.explanation):
                # Another remove runs (slow under gVisor): done once it is.
                with contextlib.suppress(docker.errors.DockerException, requests.exceptions.RequestException):
                    self._client.api.wait(ref, timeout=60, condition="removed")
                return
            raise TransientBackendError(f"container remove failed: {e.explanation}") from e
        except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
            raise TransientBackendError(f"container remove failed: {e}") from e

    def known_user(self, handle: str) -> tuple[int, int] | None:
        """The sandbox user's (uid, gid) of a container created or listed here."""
        return self.users.known(handle)

    async def user_of(self, handle: str) -> tuple[int, int]:
        """The sandbox user's (uid, gid), looked up once for a container
        neither created nor listed here (SandboxLost when it is gone)."""
        known = self.users.known(handle)
        if known is not None:
            return known
        try:
            state = await self.run(self._client.api.inspect_container, handle)
        except docker.errors.NotFound as e:
            raise SandboxLost("the sandbox's container is gone") from e
        except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
            raise TransientBackendError(f"cannot inspect the sandbox's container: {e}") from e
        config = state.get("Config") or {}
        return self.users.adopt(handle, config.get("Labels") or {}, str(config.get("User") or ""))

    async def list(self) -> builtins.list[BackendSandbox]:
        """Every container of this instance, running or not, by its labels;
        sweeps the inboxes of containers that are gone. The uids of other
        instances' sandboxes on the engine are not given out meanwhile."""
        listed_at = self.users.mark()
        try:
            everyone = await self.run(
                self._client.api.containers, all=True, filters={"label": [f"{LABEL_MANAGED}=true"]}
            )
        except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
            raise TransientBackendError(f"cannot list containers: {e}") from e
        containers = [
            c for c in everyone if (c.get("Labels") or {}).get(LABEL_INSTANCE) == self._options.instance
        ]
        self.users.foreign([c.get("Labels") or {} for c in everyone if c not in containers])
        out = []
        for c in containers:
            labels = c.get("Labels") or {}
            self.users.adopt(str(c["Id"]), labels, listed_at=listed_at)
            if labels.get(LABEL_ROOT) == "writable":
                self.writable_roots.add(str(c["Id"]))
            out.append(
                BackendSandbox(
                    sandbox_id=labels.get(LABEL_SANDBOX, ""),
                    pool=labels.get(LABEL_POOL, ""),
                    handle=str(c["Id"]),
                    running=c.get("State") in ("running", "paused"),
                    labels=labels,
                    paused=c.get("State") == "paused",
                    image=labels.get(LABEL_IMAGE, ""),
                )
            )
        if self._options.inbox_dir is not None:
            await self.run(self._sweep_inboxes, {s.sandbox_id for s in out})
        await self._sweep_roots()
        return out

    async def _sweep_roots(self) -> None:
        """Unmounts this instance's writable roots whose container is gone
        (the engine unmounts them as it removes one; a crash may not)."""
        if not await self.run(rootfs.mounted_roots, self._options.instance):
            return
        root_dir = str((await self.engine_info()).get("DockerRootDir") or "")
        if root_dir:
            in_use = await self.run(rootfs.layers_in_use, root_dir)
            await self.run(rootfs.sweep, self._options.instance, in_use)

    async def alive(self, handles: builtins.list[str]) -> set[str]:
        """The running ones among ``handles`` (paused ones count: their
        processes are all there), from one ``containers list`` call."""
        try:
            running = await self.run(
                self._client.api.containers,
                quiet=True,
                filters={
                    "label": [f"{LABEL_INSTANCE}={self._options.instance}", f"{LABEL_MANAGED}=true"],
                    "status": ["running", "paused"],
                },
            )
        except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
            raise TransientBackendError(f"cannot list containers: {e}") from e
        ids = {str(c["Id"]) for c in running}
        return {h for h in handles if h in ids}

    async def is_running(self, handle: str) -> bool:
        """Whether the container runs; True when the engine cannot tell, so
        a hiccup never declares a sandbox lost."""
        try:
            state = await self.run(self._client.api.inspect_container, handle)
        except docker.errors.NotFound:
            return False
        except (docker.errors.DockerException, requests.exceptions.RequestException):
            return True
        return bool(state.get("State", {}).get("Running"))

    async def host_pid(self, handle: str) -> int:
        """The host pid of the container's init process; 0 when unknown."""
        try:
            state = await self.run(self._client.api.inspect_container, handle)
            return int(state.get("State", {}).get("Pid") or 0)
        except (docker.errors.DockerException, requests.exceptions.RequestException):
            return 0

    async def oom_killed(self, handle: str) -> bool:
        """Whether the engine says the container was killed for memory (False when it cannot tell)."""
        try:
            state = await self.run(self._client.api.inspect_container, handle)
        except (docker.errors.DockerException, requests.exceptions.RequestException):
            return False
        return bool(state.get("State", {}).get("OOMKilled"))

    async def runtime_of(self, handle: str) -> tuple[str, bool]:
        """The sandbox's isolation runtime ("" when unknown) and whether it
        runs the keeper, from its labels (a gVisor sandbox made before the
        keeper label did)."""
        try:
            state = await self.run(self._client.api.inspect_container, handle)
        except (docker.errors.DockerException, requests.exceptions.RequestException):
            return "", False
        labels = state.get("Config", {}).get("Labels") or {}
        runtime = str(labels.get(LABEL_RUNTIME, ""))
        return runtime, runtime == GVISOR and labels.get(LABEL_KEEPER, "true") != "false"

    async def engine_info(self) -> dict[str, Any]:
        """The engine's ``info`` (memory, CPUs, containers)."""
        try:
            return dict(await self.run(self._client.info))
        except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
            raise TransientBackendError(f"cannot read engine info: {e}") from e

    async def root_refusal(self) -> str | None:
        """Why a sandbox's writable root cannot be bounded here; None when it can (rootfs.refusal)."""
        address = self._options.base_url or ""
        local = not address or address.startswith("unix://")
        info = await self.engine_info()
        return await self.run(rootfs.refusal, info, local, self._options.inbox_dir is not None)

    async def capacity(self) -> tuple[int, int]:
        """The engine's memory in bytes and its CPU count."""
        info = await self.engine_info()
        return int(info.get("MemTotal") or 0), int(info.get("NCPU") or 0)

    async def update_limits(self, handle: str, limits: Limits, runtime: str = "") -> None:
        """Applies the memory, CPU and pids limits set in ``limits`` to the
        running container (of ``runtime``; the pids limit as engine_pids says)."""
        body: dict[str, int] = {}
        if limits.memory_bytes:
            body["Memory"] = body["MemorySwap"] = limits.memory_bytes
        if limits.cpu_millis:
            body["NanoCpus"] = limits.cpu_millis * 1_000_000
        if limits.pids:
            body["PidsLimit"] = engine_pids(runtime, limits.pids)
        if body:
            await self.run(self._update_sync, handle, body)

    def _update_sync(self, handle: str, body: dict[str, int]) -> None:
        # The SDK's update_container predates PidsLimit; the API takes it.
        api = self._client.api
        try:
            response = api._post_json(api._url("/containers/{0}/update", handle), data=body)
            api._raise_for_status(response)
        except docker.errors.NotFound as e:
            raise SandboxLost("the sandbox's container is gone") from e
        except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
            raise TransientBackendError(f"cannot update limits: {e}") from e

    # -- Inboxes ------------------------------------------------------------

    def inbox_path(self, sandbox_id: str) -> Path | None:
        """The host directory of the sandbox's inbox; None without inboxes."""
        root = self._options.inbox_dir
        return None if root is None or not sandbox_id else root / sandbox_id

    def known_inbox(self, handle: str) -> Path | None:
        """The inbox of a container this process created or looked up; None otherwise."""
        return self._inboxes.get(handle)

    async def find_inbox(self, handle: str) -> Path | None:
        """The container's inbox directory, looked up once for a container
        adopted after a restart; None if it has none."""
        if handle not in self._inboxes:
            try:
                state = await self.run(self._client.api.inspect_container, handle)
            except (docker.errors.DockerException, requests.exceptions.RequestException):
                return None
            sources = [m.get("Source") for m in state.get("Mounts") or [] if m.get("Destination") == INBOX]
            self._inboxes[handle] = Path(sources[0]) if sources and sources[0] else None
        return self._inboxes[handle]

    def _sweep_inboxes(self, keep: set[str]) -> None:
        """Removes inboxes whose sandbox is gone (a crash between remove and
        cleanup, or a container removed behind our back)."""
        root = self._options.inbox_dir
        assert root is not None
        cutoff = time.time() - _INBOX_GRACE_SECONDS
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(root):
                if entry.name not in keep and entry.is_dir(follow_symlinks=False):
                    with contextlib.suppress(OSError):
                        if entry.stat(follow_symlinks=False).st_mtime < cutoff:
                            shutil.rmtree(entry.path, ignore_errors=True)

    async def close(self) -> None:
        """Closes the SDK client and lets the worker threads go."""
        await self.run(self._client.close)
        self.pool.shutdown(wait=False)
