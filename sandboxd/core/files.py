"""Tar building and checking for file transfer. Backends only move tar
streams; what goes into them and what may come out is decided here."""

from __future__ import annotations

import io
import posixpath
import tarfile
from dataclasses import dataclass
from typing import IO

from sandboxd.backends.base import WORKSPACE
from sandboxd.errors import InvalidArgument, NotFound, ResourceExhausted


@dataclass(frozen=True)
class FileData:
    """One file to write or as read: its path, content and permission bits."""

    path: str
    content: bytes
    mode: int = 0o644


def relative(full: str, base: str = WORKSPACE) -> str:
    """``full`` relative to ``base``, as tar member names are (purely lexical)."""
    return posixpath.relpath(full, base)


def shared_parent(files: list[FileData], root: str) -> str:
    """The deepest directory below or at ``root`` (a file root) holding
    every one of ``files``: where an upload of them is extracted, so that
    its staging needs no right on a directory above the files' own."""
    parent = posixpath.commonpath([posixpath.dirname(f.path) for f in files])
    return parent if parent == root or parent.startswith(root.rstrip("/") + "/") else root


def build_tar(files: list[FileData], base: str = WORKSPACE) -> bytes:
    """``files`` carry absolute, validated paths under ``base`` (a file root)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for f in files:
            info = tarfile.TarInfo(relative(f.path, base))
            info.size = len(f.content)
            info.mode = f.mode
            info.uid = info.gid = 0
            tar.addfile(info, io.BytesIO(f.content))
    return buf.getvalue()


def parse_read_tar(data: bytes, wanted: list[str], base: str = WORKSPACE) -> list[FileData]:
    """Pulls the wanted regular files (absolute paths) out of a tar made by
    the backend's get_tar relative to ``base`` (a file root)."""
    found: dict[str, FileData] = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        for member in tar:
            full = posixpath.normpath(posixpath.join(base, member.name))
            if full not in wanted or full in found:
                continue
            if not member.isfile():
                kind = (
                    "directory" if member.isdir() else "symbolic link" if member.issym() else "special file"
                )
                raise InvalidArgument("paths", f"{full} is a {kind}, not a regular file")
            fh = tar.extractfile(member)
            content = fh.read() if fh is not None else b""
            found[full] = FileData(full, content, member.mode & 0o7777)
    missing = [p for p in wanted if p not in found]
    if missing:
        raise NotFound(f"no such file in the sandbox: {missing[0]}")
    return [found[p] for p in wanted]


def check_upload(fileobj: IO[bytes], max_bytes: int = 0) -> int:
    """Refuses tar streams that could write outside the target directory or
    create device files, whose members declare more data than the stream
    holds, or (ResourceExhausted) whose files take more than ``max_bytes``
    (the sandbox's disk limit; 0: none) at their apparent sizes, a sparse
    member counted whole; returns the member count."""
    count = 0
    total = 0
    end = fileobj.seek(0, 2)
    fileobj.seek(0)
    try:
        with tarfile.open(fileobj=fileobj, mode="r:*") as tar:
            for member in tar:
                count += 1
                name = member.name
                if member.isreg():
                    # tarfile reports a sparse member at its real (apparent) size.
                    total += member.size
                    if max_bytes and total > max_bytes:
                        raise ResourceExhausted(
                            f"upload refused: member {name[:200]!r} has an apparent size of {member.size} "
                            f"bytes (a sparse file counts whole), which brings the archive's files to "
                            f"{total} bytes, more than the sandbox's disk limit of {max_bytes} bytes"
                        )
                    sparse = getattr(member, "sparse", None)
                    stored = sum(n for _, n in sparse) if sparse is not None else member.size
                    if tar.fileobj is fileobj and member.offset_data + stored > end:
                        raise InvalidArgument(
                            "tar", f"member {name[:200]!r} declares more data than the archive holds"
                        )
                norm = posixpath.normpath(name)
                if name.startswith("/") or norm == ".." or norm.startswith("../"):
                    raise InvalidArgument("tar", f"member {name[:200]!r} escapes the target directory")
                if member.isdev() or member.isfifo():
                    raise InvalidArgument("tar", f"member {name[:200]!r} is a device or FIFO")
                if member.issym() or member.islnk():
                    target = member.linkname
                    base = posixpath.dirname(norm) if member.issym() else ""
                    resolved = posixpath.normpath(posixpath.join(base, target))
                    if target.startswith("/") or resolved == ".." or resolved.startswith("../"):
                        raise InvalidArgument(
                            "tar", f"link {name[:200]!r} points outside the target directory"
                        )
    except tarfile.TarError as e:
        raise InvalidArgument("tar", f"not a valid tar stream: {e}") from e
    return count
