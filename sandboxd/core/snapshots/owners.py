"""Restoring a snapshot whose entries belong to more than the sandbox's user.

Neither actor a restore has can give a file away: the sandbox's user and the
sandbox's root (uid 0 in the sandbox's namespaces, with its empty capability
set: no CAP_CHOWN, no CAP_DAC_OVERRIDE) each own exactly what they create.
So each entry is created by its owner, in *rounds* that alternate between the
two, a round creating what its actor owns whose parent exists by then:

- while a restore runs, every directory is 0777, so either actor can create
  in it (the workspace's top included; nothing of the rollout runs yet);
- a file or link gets its final mode as it is created;
- a directory gets its final mode once everything below it has its own, in
  the round of its owner that follows (children first), so a 0700 directory
  of root's is closed only after the sandbox user's files inside it are done.

A workspace of the sandbox user's alone takes one round (the plain restore);
a root-owned grader in it takes two.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from sandboxd.core.snapshots.manifest import DIR, FILE, LINK, ROOT_UID, Entry, shown
from sandboxd.errors import FailedPrecondition

SANDBOX, ROOT = "sandbox", "root"
OPEN_DIR_MODE = 0o777
"""Every directory's mode while a restore runs."""


@dataclass
class Round:
    """What one actor does in one step: extract ``create`` (a tar of them, in
    path order), then set ``modes`` (octal mode, path) in that order."""

    actor: str
    create: list[Entry] = field(default_factory=list)
    modes: list[tuple[int, str]] = field(default_factory=list)


def actor_of(e: Entry) -> str:
    """Who must create ``e`` for it to have its recorded owner."""
    return ROOT if e.uid == ROOT_UID else SANDBOX


def needs_rounds(entries: Iterable[Entry]) -> bool:
    """Whether some entry is not the sandbox user's (one plain round will not do)."""
    return any(actor_of(e) != SANDBOX for e in entries)


def _parent(path: str) -> str:
    return path.rpartition("/")[0]


def plan(entries: list[Entry]) -> list[Round]:
    """The rounds that create ``entries`` (validated: parents are
    directories) with their owners and modes, the sandbox user's first."""
    ordered = sorted(entries, key=lambda e: e.path)  # a parent sorts before what it holds
    open_children: dict[str, int] = {}
    for e in ordered:
        open_children[_parent(e.path)] = open_children.get(_parent(e.path), 0) + 1
    created: set[str] = {""}
    done: set[str] = set()
    rounds: list[Round] = []
    actor = SANDBOX
    idle = 0
    while len(done) < len(ordered):
        step = Round(actor)
        opened: list[tuple[int, str]] = []
        closed: list[tuple[int, str]] = []
        for e in ordered:
            if e.path in created or actor_of(e) != actor or _parent(e.path) not in created:
                continue
            created.add(e.path)
            if e.kind == DIR:
                step.create.append(e._replace(mode=OPEN_DIR_MODE))
                opened.append((OPEN_DIR_MODE, e.path))
                continue
            step.create.append(e)
            if e.kind != LINK:  # a link's mode is always 0777 and cannot be set
                closed.append((e.mode, e.path))
            done.add(e.path)
            open_children[_parent(e.path)] -= 1
        for e in reversed(ordered):  # children before the directory that holds them
            if (
                e.kind == DIR
                and e.path in created
                and e.path not in done
                and actor_of(e) == actor
                and not open_children.get(e.path, 0)
            ):
                closed.append((e.mode, e.path))
                done.add(e.path)
                open_children[_parent(e.path)] -= 1
        step.modes = opened + closed
        if step.create or step.modes:
            rounds.append(step)
            idle = 0
        else:
            idle += 1
            if idle > 1:
                raise AssertionError("a restore plan made no progress (a parent that is not a directory?)")
        actor = ROOT if actor == SANDBOX else SANDBOX
    if not rounds or rounds[0].actor != SANDBOX:
        rounds.insert(0, Round(SANDBOX))  # it opens the workspace's top to root
    return rounds


def _may(owner: tuple[int, int], e: Entry, bits: int) -> bool:
    """Whether ``owner`` (a recorded (uid, gid)) has ``bits`` (r=4, x=1) on ``e``, without capabilities."""
    if e.uid == owner[0]:
        have = e.mode >> 6
    elif e.gid == owner[1]:
        have = e.mode >> 3
    else:
        have = e.mode
    return have & bits == bits


def refuse_unreadable(entries: Iterable[Entry]) -> None:
    """FailedPrecondition naming the first entry its owner could not read
    in the sandbox: a file without its owner's read bit, a directory without
    its owner's read and search bits, or an entry below a directory its owner
    may not search. A snapshot takes each entry as its owner could read it,
    whether it is read in place or through the sandbox (where the owner is
    the only one who can), so both refuse the same entries."""
    by_path = {e.path: e for e in entries}
    searchable: dict[tuple[tuple[int, int], str], bool] = {}
    for e in sorted(by_path.values(), key=lambda e: e.path):
        owner = e.owner
        blocked = ""
        prefix = ""
        for part in e.path.split("/")[:-1]:
            prefix = f"{prefix}/{part}" if prefix else part
            ok = searchable.get((owner, prefix))
            if ok is None:
                up = by_path.get(prefix)
                ok = searchable[(owner, prefix)] = up is None or _may(owner, up, 1)
            if not ok:
                blocked = prefix
                break
        who = "root" if e.uid == ROOT_UID else "the sandbox user"
        why = ""
        if blocked:
            why = f"its owner ({who}) may not search {shown(blocked)} above it"
        elif e.kind == FILE and not _may(owner, e, 4):
            why = f"its owner ({who}) may not read it (mode {e.mode:04o}); chmod u+r it"
        elif e.kind == DIR and not _may(owner, e, 5):
            why = f"its owner ({who}) may not list it (mode {e.mode:04o}); chmod u+rx it"
        if why:
            raise FailedPrecondition(
                f"/workspace/{shown(e.path)[1:-1]} cannot be snapshotted: {why}; a snapshot takes every "
                "entry as its owner can read it in the sandbox"
            )


def modes_payload(modes: list[tuple[int, str]]) -> bytes:
    """``modes`` as a round's script reads them: NUL-separated (mode, path)
    pairs, closed by an empty record (the tar follows)."""
    out = bytearray()
    for mode, path in modes:
        out += b"%o\0" % mode + path.encode("utf-8", "surrogateescape") + b"\0"
    return bytes(out + b"\0")
