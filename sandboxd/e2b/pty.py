"""envd's PTY sessions (``sandbox.pty``) over sandboxd's exec, which has no
terminal of its own: util-linux ``script`` (in every Debian image) gives the
command a pseudo-terminal in the sandbox and copies its output to the exec's
stdout, which becomes envd's ``pty`` data. Input reaches it as a stdin
command's does (a FIFO a wrapper holds open); a resize sets the terminal's
size with ``stty`` on its device, recorded when the session starts, which
the kernel follows with SIGWINCH to the terminal's foreground processes."""

from __future__ import annotations

import shlex
from typing import Any

from sandboxd.e2b.connect import ConnectError

__all__ = ["MAX_SIDE", "pty_size", "pty_wrapped", "resize_argv"]

MAX_SIDE = 10_000
"""The most rows or columns a terminal may be given."""

_READY = 'for _ in $(seq 200); do [ -s "$1.tty" ] && break; sleep 0.05; done; [ -s "$1.tty" ] || exit 3; '


def pty_size(message: dict[str, Any]) -> tuple[int, int]:
    """(rows, cols) of a Start or Update request's ``pty.size``."""
    pty = message.get("pty")
    size = pty.get("size") if isinstance(pty, dict) else None
    if not isinstance(size, dict):
        raise ConnectError("invalid_argument", "pty.size (rows and cols) is required")
    rows, cols = size.get("rows", 0), size.get("cols", 0)
    for name, value in (("rows", rows), ("cols", cols)):
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_SIDE:
            raise ConnectError("invalid_argument", f"pty.size.{name} must be an integer from 1 to {MAX_SIDE}")
    return rows, cols


def pty_wrapped(fifo: str, stdin_dir: str, argv: list[str], rows: int, cols: int) -> list[str]:
    """The exec that runs ``argv`` on a terminal of ``rows`` x ``cols``,
    reading the FIFO ``fifo`` as its keyboard."""
    q = shlex.quote(fifo)
    # Inside the terminal: record its device (for resizes), size it, run the command.
    inner = f"tty > {q}.tty; stty rows {rows} cols {cols}; exec {shlex.join(argv)}"
    script = (
        f"trap 'exec 3>&-' USR1; mkdir -p {stdin_dir} && chmod 1777 {stdin_dir} 2>/dev/null; "
        f"mkfifo -m 666 {q} || exit 125; exec 3<>{q}; "
        # -e: the command's own exit status; -f: output as it comes.
        f'script -qfe -c "$1" /dev/null < {q} 3>&- & child=$!; echo $$ > {q}.pid; '
        "while kill -0 $child 2>/dev/null; do wait $child; done; wait $child; rc=$?; "
        f"rm -f {q} {q}.pid {q}.tty; exit $rc"
    )
    return ["/bin/bash", "-c", script, "e2b-pty", inner]


def resize_argv(fifo: str, rows: int, cols: int) -> list[str]:
    """The exec that resizes the terminal of the session reading ``fifo``;
    exit 3 = the session is gone."""
    script = _READY + f'stty -F "$(cat "$1.tty")" rows {rows} cols {cols}'
    return ["/bin/bash", "-c", script, "resize", fifo]
