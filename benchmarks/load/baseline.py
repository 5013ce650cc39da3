"""The naive baseline: the same episodes done the way many teams do it today.

``docker run -d <image> sleep infinity`` per rollout (no network, same
image), ``docker exec`` per command (a fresh ``bash -c`` each time: there are
no sessions), file writes as ``docker exec sh -c 'echo <base64> | base64 -d > f'``,
``docker rm -f`` at the end. Blocking docker SDK calls run in a thread pool
sized for the run's concurrency, so episodes are concurrent. Every container
carries the harness label, which is how leaks are counted afterwards.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import posixpath
import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import docker
import docker.errors
import requests.exceptions

from benchmarks.load.episode import ExecOutcome
from benchmarks.load.leaks import HARNESS_LABEL, engine_leftovers

T = TypeVar("T")
WORKDIR = "/workspace"


class BaselineDriver:
    name = "baseline"

    def __init__(
        self, *, run_id: str, image: str, threads: int, snapshots: bool = False, log: Any = None
    ) -> None:
        self.run_id = run_id
        self.image = image
        self.threads = threads
        self.snapshots = snapshots
        """Only when the sandboxd side takes snapshots too (same work in both)."""
        self.labels = {HARNESS_LABEL: run_id}
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="baseline")
        self._engine: Any = None
        self._images: dict[str, list[str]] = {}
        self.live = 0
        self.starting = 0
        self.removing = 0
        self.waiting = 0
        self._log = log or (lambda msg: None)

    async def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, lambda: fn(*args, **kwargs))

    async def setup(self, warm_timeout: float) -> dict[str, Any]:
        self._engine = await asyncio.to_thread(
            docker.from_env, timeout=warm_timeout, max_pool_size=self.threads
        )
        await asyncio.to_thread(self._engine.images.get, self.image)
        # One unmeasured container first, like sandboxd's warm-up: page cache and engine metadata are warm.
        t0 = time.perf_counter()
        box = await self._call(self._run)
        await self._call(box.remove, force=True)
        return {"warmup_s": round(time.perf_counter() - t0, 3), "threads": self.threads}

    async def teardown(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self._engine is not None:
            found = await asyncio.to_thread(engine_leftovers, self._engine, HARNESS_LABEL, self.run_id)
            for ids in self._images.values():  # snapshots of episodes cut short
                for image_id in ids:
                    await asyncio.to_thread(self._remove_image, image_id)
            self._engine.close()
            out = {"leaked": len(found), "leftovers": found}
        self._pool.shutdown(wait=False, cancel_futures=True)
        return out

    def _run(self) -> Any:
        return self._engine.containers.run(
            self.image,
            ["sleep", "infinity"],
            detach=True,
            network_mode="none",
            labels=self.labels,
            working_dir=WORKDIR,
            init=True,
        )

    def _remove_image(self, image_id: str) -> None:
        with contextlib.suppress(docker.errors.ImageNotFound):
            self._engine.images.remove(image_id, force=True)

    # -- the Driver protocol ----------------------------------------------------

    async def acquire(self, n: int, labels: Mapping[str, str]) -> Sequence[object]:
        self.waiting += n
        self.starting += n
        results = await asyncio.gather(*(self._call(self._run) for _ in range(n)), return_exceptions=True)
        self.waiting -= n
        self.starting -= n
        boxes = [r for r in results if not isinstance(r, BaseException)]
        self.live += len(boxes)
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:  # all or nothing, like a group acquire
            await self.release(boxes)
            raise failed[0]
        return boxes

    async def exec(self, box: Any, command: str, *, session: bool, timeout: float) -> ExecOutcome:
        argv = ["timeout", "-s", "KILL", f"{timeout:g}", "bash", "-c", command]
        result = await self._call(box.exec_run, argv, workdir=WORKDIR, demux=True)
        _, stderr = result.output if result.output else (b"", b"")
        if result.exit_code == 137:
            return ExecOutcome("TIMED_OUT", -1, stderr or b"")
        return ExecOutcome("EXITED", int(result.exit_code), stderr or b"")

    async def write(self, box: Any, files: Sequence[tuple[str, bytes]]) -> None:
        for path, content in files:
            encoded = base64.b64encode(content).decode()
            target = posixpath.join(WORKDIR, path)
            folder = shlex.quote(posixpath.dirname(target))
            script = f"mkdir -p {folder} && echo {encoded} | base64 -d > {shlex.quote(target)}"
            result = await self._call(box.exec_run, ["sh", "-c", script], demux=True)
            if result.exit_code != 0:
                stderr = (result.output[1] or b"").decode(errors="replace") if result.output else ""
                raise RuntimeError(f"writing {path} exited {result.exit_code}: {stderr[-200:]}")

    async def snapshot(self, box: Any) -> None:
        image = await self._call(box.commit, conf={"Labels": self.labels})
        self._images.setdefault(box.id, []).append(image.id)

    async def release(self, boxes: Sequence[Any]) -> None:
        self.removing += len(boxes)
        try:
            await asyncio.gather(*(self._call(b.remove, force=True) for b in boxes))
            for b in boxes:
                for image_id in self._images.pop(b.id, []):
                    await self._call(self._remove_image, image_id)
        finally:
            self.removing -= len(boxes)
            self.live -= len(boxes)

    def classify(self, error: BaseException) -> str:
        if isinstance(error, docker.errors.APIError):
            return f"docker:{error.status_code}"
        if isinstance(error, requests.exceptions.RequestException):
            return f"docker:{type(error).__name__}"
        return f"client:{type(error).__name__}"

    async def sample(self) -> dict[str, int]:
        return {
            "live": self.live,
            "starting": self.starting,
            "removing": self.removing,
            "demand": self.live + self.waiting - self.removing,
        }
