"""envd's filesystem, through sandboxd's exec: the bytes of /files (read,
write one or many) and the Filesystem service's Stat, ListDir, MakeDir, Move
and Remove, each one short command in the sandbox as the caller's user.

Exec rather than sandboxd's file calls because E2B paths are anywhere the
user may write (its home, absolute paths), while sandboxd's file calls keep
to the workspace and /tmp. Entries are described by GNU find's -printf.

Writes and MakeDir do as envd does where sandboxd can: envd runs as root,
so it creates files and directories anywhere the filesystem allows, for any
user (a Harbor task writes /solution, /tests and /logs as E2B's default
"user"). One the caller's user may not make is made by root instead, and is
then root's: sandboxd's root has no capabilities, so it cannot hand the
file to the user as envd does, nor write where the modes refuse root as well
(a directory only its owner, the user, may write)."""

from __future__ import annotations

import datetime as dt
import posixpath
from typing import Any

from sandboxd import errors
from sandboxd.client import ExecResult
from sandboxd.e2b.connect import ConnectError, code_for
from sandboxd.e2b.processes import exec_user
from sandboxd.e2b.registry import Box

__all__ = ["entry_from_line", "list_dir", "make_dir", "move", "read_file", "remove", "stat", "write_file"]

_FORMAT = r"%p\0%y\0%s\0%m\0%M\0%u\0%g\0%T@\0%l\n"
_MAX_DEPTH = 64
_NOT_FOUND = 44
_EXISTS = 45
_NOT_DIR = 46
_OP_TIMEOUT = 60.0
_MAX_READ = 32 << 20
"""The largest file read: sandboxd's default cap on an exec's output."""


def _shell(script: str, *args: str) -> list[str]:
    return ["/bin/bash", "-c", script, "e2b-fs", *args]


async def _run(box: Box, user: str, argv: list[str], stdin: bytes = b"", what: str = "") -> ExecResult:
    try:
        result = await box.client.exec(
            box.sandbox_id,
            argv,
            stdin=stdin,
            user=exec_user(user),
            timeout=_OP_TIMEOUT,
            output_limit=_MAX_READ,
        )
    except errors.SandboxdError as e:
        raise ConnectError(code_for(e), str(e)) from e
    if result.outcome == "SANDBOX_LOST":
        raise ConnectError("aborted", f"sandbox lost under {what}")
    if result.outcome != "EXITED":
        raise ConnectError("unknown", f"{what}: {result.outcome.lower()} {result.detail}".strip())
    if result.exit_code == _NOT_FOUND:
        raise ConnectError("not_found", f"{what}: no such file or directory")
    if result.exit_code == _EXISTS:
        raise ConnectError("already_exists", f"{what}: already exists")
    if result.exit_code == _NOT_DIR:
        raise ConnectError("invalid_argument", f"{what}: not a directory")
    if result.exit_code != 0:
        message = result.stderr.decode(errors="replace").strip()[:300]
        lowered = message.lower()
        if "permission denied" in lowered:
            raise ConnectError("permission_denied", f"{what}: {message}")
        if "is a directory" in lowered or "not a directory" in lowered:
            raise ConnectError("invalid_argument", f"{what}: {message}")
        raise ConnectError("unknown", f"{what}: {message or f'exit {result.exit_code}'}")
    return result


async def _run_or_as_root(box: Box, user: str, argv: list[str], stdin: bytes, what: str) -> ExecResult:
    """Runs as ``user``; where its permissions refuse, runs again as root."""
    try:
        return await _run(box, user, argv, stdin, what)
    except ConnectError as e:
        if e.code != "permission_denied" or exec_user(user) == "root":
            raise
    return await _run(box, "root", argv, stdin, what)


def _types(kind: str) -> str:
    return {"d": "FILE_TYPE_DIRECTORY", "f": "FILE_TYPE_FILE"}.get(kind, "FILE_TYPE_UNSPECIFIED")


def entry_from_line(line: bytes) -> dict[str, Any]:
    """An EntryInfo message (proto3 JSON) from one line of ``_FORMAT``."""
    fields = line.decode(errors="replace").split("\0")
    if len(fields) != 9:
        raise ConnectError("unknown", f"unreadable entry description: {line[:200]!r}")
    path, kind, size, mode, perms, owner, group, mtime, target = fields
    try:
        stamp = dt.datetime.fromtimestamp(float(mtime), dt.UTC)
        mode_bits = int(mode, 8)
    except ValueError as e:
        raise ConnectError("unknown", f"unreadable entry description: {line[:200]!r}") from e
    entry: dict[str, Any] = {
        "name": posixpath.basename(path.rstrip("/")) or "/",
        "type": _types(kind),
        "path": path,
        "size": size,
        "mode": mode_bits,
        "permissions": perms,
        "owner": owner,
        "group": group,
        "modifiedTime": stamp.isoformat().replace("+00:00", "Z"),
    }
    if kind == "l":
        entry["symlinkTarget"] = target
        entry["type"] = "FILE_TYPE_FILE"
    return entry


def _path(message: dict[str, Any], field: str = "path") -> str:
    path = message.get(field)
    if not isinstance(path, str) or not path:
        raise ConnectError("invalid_argument", f"{field} must be a non-empty string")
    if "\0" in path:
        raise ConnectError("invalid_argument", f"{field} must not contain NUL")
    return path


_EXISTS_OR_44 = f'[ -e "$1" ] || [ -L "$1" ] || exit {_NOT_FOUND}; '
_STAT = _EXISTS_OR_44 + 'p=$(realpath -s -- "$1"); find "$p" -maxdepth 0 -printf "$2"'


async def stat(box: Box, user: str, message: dict[str, Any]) -> dict[str, Any]:
    path = _path(message)
    result = await _run(box, user, _shell(_STAT, path, _FORMAT), what=f"stat {path}")
    return {"entry": entry_from_line(result.stdout.rstrip(b"\n"))}


async def list_dir(box: Box, user: str, message: dict[str, Any]) -> dict[str, Any]:
    path = _path(message)
    depth = message.get("depth", 1)
    if not isinstance(depth, int) or depth < 1 or depth > _MAX_DEPTH:
        raise ConnectError("invalid_argument", f"depth must be an integer from 1 to {_MAX_DEPTH}")
    script = (
        f'[ -e "$1" ] || exit {_NOT_FOUND}; [ -d "$1" ] || exit {_NOT_DIR}; p=$(realpath -s -- "$1"); '
        'find "$p" -mindepth 1 -maxdepth "$3" -printf "$2"'
    )
    result = await _run(box, user, _shell(script, path, _FORMAT, str(depth)), what=f"list {path}")
    lines = [line for line in result.stdout.split(b"\n") if line]
    return {"entries": [entry_from_line(line) for line in lines]}


async def make_dir(box: Box, user: str, message: dict[str, Any]) -> dict[str, Any]:
    path = _path(message)
    script = f'[ -e "$1" ] && exit {_EXISTS}; mkdir -p -- "$1" || exit 1; ' + _STAT
    result = await _run_or_as_root(box, user, _shell(script, path, _FORMAT), b"", f"make dir {path}")
    return {"entry": entry_from_line(result.stdout.rstrip(b"\n"))}


async def move(box: Box, user: str, message: dict[str, Any]) -> dict[str, Any]:
    source, destination = _path(message, "source"), _path(message, "destination")
    script = (
        _EXISTS_OR_44 + 'mkdir -p -- "$(dirname -- "$3")" && mv -T -- "$1" "$3" && '
        'p=$(realpath -s -- "$3"); find "$p" -maxdepth 0 -printf "$2"'
    )
    result = await _run(box, user, _shell(script, source, _FORMAT, destination), what=f"move {source}")
    return {"entry": entry_from_line(result.stdout.rstrip(b"\n"))}


async def remove(box: Box, user: str, message: dict[str, Any]) -> dict[str, Any]:
    path = _path(message)
    script = _EXISTS_OR_44 + 'rm -rf -- "$1"'
    await _run(box, user, _shell(script, path), what=f"remove {path}")
    return {}


async def read_file(box: Box, user: str, path: str) -> bytes:
    script = _EXISTS_OR_44 + '[ -d "$1" ] && { echo "$1: is a directory" >&2; exit 1; }; cat -- "$1"'
    result = await _run(box, user, _shell(script, path), what=f"read {path}")
    return result.stdout


async def write_file(box: Box, user: str, path: str, data: bytes) -> dict[str, Any]:
    """Writes ``data`` to ``path`` (its directories made), answering the
    written entry as /files does."""
    script = 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1" && realpath -s -- "$1"'
    result = await _run_or_as_root(box, user, _shell(script, path), data, f"write {path}")
    full = result.stdout.decode(errors="replace").strip() or path
    return {"name": posixpath.basename(full), "type": "file", "path": full}
