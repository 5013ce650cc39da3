"""Small uploads written into a sandbox's workspace from the host, where the
control plane sees it (sandboxd.backends.hostfs): no process in the sandbox.

Through the sandbox an upload of one small file forks about a dozen
processes there (the extraction script's tar, mktemp, mv and subshells),
which under load took hundreds of milliseconds; from the host it is a few
system calls. The result must be what the in-sandbox extraction makes, so
this writes only the plain case and says so: every directory on the way is
a real directory (or missing, then made as the sandbox's user with mode
0755) and no file's place is a directory. Anything else (a link on the
way, a directory in a file's place, a path that changed meanwhile) answers
False before anything is written, and the caller extracts through the
sandbox, which refuses or merges exactly as it always has.

Each file is written to a fresh name beside its place, owned by the
sandbox's user with the mode a non-root tar gives it (umask 022), and
renamed over what was there: a link in its place is replaced, never
written through. Nothing is resolved from the top: every directory is
opened relative to its parent with O_NOFOLLOW.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Sequence

from sandboxd.errors import ResourceExhausted

InPlaceFile = tuple[str, bytes, int]
"""(path relative to the workspace, content, permission bits)."""

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
# What the sandbox's shell (and so its tar) applies to what it creates.
_UMASK = 0o022
_FULL = (errno.ENOSPC, errno.EDQUOT)


class _Fallback(Exception):
    """Not the plain case: the sandbox extracts it instead."""


def write_files(root: int, files: Sequence[InPlaceFile], uid: int, gid: int) -> bool:
    """Writes ``files`` below the workspace directory ``root``; False, with
    nothing written, when they are not the plain case (see the module
    docstring). All or nothing, as the extraction: every file is written
    beside its place first and renamed into it only once all are;
    ResourceExhausted (nothing changed) when the workspace is full."""
    try:
        for rel, _, _ in files:
            _check(root, rel)
    except _Fallback:
        return False
    staged = _Staged()
    try:
        for rel, data, mode in files:
            staged.add(root, rel, data, mode & 0o777 & ~_UMASK, uid, gid)
    except _Fallback:
        # Changed under us: the sandbox's extraction does it instead.
        staged.undo()
        return False
    except BaseException:
        staged.undo()
        raise
    staged.commit()
    return True


def _parts(rel: str) -> list[str]:
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise _Fallback()
    return parts


def _check(root: int, rel: str) -> None:
    """Raises _Fallback unless every directory on the way is a real one or
    missing, and the file's place is not a directory."""
    *dirs, name = _parts(rel)
    cur = os.dup(root)
    try:
        for part in dirs:
            try:
                st = os.stat(part, dir_fd=cur, follow_symlinks=False)
            except FileNotFoundError:
                return  # the rest is made
            except OSError as e:
                raise _Fallback() from e
            if not stat.S_ISDIR(st.st_mode):
                raise _Fallback()
            nxt = _open_dir(part, cur)
            os.close(cur)
            cur = nxt
        try:
            st = os.stat(name, dir_fd=cur, follow_symlinks=False)
        except FileNotFoundError:
            return
        except OSError as e:
            raise _Fallback() from e
        if stat.S_ISDIR(st.st_mode):
            raise _Fallback()
    finally:
        os.close(cur)


def _open_dir(part: str, parent: int) -> int:
    try:
        return os.open(part, _DIR, dir_fd=parent)
    except OSError as e:
        raise _Fallback() from e


class _Staged:
    """Files written beside their places, and the directories made for
    them, until commit() renames them in or undo() removes it all."""

    def __init__(self) -> None:
        self._files: list[tuple[int, str, str]] = []
        """(parent directory, temporary name, name)."""
        self._dirs: list[tuple[int, str]] = []
        """(parent directory, name) of directories made, in order."""

    def add(self, root: int, rel: str, data: bytes, mode: int, uid: int, gid: int) -> None:
        *dirs, name = _parts(rel)
        cur = os.dup(root)
        try:
            for part in dirs:
                nxt = self._enter(cur, part, uid, gid)
                os.close(cur)
                cur = nxt
            temp = self._write(cur, data, mode, uid, gid)
        except BaseException:
            os.close(cur)
            raise
        # Kept open for commit() or undo().
        self._files.append((cur, temp, name))

    def _enter(self, parent: int, part: str, uid: int, gid: int) -> int:
        try:
            os.mkdir(part, 0o700, dir_fd=parent)
        except FileExistsError:
            return _open_dir(part, parent)
        except OSError as e:
            _raise_if_full(e)
            raise _Fallback() from e
        self._dirs.append((os.dup(parent), part))
        made = _open_dir(part, parent)
        try:
            os.fchown(made, uid, gid)
            os.fchmod(made, 0o755)
        except OSError as e:
            os.close(made)
            raise _Fallback() from e
        return made

    @staticmethod
    def _write(parent: int, data: bytes, mode: int, uid: int, gid: int) -> str:
        temp = f".sandboxd-put.{secrets.token_hex(6)}"
        try:
            fd = os.open(temp, _NEW, 0o600, dir_fd=parent)
        except OSError as e:
            _raise_if_full(e)
            raise _Fallback() from e
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fchown(fd, uid, gid)
            os.fchmod(fd, mode)
        except OSError as e:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=parent)
            _raise_if_full(e)
            raise _Fallback() from e
        finally:
            os.close(fd)
        return temp

    def commit(self) -> None:
        """Renames every staged file over its place (a link there is
        replaced, never followed)."""
        try:
            for parent, temp, name in self._files:
                os.rename(temp, name, src_dir_fd=parent, dst_dir_fd=parent)
        finally:
            self._close()

    def undo(self) -> None:
        """Removes the staged files and the directories made for them."""
        for parent, temp, _ in self._files:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=parent)
        for parent, name in reversed(self._dirs):
            with contextlib.suppress(OSError):
                os.rmdir(name, dir_fd=parent)
        self._close()

    def _close(self) -> None:
        for fd in {parent for parent, _, _ in self._files} | {parent for parent, _ in self._dirs}:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._files, self._dirs = [], []


def _raise_if_full(e: OSError) -> None:
    if e.errno in _FULL:
        raise ResourceExhausted(f"workspace is full (bytes or files): {os.strerror(e.errno or 0)}") from e
