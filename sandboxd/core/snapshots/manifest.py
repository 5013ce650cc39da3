"""Snapshot manifests: what a workspace held (paths, kinds, modes, owners,
sizes, content digests, symlink targets), how they are serialised, checked
before a restore, and turned back into a tar stream.

Owners are recorded relative to the sandbox: SANDBOX_UID stands for the
sandbox's own user (whatever host uid it had) and 0 for root; nothing else
can be restored without capabilities a sandbox never has, so nothing else is
captured. Manifests of formats 1 and 2 carry no owners: every entry is the
sandbox user's, as they were restored before owners were recorded.

A manifest is either complete or a *delta* on the manifest of a base
snapshot (entries put, paths deleted), so a snapshot that changed a few files
of thousands writes a few entries. The catalog resolves deltas and keeps a
base for as long as a delta needs it. Paths are relative to the workspace.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re
import struct
import tarfile
import zlib
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from sandboxd.backends.base import SANDBOX_UID, WORKSPACE
from sandboxd.errors import FailedPrecondition

FILE, DIR, LINK = "f", "d", "l"
EMPTY_DIGEST = hashlib.sha256(b"").hexdigest()
_PAGE = 4096
# PATH_MAX counts the NUL: the longest path a restore can write is 4,095
# bytes, the workspace and its slash included.
MAX_PATH_BYTES = 4095 - len(WORKSPACE) - 1
_FORMAT = 3
_DELTA_FORMAT = 4
# Without owners (every entry the sandbox user's).
_OLD_FORMAT = 1
_OLD_DELTA_FORMAT = 2
_FULL = (_FORMAT, _OLD_FORMAT)
_DELTAS = (_DELTA_FORMAT, _OLD_DELTA_FORMAT)
ROOT_UID = 0
OWNERS = ((SANDBOX_UID, SANDBOX_UID), (ROOT_UID, ROOT_UID))
"""The (uid, gid) pairs a snapshot records: the sandbox user's and root's."""
_HEX_DIGEST = re.compile(r"[0-9a-f]{64}")


class Entry(NamedTuple):
    """One workspace entry (a tuple: thousands are made per snapshot, and a
    frozen dataclass's __init__ costs several times a tuple's)."""

    path: str
    kind: str
    mode: int
    size: int = 0
    digest: str = ""
    """Hex sha256 of the content (files only)."""
    target: str = ""
    """Symlink target (links only)."""
    mtime: float = 0.0
    uid: int = SANDBOX_UID
    """Owner as the sandbox sees it: SANDBOX_UID (its user) or 0 (root)."""
    gid: int = SANDBOX_UID

    @property
    def owner(self) -> tuple[int, int]:
        """(uid, gid)."""
        return (self.uid, self.gid)


def shown(path: str) -> str:
    """``path`` for a message: printable, bytes that are not UTF-8 escaped
    (\\xff), a long one cut to its first and last 100 characters."""
    text = path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return "'" + (text if len(text) <= 200 else f"{text[:100]}...{text[-100:]}") + "'"


class UnsafeSnapshot(FailedPrecondition):
    """A manifest that would write outside the workspace, create special
    files or privileged modes, or does not match its blobs."""


def _row(e: Entry) -> list[Any]:
    # Paths and targets may hold surrogate-escaped bytes: json writes them as
    # \udcXX escapes (ASCII) and reads them back as the same string.
    return [e.path, e.kind, e.mode, e.size, e.digest, e.target, e.mtime, e.uid, e.gid]


def encode(entries: list[Entry]) -> bytes:
    """A complete manifest of ``entries``."""
    rows = [_row(e) for e in entries]
    return zlib.compress(json.dumps({"v": _FORMAT, "entries": rows}, separators=(",", ":")).encode(), 1)


def encode_delta(put: Iterable[Entry], deleted: Iterable[str]) -> bytes:
    """A manifest that is its base's with ``put`` entries added or replaced
    and ``deleted`` paths (and what lies below them) removed."""
    rows = [_row(e) for e in put]
    doc = {"v": _DELTA_FORMAT, "put": rows, "del": sorted(deleted)}
    return zlib.compress(json.dumps(doc, separators=(",", ":")).encode(), 1)


def _rows(rows: list[list[Any]], owned: bool) -> list[Entry]:
    if owned:
        return [
            Entry(str(p), str(k), int(m), int(s), str(d), str(t), float(mt), int(u), int(g))
            for p, k, m, s, d, t, mt, u, g in rows
        ]
    return [Entry(str(p), str(k), int(m), int(s), str(d), str(t), float(mt)) for p, k, m, s, d, t, mt in rows]


def _load(data: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(zlib.decompress(data))
        if not isinstance(doc, dict) or doc.get("v") not in (*_FULL, *_DELTAS):
            raise ValueError(f"unknown manifest format {doc.get('v') if isinstance(doc, dict) else doc!r}")
        return doc
    except (ValueError, TypeError, zlib.error) as e:
        raise UnsafeSnapshot(f"manifest is unreadable: {e}") from e


def is_delta(data: bytes) -> bool:
    """Whether manifest ``data`` is a delta on a base (UnsafeSnapshot for garbage)."""
    return _load(data)["v"] in _DELTAS


def decode(data: bytes) -> list[Entry]:
    """A complete manifest's entries (UnsafeSnapshot for a delta or garbage)."""
    doc = _load(data)
    try:
        if doc["v"] not in _FULL:
            raise ValueError("a delta manifest needs its base")
        return _rows(doc["entries"], doc["v"] == _FORMAT)
    except (ValueError, TypeError, KeyError) as e:
        raise UnsafeSnapshot(f"manifest is unreadable: {e}") from e


def apply_delta(base: dict[str, Entry], data: bytes) -> dict[str, Entry]:
    """``base`` (path -> entry; not modified) with delta ``data`` applied."""
    doc = _load(data)
    try:
        if doc["v"] not in _DELTAS:
            raise ValueError("not a delta manifest")
        put = _rows(doc["put"], doc["v"] == _DELTA_FORMAT)
        deleted = [str(p) for p in doc["del"]]
    except (ValueError, TypeError, KeyError) as e:
        raise UnsafeSnapshot(f"manifest is unreadable: {e}") from e
    out = dict(base)
    if deleted:
        gone = set(deleted)
        prefixes = tuple(p + "/" for p in deleted)
        out = {p: e for p, e in out.items() if p not in gone and not p.startswith(prefixes)}
    for entry in put:
        out[entry.path] = entry
    return out


def diff(base: Mapping[str, Entry], now: Mapping[str, Entry]) -> tuple[list[Entry], list[str]]:
    """(entries put, paths deleted) that turn ``base`` into ``now``."""
    put = [e for p, e in now.items() if base.get(p) != e]
    deleted = [p for p in base if p not in now]
    return put, deleted


def digest_of(entries: Iterable[Entry]) -> str:
    """Identity of a workspace's content: paths, kinds, modes, owners,
    digests, targets (not times), so equal workspaces have equal digests (an
    entry of the sandbox user's adds no owner: digests from before owners
    were recorded stay)."""
    h = hashlib.sha256()
    for e in sorted(entries, key=lambda e: e.path):
        owner = "" if e.owner == (SANDBOX_UID, SANDBOX_UID) else f"\0{e.uid}:{e.gid}"
        line = f"{e.path}\0{e.kind}\0{e.mode:o}\0{e.digest}\0{e.target}{owner}\n"
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
    if not path or "\x00" in path:
        return "empty or containing NUL"
    if len(path) > MAX_PATH_BYTES // 4 and len(path.encode("utf-8", "surrogateescape")) > MAX_PATH_BYTES:
        return f"longer than {MAX_PATH_BYTES} bytes (no file system call takes it below {WORKSPACE})"
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
        where = f"entry {i} ({shown(e.path)})"
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
        if e.owner not in OWNERS:
            raise UnsafeSnapshot(f"{where}: owner {e.uid}:{e.gid} is neither the sandbox user's nor root's")
        if e.kind == FILE:
            if e.size < 0 or not _HEX_DIGEST.fullmatch(e.digest):
                raise UnsafeSnapshot(f"{where}: bad size or digest")
        elif e.kind == LINK and link_escapes(e.path, e.target):
            raise UnsafeSnapshot(f"{where}: symlink to {shown(e.target)} leaves the workspace")
        seen[e.path] = e
    for e in entries:
        parent = posixpath.dirname(e.path)
        while parent:
            up = seen.get(parent)
            if up is not None and up.kind != DIR:
                raise UnsafeSnapshot(f"entry {shown(e.path)}: its parent {shown(parent)} is not a directory")
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


_USTAR = struct.Struct("100s8s8s8s12s12s8sc100s6s2s32s32s8s8s155s12x")
_MAX_OCTAL_11 = 8**11 - 1
_TYPES = {FILE: b"0", DIR: b"5", LINK: b"2"}


def _header(e: Entry, size: int) -> bytes:
    """A ustar header for a validated entry, or a GNU long-name header pair
    (via tarfile, the rare slow path) when the path or target is too long."""
    name = e.path.encode("utf-8", "surrogateescape") + (b"/" if e.kind == DIR else b"")
    link = e.target.encode("utf-8", "surrogateescape")
    mtime = min(max(int(e.mtime), 0), _MAX_OCTAL_11)
    # tarfile writes sizes past 11 octal digits (8 GiB) in GNU base-256.
    if len(name) > 100 or len(link) > 100 or size > _MAX_OCTAL_11:
        info = tarfile.TarInfo(e.path)
        info.mode, info.mtime, info.size = e.mode, mtime, size
        info.uid, info.gid = e.uid, e.gid
        info.type = _TYPES[e.kind]
        info.linkname = e.target
        return info.tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape")
    header = bytearray(
        _USTAR.pack(
            name, b"%07o" % e.mode, b"%07o" % e.uid, b"%07o" % e.gid, b"%011o" % size, b"%011o" % mtime,
            b" " * 8, _TYPES[e.kind], link, b"ustar", b"00", b"", b"", b"", b"", b"",
        )
    )  # fmt: skip
    header[148:156] = b"%06o\0 " % sum(header)
    return bytes(header)


def tar_header(e: Entry) -> bytes:
    """The tar header of a validated entry (a file's at its recorded size)."""
    return _header(e, e.size if e.kind == FILE else 0)


def tar_padding(size: int) -> bytes:
    """What follows ``size`` bytes of content up to the next 512-byte block."""
    return bytes(-size % 512)


TAR_END = bytes(1024)
"""The end-of-archive blocks."""


def _tar_parts(entries: list[Entry], contents: Mapping[str, bytes]) -> Iterator[bytes]:
    for e in sorted(entries, key=lambda e: e.path):
        data = contents[e.digest] if e.kind == FILE and e.size else b""
        yield _header(e, len(data))
        if data:
            yield data
            if len(data) % 512:
                yield bytes(512 - len(data) % 512)
    yield bytes(1024)


def build_tar(entries: list[Entry], contents: Mapping[str, bytes]) -> bytes:
    """A tar of the manifest (paths relative to the workspace, owners as
    recorded); ``contents`` maps digests to verified bytes. Headers are packed
    directly: tarfile's per-member overhead dominated restores of many small
    files."""
    return b"".join(_tar_parts(entries, contents))


def write_tar(path: Path, entries: list[Entry], contents: Mapping[str, bytes]) -> None:
    """build_tar straight into a new file readable by everyone (a sandbox
    user reads it), without the archive ever being whole in memory."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "wb", buffering=1 << 20, closefd=False) as fh:
            fh.writelines(_tar_parts(entries, contents))
    finally:
        os.close(fd)
