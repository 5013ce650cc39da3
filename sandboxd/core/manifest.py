"""Snapshot manifests: what a workspace held (paths, kinds, modes, sizes,
content digests, symlink targets), how they are serialised, checked before a
restore, and turned back into a tar stream.

A manifest is complete (not a delta): every snapshot can be restored and
deleted independently of its ancestors. Paths are relative to the workspace.
"""

from __future__ import annotations

import hashlib
import io
import json
import posixpath
import tarfile
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sandboxd.backends.base import WORKSPACE
from sandboxd.errors import FailedPrecondition

FILE, DIR, LINK = "f", "d", "l"
EMPTY_DIGEST = hashlib.sha256(b"").hexdigest()
_PAGE = 4096
_MAX_PATH = 4096
_FORMAT = 1


@dataclass(frozen=True)
class Entry:
    path: str
    kind: str
    mode: int
    size: int = 0
    digest: str = ""
    """Hex sha256 of the content (files only)."""
    target: str = ""
    """Symlink target (links only)."""
    mtime: float = 0.0


class UnsafeSnapshot(FailedPrecondition):
    """A manifest that would write outside the workspace, create special
    files or privileged modes, or does not match its blobs."""


def encode(entries: list[Entry]) -> bytes:
    rows = [[e.path, e.kind, e.mode, e.size, e.digest, e.target, e.mtime] for e in entries]
    return zlib.compress(json.dumps({"v": _FORMAT, "entries": rows}, separators=(",", ":")).encode(), 1)


def decode(data: bytes) -> list[Entry]:
    try:
        doc = json.loads(zlib.decompress(data))
        if doc.get("v") != _FORMAT:
            raise ValueError(f"unknown manifest format {doc.get('v')!r}")
        return [
            Entry(str(p), str(k), int(m), int(s), str(d), str(t), float(mt))
            for p, k, m, s, d, t, mt in doc["entries"]
        ]
    except (ValueError, TypeError, KeyError, zlib.error) as e:
        raise UnsafeSnapshot(f"manifest is unreadable: {e}") from e


def digest_of(entries: Iterable[Entry]) -> str:
    """Identity of a workspace's content: paths, kinds, modes, digests, targets
    (not times), so equal workspaces have equal digests."""
    h = hashlib.sha256()
    for e in sorted(entries, key=lambda e: e.path):
        line = f"{e.path}\0{e.kind}\0{e.mode:o}\0{e.digest}\0{e.target}\n"
        h.update(line.encode("utf-8", "surrogateescape"))
    return "sha256:" + h.hexdigest()


def link_escapes(path: str, target: str) -> bool:
    """Whether symlink ``path`` -> ``target`` resolves outside the workspace."""
    if not target or "\x00" in target:
        return True
    if target.startswith("/"):
        full = posixpath.normpath(target)
        return full != WORKSPACE and not full.startswith(WORKSPACE + "/")
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
    return resolved == ".." or resolved.startswith("../")


def check_path(path: str) -> str | None:
    """Why ``path`` is not a safe relative workspace path, or None."""
    if not path or "\x00" in path or len(path) > _MAX_PATH:
        return "empty, too long or containing NUL"
    if path.startswith("/"):
        return "absolute"
    if posixpath.normpath(path) != path or path == ".":
        return "not normalised"
    if ".." in path.split("/"):
        return "contains '..'"
    return None


def validate(entries: list[Entry]) -> None:
    """Refuses a manifest that could escape the workspace or create what a
    sandbox must never hold. Raises UnsafeSnapshot naming the entry."""
    seen: dict[str, Entry] = {}
    for i, e in enumerate(entries):
        where = f"entry {i} ({e.path[:200]!r})"
        why = check_path(e.path)
        if why:
            raise UnsafeSnapshot(f"{where}: path is {why}")
        if e.path in seen:
            raise UnsafeSnapshot(f"{where}: appears twice")
        if e.kind not in (FILE, DIR, LINK):
            raise UnsafeSnapshot(f"{where}: kind {e.kind[:10]!r} is not a file, directory or symlink")
        if not 0 <= e.mode <= 0o7777:
            raise UnsafeSnapshot(f"{where}: mode {e.mode:o} is not a permission mode")
        if e.mode & 0o6000:
            raise UnsafeSnapshot(f"{where}: setuid/setgid bit set ({e.mode:o})")
        if e.kind == FILE:
            if e.size < 0 or len(e.digest) != 64 or any(c not in "0123456789abcdef" for c in e.digest):
                raise UnsafeSnapshot(f"{where}: bad size or digest")
        elif e.kind == LINK and link_escapes(e.path, e.target):
            raise UnsafeSnapshot(f"{where}: symlink to {e.target[:200]!r} leaves the workspace")
        seen[e.path] = e
    for e in entries:
        parent = posixpath.dirname(e.path)
        while parent:
            up = seen.get(parent)
            if up is not None and up.kind != DIR:
                raise UnsafeSnapshot(f"entry {e.path[:200]!r}: its parent {parent!r} is not a directory")
            parent = posixpath.dirname(parent)


def footprint(entries: list[Entry]) -> tuple[int, int]:
    """(inodes, bytes) the entries take on a tmpfs workspace: content rounded
    up to pages, long symlink targets a page each, one inode per entry plus
    the workspace itself."""
    pages = 0
    for e in entries:
        if e.kind == FILE:
            pages += (e.size + _PAGE - 1) // _PAGE
        elif e.kind == LINK and len(e.target) > 60:
            pages += 1
    return len(entries) + 1, pages * _PAGE


def needs_fixup(e: Entry) -> bool:
    """Modes a non-root ``tar -x`` (umask 022) would not reproduce."""
    return e.kind != LINK and bool(e.mode & 0o1022)


def build_tar(entries: list[Entry], contents: Mapping[str, bytes]) -> bytes:
    """A tar of the manifest (paths relative to the workspace); ``contents``
    maps digests to verified bytes."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for e in sorted(entries, key=lambda e: e.path):
            info = tarfile.TarInfo(e.path)
            info.mode = e.mode
            info.mtime = int(e.mtime)
            info.uid = info.gid = 1000
            if e.kind == DIR:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif e.kind == LINK:
                info.type = tarfile.SYMTYPE
                info.linkname = e.target
                tar.addfile(info)
            else:
                data = contents[e.digest] if e.size else b""
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()
