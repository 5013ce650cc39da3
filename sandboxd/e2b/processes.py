"""envd's process service over sandboxd's exec: Start, Connect, List,
SendSignal, SendInput and CloseStdin.

A process is one streamed sandboxd exec, run by a task of this server, so a
client's stream can close (a background command, ``disconnect``) while the
command runs on; ``Connect`` subscribes another stream to it. The stream's
``connect-timeout-ms`` is the command's timeout, as in envd: when it passes,
the command is killed and the stream ends ``deadline_exceeded``, which the
SDK raises as ``TimeoutException``. Kill cancels the exec, which kills the
command's process tree in the sandbox.

Stdin (``stdin=True``): the command reads a FIFO in the sandbox that a shell
wrapper holds open for writing; SendInput appends to it through a short exec,
CloseStdin makes the wrapper drop its writer, so the command sees EOF."""

from __future__ import annotations

import asyncio
import shlex
from typing import Any

from sandboxd import errors
from sandboxd.client import ExecResult
from sandboxd.e2b.connect import ConnectError, b64, code_for, unb64
from sandboxd.e2b.pty import pty_size, pty_wrapped, resize_argv
from sandboxd.e2b.registry import Box

__all__ = ["NO_LIMIT", "Proc", "end_event", "exec_user", "process_config", "start_process"]

NO_LIMIT = 6 * 3600.0
"""The exec timeout of a command started with no timeout: sandboxd's longest."""

_STDIN_DIR = "/tmp/.e2b-stdin"
# A stdin call made as the command starts waits (10 s at most) for its
# wrapper to hold the FIFO; exit 3 = the command is gone.
_READY = 'for _ in $(seq 200); do [ -f "$1.pid" ] && break; sleep 0.05; done; [ -f "$1.pid" ] || exit 3; '


def exec_user(user: str) -> str:
    """sandboxd's exec user for an E2B user: root is root; any other name
    (E2B's "user") is the sandbox's own unprivileged user."""
    return "root" if user == "root" else ""


def process_config(message: dict[str, Any]) -> tuple[list[str], dict[str, str], str]:
    """(argv, envs, cwd) of a ProcessConfig message, checked."""
    config = message.get("process")
    if not isinstance(config, dict):
        raise ConnectError("invalid_argument", "process config is required")
    cmd = config.get("cmd")
    args = config.get("args", [])
    envs = config.get("envs", {})
    cwd = config.get("cwd", "")
    if not isinstance(cmd, str) or not cmd:
        raise ConnectError("invalid_argument", "process.cmd must be a non-empty string")
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ConnectError("invalid_argument", "process.args must be a list of strings")
    if not isinstance(envs, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in envs.items()
    ):
        raise ConnectError("invalid_argument", "process.envs must map strings to strings")
    if not isinstance(cwd, str):
        raise ConnectError("invalid_argument", "process.cwd must be a string")
    return [cmd, *args], dict(envs), cwd


def end_event(result: ExecResult) -> dict[str, Any] | ConnectError:
    """The end of a command as envd reports it, or the error that ends its
    stream instead: a timed-out command is ``deadline_exceeded`` and a lost
    sandbox ``aborted`` (never an exit code)."""
    if result.outcome == "TIMED_OUT":
        return ConnectError("deadline_exceeded", "command timed out and was killed")
    if result.outcome == "SANDBOX_LOST":
        return ConnectError("aborted", f"sandbox lost under the command: {result.detail or 'it is gone'}")
    if result.outcome == "OUTPUT_TRUNCATED":
        return ConnectError("out_of_range", "command output passed the server's limit; it was killed")
    if result.outcome == "EXITED":
        end: dict[str, Any] = {
            "exitCode": result.exit_code,
            "exited": True,
            "status": f"exit status {result.exit_code}",
        }
    else:  # KILLED, OOM_KILLED, PIDS_EXHAUSTED: ended by a signal
        end = {"exitCode": -1, "exited": False, "status": "signal: killed"}
        if result.outcome != "KILLED":
            end["error"] = result.outcome.lower().replace("_", " ") + (
                f": {result.detail}" if result.detail else ""
            )
    return {"event": {"end": end}}


class Proc:
    """One running command and the streams that follow it."""

    def __init__(
        self,
        box: Box,
        pid: int,
        config: dict[str, Any],
        tag: str,
        stdin: bool,
        pty: tuple[int, int] | None = None,
    ) -> None:
        self.box = box
        self.pid = pid
        self.config = config
        self.tag = tag
        self.pty = pty
        """(rows, cols) of a PTY session's terminal; None = plain pipes."""
        self.stdin = stdin or pty is not None
        self.fifo = f"{_STDIN_DIR}/{box.id}-{pid}" if self.stdin else ""
        self.user = ""
        self._subscribers: set[asyncio.Queue[dict[str, Any] | ConnectError]] = set()
        self._task: asyncio.Task[None] | None = None
        self.done = asyncio.Event()

    def subscribe(self) -> asyncio.Queue[dict[str, Any] | ConnectError]:
        queue: asyncio.Queue[dict[str, Any] | ConnectError] = asyncio.Queue()
        self._subscribers.add(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[dict[str, Any] | ConnectError]) -> None:
        self._subscribers.discard(queue)

    def _publish(self, item: dict[str, Any] | ConnectError) -> None:
        for queue in self._subscribers:
            queue.put_nowait(item)

    def start(self, argv: list[str], envs: dict[str, str], cwd: str, user: str, timeout: float) -> None:
        self.user = user
        self._task = asyncio.create_task(self._run(argv, envs, cwd, user, timeout))

    def _wrapped(self, argv: list[str]) -> list[str]:
        if self.pty is not None:
            return pty_wrapped(self.fifo, _STDIN_DIR, argv, *self.pty)
        if not self.stdin:
            return argv
        # The wrapper holds the FIFO open read-write (fd 3), so the command's
        # reads block rather than end until CloseStdin signals it (USR1) to
        # close it; SendInput's writers come and go meanwhile.
        fifo = shlex.quote(self.fifo)
        # The trap is set before anything can signal, and the pid file, which
        # SendInput and CloseStdin wait for, is written once the FIFO is held.
        script = (
            f"trap 'exec 3>&-' USR1; mkdir -p {_STDIN_DIR} && chmod 1777 {_STDIN_DIR} 2>/dev/null; "
            f"mkfifo -m 666 {fifo} || exit 125; exec 3<>{fifo}; "
            f'"$@" < {fifo} 3>&- & child=$!; echo $$ > {fifo}.pid; '
            # A trapped signal interrupts wait; the last wait, once the
            # command has ended, gives its own status.
            "while kill -0 $child 2>/dev/null; do wait $child; done; wait $child; rc=$?; "
            f"rm -f {fifo} {fifo}.pid; exit $rc"
        )
        return ["/bin/bash", "-c", script, "e2b-stdin", *argv]

    async def _run(self, argv: list[str], envs: dict[str, str], cwd: str, user: str, timeout: float) -> None:
        client, sandbox_id = self.box.client, self.box.sandbox_id
        try:
            async for kind, value in client.exec_stream(
                sandbox_id,
                self._wrapped(argv),
                cwd=cwd,
                env={**self.box.envs, **envs},
                timeout=timeout or NO_LIMIT,
                user=exec_user(user),
            ):
                if kind in ("stdout", "stderr"):
                    # A terminal has one output: what the session's stdout carries.
                    stream = "pty" if self.pty is not None else kind
                    self._publish({"event": {"data": {stream: b64(value)}}})
                elif kind == "result":
                    self._publish(end_event(value))
        except asyncio.CancelledError:
            self._publish({"event": {"end": {"exitCode": -1, "exited": False, "status": "signal: killed"}}})
            raise
        except errors.SandboxdError as e:
            self._publish(ConnectError(code_for(e), str(e)))
        finally:
            self.box.processes.pop(self.pid, None)
            self.done.set()

    def cancel(self) -> None:
        """Kills the command (and, with it, its exec)."""
        if self._task is not None and not self._task.done():
            self._task.cancel()

    async def kill(self) -> None:
        self.cancel()
        await self.done.wait()

    async def send_input(self, data: bytes) -> None:
        if not self.stdin:
            raise ConnectError("failed_precondition", f"process {self.pid} was not started with stdin")
        script = _READY + 'cat >> "$1"'
        await self._stdin_exec(["/bin/bash", "-c", script, "send", self.fifo], data)

    async def close_stdin(self) -> None:
        if not self.stdin:
            raise ConnectError("failed_precondition", f"process {self.pid} was not started with stdin")
        script = _READY + 'kill -USR1 "$(cat "$1.pid")"'
        await self._stdin_exec(["/bin/bash", "-c", script, "close", self.fifo], b"")

    async def resize(self, rows: int, cols: int) -> None:
        """Gives a PTY session's terminal a new size."""
        if self.pty is None:
            raise ConnectError("failed_precondition", f"process {self.pid} has no terminal to resize")
        await self._stdin_exec(resize_argv(self.fifo, rows, cols), b"")
        self.pty = (rows, cols)

    async def _stdin_exec(self, argv: list[str], data: bytes) -> None:
        if self.done.is_set():
            raise ConnectError("not_found", f"process {self.pid} has ended")
        try:
            result = await self.box.client.exec(
                self.box.sandbox_id, argv, stdin=data, timeout=30.0, user=exec_user(self.user)
            )
        except errors.SandboxdError as e:
            raise ConnectError(code_for(e), str(e)) from e
        if result.exit_code == 3:
            raise ConnectError("not_found", f"process {self.pid} has ended or closed its stdin")
        if not result.ok:
            raise ConnectError("unknown", f"stdin of process {self.pid}: {result.stderr[:200]!r}")


def start_process(box: Box, message: dict[str, Any], user: str, timeout: float) -> Proc:
    """Starts a Start request's command in ``box``."""
    argv, envs, cwd = process_config(message)
    pty = pty_size(message) if message.get("pty") else None
    tag = message.get("tag", "")
    stdin = message.get("stdin", False)
    if not isinstance(tag, str) or not isinstance(stdin, bool):
        raise ConnectError("invalid_argument", "tag must be a string and stdin a boolean")
    config: dict[str, Any] = {"cmd": argv[0], "args": argv[1:], "envs": envs, "cwd": cwd}
    proc = Proc(box, box.new_pid(), config, tag, stdin, pty)
    box.processes[proc.pid] = proc
    proc.start(argv, envs, cwd, user, timeout)
    return proc


def input_bytes(message: dict[str, Any]) -> bytes:
    """The bytes of a SendInput request, for a command's stdin or a PTY's
    keyboard (both reach the one input the process has)."""
    given = message.get("input")
    if not isinstance(given, dict):
        raise ConnectError("invalid_argument", "input is required")
    raw = given.get("pty", given.get("stdin", ""))
    if not isinstance(raw, str):
        raise ConnectError("invalid_argument", "input.stdin and input.pty must be base64 text")
    return unb64(raw)


def selected_pid(message: dict[str, Any]) -> tuple[int, str]:
    """(pid, tag) a ProcessSelector names; one of them is set."""
    selector = message.get("process")
    if not isinstance(selector, dict):
        raise ConnectError("invalid_argument", "process selector is required")
    pid = selector.get("pid", 0)
    tag = selector.get("tag", "")
    if not isinstance(pid, int) or not isinstance(tag, str) or (not pid and not tag):
        raise ConnectError("invalid_argument", "process selector needs a pid or a tag")
    return pid, tag


def find_process(box: Box, message: dict[str, Any]) -> Proc:
    pid, tag = selected_pid(message)
    for proc in box.processes.values():
        if (pid and proc.pid == pid) or (tag and proc.tag == tag):
            return proc
    raise ConnectError("not_found", f"process {pid or tag} not found")
