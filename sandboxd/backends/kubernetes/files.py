"""Files into and out of a sandbox's Pod: tar streams over the exec stream.

put_tar and get_tar run the shared tar scripts (sandboxd.backends.shell) in
the sandbox's container through the API server's exec stream (wsexec). An
upload needs the v5 protocol, the first that can close stdin alone.
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import AsyncIterator

from sandboxd.backends.extract import put_refusal, put_tar_argv
from sandboxd.backends.kubernetes.cache import PodCache
from sandboxd.backends.kubernetes.client import KubeClient, KubeError, unavailable, unreachable
from sandboxd.backends.kubernetes.podspec import CONTAINER
from sandboxd.backends.kubernetes.wsexec import V5, ExecStream
from sandboxd.backends.shell import LINK_EXIT, get_tar_argv, link_refusal
from sandboxd.errors import (
    BackendError,
    InvalidArgument,
    NotFound,
    PermanentBackendError,
    SandboxLost,
)


class PodFiles:
    """Tar in and tar out for the sandbox Pods of one namespace."""

    def __init__(self, client: KubeClient, cache: PodCache, namespace: str) -> None:
        self._client = client
        self._cache = cache
        self._ns = namespace

    async def _open(self, handle: str, argv: builtins.list[str], stdin: bool) -> ExecStream:
        if self._cache.get(handle) is None:
            raise SandboxLost("the sandbox's Pod is gone")
        try:
            return await ExecStream.open(self._client, self._ns, handle, CONTAINER, argv, stdin=stdin)
        except KubeError as e:
            if unreachable(e):
                raise unavailable(e, "nothing was transferred") from e
            raise SandboxLost(f"cannot exec into Pod {handle}: {e}") from e

    async def put_tar(self, handle: str, dest: str, chunks: AsyncIterator[bytes]) -> None:
        """Extracts the tar stream at ``dest`` in the workspace."""
        stream = await self._open(handle, put_tar_argv(dest), stdin=True)
        stderr = bytearray()
        try:
            if stream.protocol != V5:
                raise PermanentBackendError(
                    "file upload needs the v5.channel.k8s.io exec protocol (Kubernetes >= 1.30)"
                )

            async def drain() -> None:
                while isinstance(frame := await stream.next_frame(None), tuple):
                    if frame[0] == 2 and len(stderr) < 8192:
                        stderr.extend(frame[1])

            reader = asyncio.create_task(drain())
            try:
                async for chunk in chunks:
                    await stream.write(chunk)
                await stream.close_stdin()
                await reader
            except (ConnectionError, OSError) as e:
                raise SandboxLost(f"upload stream cut: {e}") from e
            finally:
                reader.cancel()
        finally:
            await stream.close()
        code = stream.exit_code
        message = stderr.decode(errors="replace").strip()
        if code is None:
            raise SandboxLost(f"upload ended without an exit status: {stream.failure or message}")
        if (refusal := put_refusal(code, dest, message)) is not None:
            raise refusal

    async def get_tar(self, handle: str, base: str, paths: tuple[str, ...]) -> AsyncIterator[bytes]:
        """A tar stream of ``paths`` under ``base``; NotFound names a missing path."""
        stream = await self._open(handle, get_tar_argv(base, paths), stdin=False)
        stderr = bytearray()
        try:
            while isinstance(frame := await stream.next_frame(None), tuple):
                if frame[0] == 1:
                    yield frame[1]
                elif len(stderr) < 8192:
                    stderr.extend(frame[1])
        finally:
            await stream.close()
        code = stream.exit_code
        message = stderr.decode(errors="replace").strip()
        if code == 3:
            missing = message.split("missing:", 1)[-1].splitlines()[0] if "missing:" in message else base
            raise NotFound(f"no such file or directory in the sandbox: {missing}")
        if code == LINK_EXIT:
            raise InvalidArgument("path", f"refused to read under {base}: {link_refusal(message)}")
        if code != 0:
            raise BackendError(f"reading files failed: {message or stream.failure or f'exit {code}'}")
