"""Exec into a Pod over the API server's WebSocket stream.

Channel protocol: every binary message starts with a channel byte (0 stdin,
1 stdout, 2 stderr, 3 status, 4 resize). ``v5.channel.k8s.io`` adds a CLOSE
message (255, channel) so stdin can be closed while output keeps flowing;
with v4 the only way to signal EOF is to close the whole socket, so commands
that read stdin to its end need v5 (API server >= 1.30).

Kubernetes exec has no cwd, env or user: the argv is wrapped in ``sh`` so
the command starts in ``cwd`` with extra environment (the container already
runs as the sandbox user).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Mapping, Sequence

import aiohttp

from sandboxd.backends.kubernetes.client import KubeClient, KubeError

_EXIT_STATUS = re.compile(r"exit status (\d+)$")
V5 = "v5.channel.k8s.io"
V4 = "v4.channel.k8s.io"
STDIN, STDOUT, STDERR, STATUS, CLOSE = 0, 1, 2, 3, 255
OPEN_TIMEOUT = 10.0
"""Longest an exec waits for its stream to open. An API server that accepts
connections but does not answer (overloaded, paused) must not hold the
caller for the session's default of minutes."""

# cd to $1, then exec the rest through env (which takes the NAME=value words).
# What runs by exec is the OOM killer's first choice (raising one's own score
# needs no privilege), so a memory-hungry command, or a fork bomb's copies,
# is killed before the container's PID 1, whose death would end the sandbox.
_WRAP = 'echo 1000 2>/dev/null >/proc/self/oom_score_adj; cd -- "$1" || exit 125; shift; exec env -- "$@"'


def wrap_argv(argv: Sequence[str], cwd: str, env: Mapping[str, str]) -> list[str]:
    """``argv`` run in ``cwd`` with ``env`` added, first in line for the OOM killer; exit 125 if no cwd."""
    return ["sh", "-c", _WRAP, "sandboxd-exec", cwd, *(f"{k}={v}" for k, v in env.items()), *argv]


class ExecStream:
    """One exec: frames out, bytes in, exit status at the end."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = ws
        self.protocol = ws.protocol or ""
        self.status: dict[str, object] | None = None
        self._closed = False

    @classmethod
    async def open(
        cls,
        client: KubeClient,
        namespace: str,
        pod: str,
        container: str,
        argv: Sequence[str],
        *,
        stdin: bool,
    ) -> ExecStream:
        """Starts ``argv`` in the Pod's container (v5 if the server speaks it); KubeError if it cannot."""
        query: list[tuple[str, str]] = [("container", container)]
        query += [("command", a) for a in argv]
        query += [("stdout", "true"), ("stderr", "true"), ("stdin", "true" if stdin else "false")]
        url = client.url(f"/api/v1/namespaces/{namespace}/pods/{pod}/exec", query)
        url = "wss" + url[5:] if url.startswith("https") else "ws" + url[4:]
        try:
            async with asyncio.timeout(OPEN_TIMEOUT):
                ws = await client.session().ws_connect(
                    url,
                    protocols=(V5, V4),
                    headers=client.auth_headers(),
                    timeout=aiohttp.ClientWSTimeout(ws_receive=None, ws_close=5.0),
                    max_msg_size=0,
                    autoping=True,
                    heartbeat=None,
                    compress=0,
                )
        except aiohttp.WSServerHandshakeError as e:
            raise KubeError(e.status, "", f"exec into {pod}: {e.message}") from e
        except TimeoutError as e:
            raise KubeError(0, "", f"exec into {pod}: no answer within {OPEN_TIMEOUT:g}s") from e
        except (aiohttp.ClientError, OSError) as e:
            raise KubeError(0, "", f"exec into {pod}: {e}") from e
        return cls(ws)

    async def write(self, data: bytes) -> None:
        """Sends ``data`` to the command's stdin, in frames of at most 64 KiB."""
        for i in range(0, len(data), 1 << 16):
            await self._ws.send_bytes(bytes([STDIN]) + data[i : i + (1 << 16)])

    async def close_stdin(self) -> None:
        """Ends the command's stdin, output still flowing; only v5 can, so with v4 it does nothing."""
        if self.protocol == V5:
            await self._ws.send_bytes(bytes([CLOSE, STDIN]))

    async def next_frame(self, timeout: float | None = None) -> tuple[int, bytes] | TimeoutError | None:
        """The next stdout/stderr frame; None at the end; TimeoutError if
        nothing came within ``timeout``."""
        while True:
            try:
                msg = await asyncio.wait_for(self._ws.receive(), timeout)
            except TimeoutError as e:
                return e
            if msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSING):
                return None
            if msg.type == aiohttp.WSMsgType.ERROR:
                return None
            if msg.type == aiohttp.WSMsgType.TEXT:
                data = msg.data.encode()
            elif msg.type == aiohttp.WSMsgType.BINARY:
                data = msg.data
            else:
                continue
            if not data:
                continue
            channel, payload = data[0], data[1:]
            if channel == STATUS:
                try:
                    self.status = json.loads(payload)
                except ValueError:
                    self.status = {"status": "Failure", "message": payload.decode(errors="replace")}
                continue
            if channel in (STDOUT, STDERR) and payload:
                return channel, payload

    @property
    def exit_code(self) -> int | None:
        """The command's exit status once the status frame came; None before."""
        if self.status is None:
            return None
        if self.status.get("status") == "Success":
            return 0
        details = self.status.get("details")
        if isinstance(details, dict):
            for cause in details.get("causes") or []:
                if isinstance(cause, dict) and cause.get("reason") == "ExitCode":
                    try:
                        return int(str(cause.get("message")))
                    except ValueError:
                        break
        # kwok's local exec (the test cluster) reports a non-zero exit as an
        # InternalError "... exit status N" instead of the kubelet's ExitCode cause.
        found = _EXIT_STATUS.search(str(self.status.get("message") or ""))
        return int(found.group(1)) if found else None

    @property
    def failure(self) -> str:
        """Why the exec did not succeed, from the status frame; '' on success or before the frame."""
        if self.status is None or self.status.get("status") == "Success":
            return ""
        return str(self.status.get("message") or self.status.get("reason") or "exec failed")

    async def close(self) -> None:
        """Closes the socket (ending the exec's stream); closing again does nothing."""
        if not self._closed:
            self._closed = True
            await self._ws.close()
