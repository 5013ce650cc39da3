"""Small uploads written into a sandbox's workspace from the host, where the
control plane sees it (sandboxd.backends.hostfs): no process in the sandbox.

Through the sandbox an upload of one small file forks about a dozen
processes there (the extraction script's tar, mktemp, mv and subshells),
which under load took hundreds of milliseconds; from the host it is a few
system calls. The result, and every refusal, must be what the in-sandbox
extraction gives, so:

- Everything is done with the sandbox user's file rights
  (sandboxd.backends.fscreds): the kernel allows exactly what the user may
  do inside the sandbox (owner, mode, search and write on directories,
  sticky directories), and what is made is the user's without a chown.
  Refusals are PermissionDenied naming the path; a directory where a file
  goes is FailedPrecondition; a full workspace is ResourceExhausted.
- Nothing is resolved from the top: every directory is opened relative to
  its parent with O_NOFOLLOW|O_DIRECTORY, and only a directory just made
  (and found to be the user's) gets its mode set. A link on the way, or a
  path that changes under us, answers False with nothing changed, and the
  caller extracts through the sandbox, which refuses links as it always
  has.
- All or nothing: every file is first written to a fresh name beside its
  place (where the user must be able to create it anyway), then moved in
  with renameat2: RENAME_NOREPLACE for a new name, RENAME_EXCHANGE over an
  existing one so the old file can be put back. Any failure undoes every
  move and removes every fresh name and every directory made.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import posixpath
import secrets
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NoReturn

from sandboxd.backends import fscreds
from sandboxd.backends.layout import WORKSPACE
from sandboxd.errors import FailedPrecondition, PermissionDenied, ResourceExhausted

InPlaceFile = tuple[str, bytes, int]
"""(path relative to the workspace, content, permission bits)."""

# O_PATH: entering a directory needs search permission only, as in the
# sandbox (a write-and-search-only drop box can be written to).
_DIR = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
# What the sandbox's shell (and so its tar) applies to what it creates.
_UMASK = 0o022
_FULL = (errno.ENOSPC, errno.EDQUOT)
_DENIED = (errno.EACCES, errno.EPERM, errno.EROFS)
_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2
TEMP_PREFIX = ".sandboxd-put."

_libc = ctypes.CDLL(None, use_errno=True)


class _Fallback(Exception):
    """Not the plain case, or changed under us: the sandbox extracts it."""


def write_files(root: int, files: Sequence[InPlaceFile], uid: int, gid: int) -> bool:
    """Writes ``files`` below the workspace directory ``root`` as the user
    ``uid``:``gid``; False, with nothing changed, when they are not the
    plain case or this process cannot take the user's rights (see the
    module docstring). Raises PermissionDenied, FailedPrecondition or
    ResourceExhausted with nothing changed."""
    if not fscreds.available():
        return False
    return fscreds.run_as(uid, gid, _write_all, root, files, uid)


def _write_all(root: int, files: Sequence[InPlaceFile], uid: int) -> bool:
    call = _Call(root, uid)
    try:
        for rel, data, mode in files:
            call.stage(rel, data, mode & 0o777 & ~_UMASK)
        call.commit()
    except _Fallback:
        call.undo()
        return False
    except BaseException:
        call.undo()
        raise
    call.finish()
    return True


def _parts(rel: str) -> list[str]:
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise _Fallback()
    return parts


def _full(path: str) -> str:
    return posixpath.normpath(posixpath.join(WORKSPACE, path))


def _refuse(e: OSError, path: str, doing: str) -> NoReturn:
    """Raises the typed refusal for ``e`` met while ``doing`` ``path``, or
    _Fallback for anything the sandbox should decide."""
    if e.errno in _FULL:
        raise ResourceExhausted(f"workspace is full (bytes or files): {os.strerror(e.errno or 0)}") from e
    if e.errno in _DENIED:
        raise PermissionDenied(f"{_full(path)}: permission denied ({doing})") from e
    raise _Fallback() from e


def _renameat2(parent: int, src: str, dst: str, flags: int) -> None:
    if _libc.renameat2(parent, os.fsencode(src), parent, os.fsencode(dst), flags) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), dst)


@dataclass
class _File:
    parent: int
    temp: str
    name: str
    rel: str
    moved: str = ""
    """"": not yet; "new": renamed to a free name; "swapped": exchanged
    with what was there, which now has the temporary name."""


class _Call:
    """One call's staged files and directories made, until commit() moves
    them in (finish() then drops what they replaced) or undo() puts back
    everything as it was."""

    def __init__(self, root: int, uid: int) -> None:
        self._root = root
        self._uid = uid
        self._dirs: dict[str, int] = {"": os.dup(root)}
        """Open directories by path relative to the workspace."""
        self._made: list[tuple[str, str]] = []
        """(parent's path, name) of each directory made, in order."""
        self._files: list[_File] = []

    def stage(self, rel: str, data: bytes, mode: int) -> None:
        *dirs, name = _parts(rel)
        parent = self._enter(dirs)
        try:
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            pass
        except OSError as e:
            # No search permission on its directory (an O_PATH descriptor
            # needs none to be opened).
            _refuse(e, posixpath.dirname(rel) or ".", "entering the directory")
        else:
            if stat.S_ISDIR(st.st_mode):
                raise FailedPrecondition(f"{_full(rel)} is a directory: a file cannot take its place")
        temp = TEMP_PREFIX + secrets.token_hex(6)
        try:
            fd = os.open(temp, _NEW, 0o600, dir_fd=parent)
        except OSError as e:
            _refuse(e, posixpath.dirname(rel) or ".", "creating a file in it")
        self._files.append(_File(parent, temp, name, rel))
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fchmod(fd, mode)
        except OSError as e:
            _refuse(e, rel, "writing it")
        finally:
            os.close(fd)

    def _enter(self, dirs: list[str]) -> int:
        """The open directory at ``dirs``, each missing one made."""
        path = ""
        cur = self._dirs[path]
        for part in dirs:
            path = posixpath.join(path, part)
            if path in self._dirs:
                cur = self._dirs[path]
                continue
            cur = self._open_or_make(cur, path, part)
            self._dirs[path] = cur
        return cur

    def _open_or_make(self, parent: int, path: str, part: str) -> int:
        made = False
        try:
            os.mkdir(part, 0o700, dir_fd=parent)
            made = True
        except FileExistsError:
            pass
        except OSError as e:
            _refuse(e, path, "creating the directory")
        if made:
            self._made.append((posixpath.dirname(path), part))
        try:
            fd = os.open(part, _DIR, dir_fd=parent)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOTDIR, errno.ENOENT):
                raise _Fallback() from e  # a link or a file on the way, or it changed
            _refuse(e, path, "entering the directory")
        if made:
            try:
                st = os.fstat(fd)
                # Only what we just made gets its mode: something swapped in
                # for it is left as it is, and the sandbox decides.
                if st.st_uid != self._uid or st.st_mode & 0o077:
                    os.close(fd)
                    raise _Fallback()
                # A setgid bit inherited from the parent stays, as mkdir(1) keeps it.
                # (An O_PATH descriptor takes no fchmod; its /proc link is the same inode.)
                os.chmod(f"/proc/self/fd/{fd}", (st.st_mode & 0o7000) | (0o777 & ~_UMASK))
            except OSError as e:
                os.close(fd)
                _refuse(e, path, "creating the directory")
        return fd

    def commit(self) -> None:
        for f in self._files:
            try:
                _renameat2(f.parent, f.temp, f.name, _RENAME_NOREPLACE)
                f.moved = "new"
                continue
            except OSError as e:
                if e.errno != errno.EEXIST:
                    _refuse(e, f.rel, "creating it")
            try:
                _renameat2(f.parent, f.temp, f.name, _RENAME_EXCHANGE)
            except OSError as e:
                # EPERM here is a sticky directory's rule (write was checked).
                _refuse(e, f.rel, "replacing it: its directory is sticky and neither is the user's")
            f.moved = "swapped"
            # A directory swapped in after stage() looked is put back.
            try:
                st = os.stat(f.temp, dir_fd=f.parent, follow_symlinks=False)
            except OSError as e:
                raise _Fallback() from e
            if stat.S_ISDIR(st.st_mode):
                raise FailedPrecondition(f"{_full(f.rel)} is a directory: a file cannot take its place")

    def undo(self) -> None:
        """Puts back what commit() moved, in reverse, and removes every
        temporary and every directory made."""
        for f in reversed(self._files):
            with contextlib.suppress(OSError):
                if f.moved == "swapped":
                    _renameat2(f.parent, f.temp, f.name, _RENAME_EXCHANGE)
                elif f.moved == "new":
                    _renameat2(f.parent, f.name, f.temp, _RENAME_NOREPLACE)
            with contextlib.suppress(OSError):
                os.unlink(f.temp, dir_fd=f.parent)
        for parent, name in reversed(self._made):
            with contextlib.suppress(OSError):
                os.rmdir(name, dir_fd=self._dirs[parent])
        self._close()

    def finish(self) -> None:
        """Removes what the committed files replaced."""
        for f in self._files:
            if f.moved == "swapped":
                with contextlib.suppress(OSError):
                    os.unlink(f.temp, dir_fd=f.parent)
        self._close()

    def _close(self) -> None:
        for fd in self._dirs.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._dirs, self._files, self._made = {}, [], []
