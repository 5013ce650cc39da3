"""What a snapshot knows of a workspace's entries: records as a listing
describes them (from the find command in the sandbox or read in place),
the *baseline* a sandbox's next snapshot builds on, and how listings are
parsed."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from sandboxd.backends.base import SANDBOX_UID, WORKSPACE
from sandboxd.backends.shell import is_env_name
from sandboxd.backends.snapshot_shell import SHELL_OWNED
from sandboxd.core.snapshots import manifest as mf
from sandboxd.core.snapshots.info import ChainRef
from sandboxd.core.snapshots.journal import Journal
from sandboxd.core.snapshots.manifest import DIR, FILE, LINK, OWNERS, ROOT_UID, Entry, shown
from sandboxd.errors import BackendError, FailedPrecondition

KINDS = {"f": FILE, "d": DIR, "l": LINK}

# A file whose ctime is this close to the listing may still change within the
# same kernel timestamp tick (ctime comes from the coarse clock, at most one
# tick, 1-10 ms, behind); it is not trusted as unchanged next time.
RACY_SECONDS = 0.05
# How far before its reference time a delta listing starts (tick jitter).
DELTA_SLACK = 0.01

Stamp = tuple[int, str, str]
"""(size, mtime, ctime) as find printed them."""


class Listed(NamedTuple):
    """An entry as a listing describes it (hostfs.Record's fields): a tuple,
    as thousands are made per snapshot."""

    kind: str
    mode: int
    size: int
    mtime: str
    ctime: str
    path: str
    target: str
    links: int = 1
    """Names of the inode (known where the workspace is read in place)."""
    uid: int = SANDBOX_UID
    """Owner as a snapshot records it (sandboxd.backends.base.SANDBOX_UID:
    the sandbox's user; 0: root), once ``recorded`` mapped it."""
    gid: int = SANDBOX_UID

    @property
    def stamp(self) -> Stamp:
        """(size, mtime, ctime): while these stay equal the file's content is taken as unchanged."""
        return (self.size, self.mtime, self.ctime)


@dataclass
class Baseline:
    """What a live sandbox's workspace held when it was last restored or
    snapshotted: stamps and digests of its regular files."""

    snapshot_id: str
    chain: list[ChainRef]
    files: dict[str, tuple[Stamp, str]] = field(default_factory=dict)
    """After a snapshot: (stamp, digest), unchanged while the stamp is."""
    cutoff: float = 0.0
    """After a restore: a file of ``entries`` is as restored while its ctime
    is below this (0: not from a restore)."""
    entries: dict[str, Entry] | None = None
    """Every entry it held (shared, never mutated): the next snapshot lists
    only what changed since ``since`` and carries the rest over."""
    since: float = 0.0
    journal: Journal | None = None
    """Records what changed since (workspaces read in place): the next
    snapshot looks at those paths only."""
    linked: frozenset[str] = frozenset()
    """Files with more than one name (all of them): a write through one name
    leaves no event for the others, so they are looked at every time."""
    mapped: frozenset[str] | None = frozenset()
    """Files a process of the sandbox had mapped shared and writable when it
    was taken (None: that could not be told, so every file may be): a write
    through the mapping since moved neither events nor stamps, so the next
    snapshot reads them again (sandboxd.backends.hostmaps)."""

    def unchanged(self, item: Listed, digest: str | None = None) -> Entry | None:
        """The recorded entry of ``item`` if the listing shows it untouched
        since that record: carried as recorded (a restore sets whole-second
        mtimes, so a fresh record would differ from the snapshot's in the
        fraction alone). ``digest``: a file's digest_of, if the caller has it."""
        if self.entries is None:
            return None
        prev = self.entries.get(item.path)
        if prev is None or prev.mode != item.mode & 0o1777 or prev.kind != KINDS.get(item.kind):
            return None
        if prev.owner != (item.uid, item.gid):
            return None
        if prev.kind == FILE:
            known = digest if digest is not None else self.digest_of(item)
            return prev if known == prev.digest else None
        # A directory or link: unchanged while its ctime is below the
        # restore's cutoff (after a snapshot, a fresh record is equal anyway).
        return prev if self.cutoff and float(item.ctime) < self.cutoff else None

    def digest_of(self, item: Listed) -> str | None:
        """The digest of ``item`` if it is known to be unchanged."""
        known = self.files.get(item.path)
        if known is not None:
            return known[1] if known[0] == item.stamp else None
        written = self.entries.get(item.path) if self.cutoff and self.entries is not None else None
        if written is not None and written.kind == FILE and written.size == item.size:
            return written.digest if float(item.ctime) < self.cutoff else None
        return None


def _fields(data: bytes) -> tuple[float, list[bytes]]:
    fields = data.split(b"\x00")
    if not fields or fields[-1] != b"":
        raise BackendError("workspace listing is malformed (truncated?)")
    try:
        return float(fields[0]), fields[1:-1]
    except ValueError as e:
        raise BackendError(f"workspace listing is malformed: {fields[0][:80]!r}") from e


Owner = tuple[int, int]
"""(uid, gid) of the sandbox's user as its processes (and the host) see it."""
SANDBOX_OWNER: Owner = (SANDBOX_UID, SANDBOX_UID)
"""That of a backend that gives every sandbox the same user."""


def recorded(item: Listed, sandbox: Owner) -> Listed:
    """``item`` (listed with the owner the kernel reports) with the owner a
    snapshot records: ``sandbox``'s user as SANDBOX_UID, root as 0.
    FailedPrecondition naming the entry for any other owner: a restore,
    run by the sandbox's user and its root without capabilities, could not
    give it back. FailedPrecondition, too, for a path too long to restore."""
    long = len(item.path) > mf.MAX_PATH_BYTES // 4  # 4 bytes a character at most: cheap for the rest
    if long and len(item.path.encode("utf-8", "surrogateescape")) > mf.MAX_PATH_BYTES:
        raise FailedPrecondition(
            f"{WORKSPACE}/{shown(item.path)[1:-1]}: its path is longer than {mf.MAX_PATH_BYTES} bytes "
            f"below {WORKSPACE}, which no restore could write back; snapshots refuse it (shorten it)"
        )
    uid = SANDBOX_UID if item.uid == sandbox[0] else item.uid
    gid = SANDBOX_UID if item.gid == sandbox[1] else item.gid
    if (uid, gid) not in OWNERS and item.kind in KINDS:
        raise FailedPrecondition(
            f"{WORKSPACE}/{shown(item.path)[1:-1]} is owned by {item.uid}:{item.gid}, neither the sandbox "
            f"user ({sandbox[0]}:{sandbox[1]}) nor root ({ROOT_UID}:{ROOT_UID}); a restore could not give "
            "it back that owner, so snapshots refuse it (chown it, or remove it)"
        )
    return item._replace(uid=uid, gid=gid)


def file_entry(item: Listed, size: int, digest: str, name: str = "") -> Entry:
    """The entry of regular file ``item`` (named ``name`` where given), read at ``size`` bytes."""
    return Entry(
        name or item.path, FILE, item.mode & 0o1777, size, digest, mtime=float(item.mtime),
        uid=item.uid, gid=item.gid,
    )  # fmt: skip


def _records(body: list[bytes], sandbox: Owner, denied: list[str] | None) -> list[Listed]:
    out: list[Listed] = []
    i = 0
    while i < len(body):
        if body[i][:1] == b"X":  # a directory the listing user may not list (a head never starts so)
            if denied is None:
                raise BackendError("workspace listing names a directory it could not list")
            denied.append(body[i][1:].decode("utf-8", "surrogateescape").removeprefix("./"))
            i += 1
            continue
        if i + 2 >= len(body):
            raise BackendError("workspace listing is malformed (odd record)")
        head = body[i].split(b" ")
        if len(head) != 7:
            raise BackendError(f"workspace listing is malformed: {body[i][:80]!r}")
        kind, mode, size, mtime, ctime, uid, gid = (h.decode() for h in head)
        out.append(
            recorded(
                Listed(
                    kind=kind,
                    mode=int(mode, 8),
                    size=int(size),
                    mtime=mtime,
                    ctime=ctime,
                    path=body[i + 1].decode("utf-8", "surrogateescape").removeprefix("./"),
                    target=body[i + 2].decode("utf-8", "surrogateescape"),
                    uid=int(uid),
                    gid=int(gid),
                ),
                sandbox,
            )
        )
        i += 3
    return out


def parse_listing(
    data: bytes, sandbox: Owner = SANDBOX_OWNER, denied: list[str] | None = None
) -> tuple[float, list[Listed]]:
    """(listing time, entries) from LIST_SCRIPT's (or RECORDS_SCRIPT's,
    SUBLIST_SCRIPT's) output; ``sandbox``: the sandbox user's (uid, gid),
    recorded as SANDBOX_UID; ``denied`` gets the directories the listing
    user could not list."""
    when, body = _fields(data)
    return when, _records(body, sandbox, denied)


def parse_delta(
    data: bytes, sandbox: Owner = SANDBOX_OWNER, denied: list[str] | None = None
) -> tuple[float, list[Listed], list[str]]:
    """(listing time, changed entries, names of all entries) from a
    delta_script's output (``denied`` as for parse_listing)."""
    when, body = _fields(data)
    records: list[bytes] = []
    names: list[str] = []
    i = 0
    while i < len(body):
        field = body[i]
        if field[:1] == b"R" and i + 2 < len(body):
            records += (field[1:], body[i + 1], body[i + 2])
            names.append(body[i + 1].decode("utf-8", "surrogateescape"))
            i += 3
        elif field[:1] == b"N":
            names.append(field[1:].decode("utf-8", "surrogateescape"))
            i += 1
        elif field[:1] == b"X":
            records.append(field)
            i += 1
        else:
            raise BackendError(f"delta listing is malformed: {field[:80]!r}")
    return when, _records(records, sandbox, denied), names


def parse_session_state(data: bytes) -> tuple[str, dict[str, str], bytes]:
    """(cwd, exported environment, the listing that follows) from
    STATE_SCRIPT's output; variables that belong to the shell or to sandboxd
    are left out."""
    end = data.find(b"\x00\x00")
    first = data.find(b"\x00")
    if first < 0 or end < 0:
        raise BackendError("session state is malformed")
    cwd = data[:first].decode("utf-8", "surrogateescape")
    env: dict[str, str] = {}
    for item in data[first + 1 : end + 1].split(b"\x00")[:-1]:
        name, sep, value = item.decode("utf-8", "surrogateescape").partition("=")
        if not sep or not is_env_name(name) or name.startswith("SANDBOXD_") or name in SHELL_OWNED:
            continue
        env[name] = value
    return cwd, env, data[end + 2 :]


def not_a_file(item: Listed, prev: Entry | None) -> Entry | None:
    """The entry of a listed directory or symlink (``prev`` where it is
    unchanged); None for what a snapshot does not carry (FIFOs, sockets).
    FailedPrecondition for a link that leaves the workspace."""
    if item.kind == "d":
        return prev or Entry(
            item.path, DIR, item.mode & 0o1777, mtime=float(item.mtime), uid=item.uid, gid=item.gid
        )
    if item.kind == "l":
        if mf.link_escapes(item.path, item.target):
            raise FailedPrecondition(
                f"{WORKSPACE}/{shown(item.path)[1:-1]}: symlink to {shown(item.target)} leaves the "
                "workspace; snapshots carry only links that stay inside it"
            )
        return prev or Entry(
            item.path, LINK, 0o777, target=item.target, mtime=float(item.mtime), uid=item.uid, gid=item.gid
        )
    return None


def as_listed(e: Entry) -> Listed:
    """A carried-over file as a listing record, should it have to be read
    again; its ctime is unknown, so nothing trusts its stamp later."""
    return Listed(FILE, e.mode, e.size, repr(e.mtime), "0", e.path, "", uid=e.uid, gid=e.gid)
