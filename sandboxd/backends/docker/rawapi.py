"""A minimal asyncio HTTP/1.1 client for the Docker engine's exec endpoints.

The ``docker`` SDK is synchronous, and its hijacked exec sockets may lose the
first bytes of output to the SDK's header buffer. Exec is sandboxd's hot path,
so it speaks to the engine socket directly: create, start (hijacked, with
stdin half-close) and inspect. Everything else goes through the SDK in a
thread pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlparse

from sandboxd.errors import NotFound, SandboxLost, TransientBackendError

API_VERSION = "v1.41"


@dataclass(frozen=True)
class EngineAddress:
    """Where the Docker engine listens: a unix socket path, or a TCP host and port."""

    unix_path: str = ""
    host: str = ""
    port: int = 0

    @classmethod
    def parse(cls, base_url: str | None) -> EngineAddress:
        """unix:// (default /var/run/docker.sock) or tcp:// / http:// (port 2375); ValueError otherwise."""
        if not base_url or base_url.startswith("unix://"):
            path = (base_url or "unix:///var/run/docker.sock").removeprefix("unix://")
            return cls(unix_path=path)
        url = urlparse(base_url)
        if url.scheme in ("tcp", "http") and url.hostname:
            return cls(host=url.hostname, port=url.port or 2375)
        raise ValueError(f"unsupported Docker address {base_url!r} (use unix:// or tcp://)")


class ExecChannel:
    """A started exec: demultiplexed output frames in, raw stdin out."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        on_close: Callable[[ExecChannel], None] = lambda _: None,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._pending: asyncio.Task[tuple[int, bytes] | None] | None = None
        self._on_close = on_close

    async def next_frame(self, timeout: float) -> tuple[int, bytes] | TimeoutError | None:
        """Like read_frame with a timeout, but a timeout never cuts a frame in
        half: the read in progress is kept for the next call."""
        if self._pending is None:
            self._pending = asyncio.ensure_future(self.read_frame())
        done, _ = await asyncio.wait({self._pending}, timeout=max(timeout, 0))
        if not done:
            return TimeoutError()
        task, self._pending = self._pending, None
        return task.result()

    async def read_frame(self) -> tuple[int, bytes] | None:
        """Next (stream, data) frame; None at end of stream."""
        try:
            header = await self._reader.readexactly(8)
            stream, size = struct.unpack(">BxxxL", header)
            data = await self._reader.readexactly(size)
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        return stream, data

    async def write(self, data: bytes) -> None:
        """Sends ``data`` to the process's stdin, waiting while the socket's buffer is full."""
        self._writer.write(data)
        await self._writer.drain()

    def close_stdin(self) -> None:
        """Half-closes the socket so the process reads EOF; output can still be read."""
        if self._writer.can_write_eof():
            self._writer.write_eof()

    async def close(self) -> None:
        """Drops any read in progress and closes the connection; connection errors are ignored."""
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None
        self._on_close(self)
        self._writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self._writer.wait_closed()


class RawEngine:
    """The engine's exec endpoints, a connection a call; 404 is NotFound, 409 SandboxLost, else transient."""

    def __init__(self, address: EngineAddress) -> None:
        self._address = address
        # The open exec streams of each container, for cut(): under gVisor
        # the engine never ends those of a container it has removed.
        self._streams: dict[str, set[ExecChannel]] = {}

    async def cut(self, container: str) -> None:
        """Closes every exec stream still open in ``container`` (removed):
        their readers see the end of the stream."""
        # A copy: each close takes its channel out of the set.
        for channel in list(self._streams.pop(container, ())):
            await channel.close()

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            if self._address.unix_path:
                return await asyncio.open_unix_connection(self._address.unix_path, limit=1 << 20)
            return await asyncio.open_connection(self._address.host, self._address.port, limit=1 << 20)
        except OSError as e:
            raise TransientBackendError(f"cannot reach the Docker engine: {e}") from e

    async def _send(
        self, method: str, path: str, body: dict[str, Any] | None, upgrade: bool
    ) -> tuple[int, dict[str, str], asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await self._connect()
        payload = json.dumps(body).encode() if body is not None else b""
        head = [f"{method} /{API_VERSION}{path} HTTP/1.1", "Host: docker"]
        if body is not None:
            head += ["Content-Type: application/json", f"Content-Length: {len(payload)}"]
        head += ["Connection: Upgrade", "Upgrade: tcp"] if upgrade else ["Connection: close"]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + payload)
        try:
            raw = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError) as e:
            writer.close()
            raise TransientBackendError(f"Docker engine closed the connection: {e}") from e
        lines = raw.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                k, v = line.split(":", 1)
                headers[k.strip().lower()] = v.strip()
        return status, headers, reader, writer

    async def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        status, headers, reader, writer = await self._send(method, path, body, upgrade=False)
        try:
            if headers.get("transfer-encoding", "").lower() == "chunked":
                data = await _read_chunked(reader)
            elif "content-length" in headers:
                data = await reader.readexactly(int(headers["content-length"]))
            else:
                data = await reader.read()
        finally:
            writer.close()
        if status == 404:
            raise NotFound(_message(data))
        if status == 409:
            raise SandboxLost(_message(data))
        if status >= 400:
            raise TransientBackendError(f"Docker engine answered {status}: {_message(data)}")
        return json.loads(data) if data else None

    async def exec_create(
        self,
        container: str,
        argv: list[str],
        *,
        stdin: bool,
        env: dict[str, str],
        workdir: str,
        user: str,
    ) -> str:
        """Creates (does not start) an exec without a TTY in ``container``; returns its id."""
        body = {
            "AttachStdin": stdin,
            "AttachStdout": True,
            "AttachStderr": True,
            "Tty": False,
            "Cmd": argv,
            "Env": [f"{k}={v}" for k, v in env.items()],
            "WorkingDir": workdir,
            "User": user,
        }
        result = await self._call("POST", f"/containers/{quote(container)}/exec", body)
        return str(result["Id"])

    async def exec_start(self, exec_id: str, container: str) -> ExecChannel:
        """Starts the exec (made in ``container``) on a hijacked connection;
        SandboxLost when the container is not running."""
        status, _, reader, writer = await self._send(
            "POST", f"/exec/{exec_id}/start", {"Detach": False, "Tty": False}, upgrade=True
        )
        if status not in (101, 200):
            writer.close()
            if status == 409:
                raise SandboxLost("the sandbox's container is not running")
            raise TransientBackendError(f"exec start answered {status}")
        streams = self._streams.setdefault(container, set())
        channel = ExecChannel(reader, writer, streams.discard)
        streams.add(channel)
        return channel

    async def exec_inspect(self, exec_id: str) -> dict[str, Any]:
        """The engine's JSON state of the exec (Running, ExitCode, Pid, ...)."""
        result = await self._call("GET", f"/exec/{exec_id}/json")
        assert isinstance(result, dict)
        return result


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    out = bytearray()
    while True:
        size_line = await reader.readline()
        size = int(size_line.split(b";")[0].strip() or b"0", 16)
        if size == 0:
            await reader.readline()
            return bytes(out)
        out += await reader.readexactly(size)
        await reader.readline()


def _message(data: bytes) -> str:
    try:
        return str(json.loads(data).get("message", data.decode(errors="replace")))
    except (ValueError, AttributeError):
        return data.decode(errors="replace").strip()
