"""What the fake backend answers to the snapshot helper scripts of
sandboxd.backends.snapshot_shell (it has no real shell): a workspace listing
in the ``find -printf`` format, a session's cwd and environment, and the
restore script's mode fix-ups, cutoff, environment and cwd."""

from __future__ import annotations

import io
import posixpath
import re
import tarfile
import time
from typing import Protocol

from sandboxd.backends.base import WORKSPACE
from sandboxd.backends.snapshot_shell import (
    DELTA_MARKER,
    LIST_MARKER,
    RECORDS_MARKER,
    RESTORE_MARKER,
    SESSION_STATE_MARKER,
    STATE_DELTA_MARKER,
    STATE_MARKER,
    TAR_MARKER,
)

_ASSIGN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=\$'((?:[^'\\]|\\.)*)'")
_CD = re.compile(r"^cd -- \$'((?:[^'\\]|\\.)*)'", re.MULTILINE)
_SINCE = re.compile(r"-newerct '@([0-9.]+)'")


class _Box(Protocol):
    files: dict[str, tuple[bytes, int]]
    dirs: set[str]
    links: dict[str, str]
    dir_modes: dict[str, int]
    stamps: dict[str, float]
    user: tuple[int, int]


class _ShellState(Protocol):
    cwd: str
    env: dict[str, str]


def _unquote(body: str) -> str:
    """Decodes the inside of a $'...' word made by shell.ansi_c_quote."""
    out = bytearray()
    i = 0
    while i < len(body):
        ch = body[i]
        if ch == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            if nxt == "x":
                out.append(int(body[i + 2 : i + 4], 16))
                i += 4
                continue
            out += nxt.encode()
            i += 2
            continue
        out += ch.encode()
        i += 1
    return out.decode("utf-8", "surrogateescape")


def _entries(box: _Box) -> list[tuple[str, str, int, int, str]]:
    records: list[tuple[str, str, int, int, str]] = []
    for d in box.dirs:
        if d.startswith(WORKSPACE + "/"):  # a snapshot is the workspace: not /tmp
            records.append((d, "d", box.dir_modes.get(d, 0o755), 4096, ""))
    for p, (content, mode) in box.files.items():
        if p.startswith(WORKSPACE + "/"):
            records.append((p, "f", mode, len(content), ""))
    for p, target in box.links.items():
        records.append((p, "l", 0o777, len(target), target))
    return sorted(records)


def _record(box: _Box, path: str, kind: str, mode: int, size: int, target: str) -> bytes:
    stamp = f"{box.stamps.get(path, 0.0):.10f}"
    rel = posixpath.relpath(path, WORKSPACE)
    uid, gid = box.user  # the fake keeps no owners: everything is the sandbox user's
    return f"{kind} {mode & 0o7777:o} {size} {stamp} {stamp} {uid} {gid}\x00{rel}\x00{target}\x00".encode()


def _now() -> bytes:
    return f"{time.time():.9f}".encode() + b"\x00"


def listing(box: _Box) -> bytes:
    """LIST_SCRIPT's output: the clock now, then a record per entry of the workspace (never /tmp)."""
    return _now() + b"".join(_record(box, *r) for r in _entries(box))


def delta_listing(box: _Box, since: float) -> bytes:
    """delta_script's output: "R" + a record for what changed after
    ``since``, "N" + the name of everything else."""
    out = [_now()]
    for r in _entries(box):
        if box.stamps.get(r[0], 0.0) > since:
            out.append(b"R" + _record(box, *r))
        else:
            out.append(b"N" + posixpath.relpath(r[0], WORKSPACE).encode() + b"\x00")
    return b"".join(out)


def records_of(box: _Box, rels: list[str]) -> bytes:
    """RECORDS_SCRIPT's output: the clock now, then a record for each of ``rels`` that exists."""
    by_path = {r[0]: r for r in _entries(box)}
    found = [by_path[p] for p in (posixpath.join(WORKSPACE, r) for r in rels) if p in by_path]
    return _now() + b"".join(_record(box, *r) for r in found)


def _state(shell: _ShellState) -> bytes:
    """What the state script prints: cwd, then each NAME=value, NUL-terminated, then a NUL
    (any bytes, as a shell holds them)."""
    env = "".join(f"{k}={v}\x00" for k, v in shell.env.items())
    return f"{shell.cwd}\x00{env}\x00".encode("utf-8", "surrogateescape")


def emulate(box: _Box, shell: _ShellState, script: str, stdin: bytes) -> bytes | None:
    """The output of a snapshot helper script, or None for any other command."""
    if script.startswith(LIST_MARKER):
        return listing(box)
    if script.startswith((DELTA_MARKER, STATE_DELTA_MARKER)):
        since = _SINCE.search(script)
        assert since is not None, script
        body = delta_listing(box, float(since.group(1)))
        if script.startswith(DELTA_MARKER):
            return body
        return _state(shell) + body
    if script.startswith(RECORDS_MARKER):
        return records_of(box, [r.decode("utf-8", "surrogateescape") for r in stdin.split(b"\x00")[:-1]])
    if script.startswith(STATE_MARKER):
        return _state(shell) + listing(box)
    if script.startswith(SESSION_STATE_MARKER):
        return _state(shell)
    if script.startswith(TAR_MARKER):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for rel in stdin.split(b"\x00")[:-1]:
                name = rel.decode("utf-8", "surrogateescape")
                content, mode = box.files[posixpath.join(WORKSPACE, name)]
                info = tarfile.TarInfo(name)
                info.size, info.mode = len(content), mode
                tar.addfile(info, io.BytesIO(content))
        return buf.getvalue()
    if not script.startswith(RESTORE_MARKER):
        return None
    fields = stdin.split(b"\x00")
    for octal, rel in zip(fields[0:-1:2], fields[1::2], strict=False):
        path = posixpath.join(WORKSPACE, rel.decode("utf-8", "surrogateescape"))
        if path in box.files:
            box.files[path] = (box.files[path][0], int(octal, 8))
        elif path in box.dirs:
            box.dir_modes[path] = int(octal, 8)
    out = f"{time.time():.9f}".encode() + b"\x00"
    for line in script.splitlines():
        if line.startswith("for __sbxd_v in"):
            shell.env.clear()
        if line.startswith("export "):
            shell.env.update({k: _unquote(v) for k, v in _ASSIGN.findall(line)})
    cd = _CD.search(script)
    if cd and posixpath.normpath(_unquote(cd.group(1))) in box.dirs:
        shell.cwd = posixpath.normpath(_unquote(cd.group(1)))
    return out
