"""Typed limit outcomes for commands in Pods, read from inside the sandbox.

The control plane does not run on the nodes, so it cannot read a
container's cgroup from the host as the Docker backend does. It reads what
the container itself sees: its own cgroup (cgroup namespace on v2, the
container's cgroup bind-mounted on v1) and its workspace filesystem, through
one more exec, only after a command failed:

- ``oom_kill`` in memory.events (v2) / memory.oom_control (v1) moved:
  OOM_KILLED;
- ``max`` in pids.events moved: PIDS_EXHAUSTED. On v1 the container's file
  counts forks refused in it whichever ancestor's limit refused them (the
  kubelet's podPidsLimit is on the Pod's cgroup); on v2 it counts refusals
  by the container's own limit, and pids.events.local (kernel >= 6.12) is
  read too;
- the workspace or one of the scratch mounts (/tmp, /mnt, /dev/shm) has no
  free inodes / bytes (statvfs): FILE_LIMIT / DISK_FULL, naming which
  (kernel-enforced only on a sized tmpfs or an ephemeral volume; see podspec).

A fresh container's counters are zero, so sandboxes this control plane
created need no probe before a command; adopted ones are probed once. The
counter probe is a single process (grep, no fork), so it still starts in a
sandbox whose process limit is nearly exhausted.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from sandboxd.backends.base import WORKSPACE, ExecOutcome

_FILES = (
    "/sys/fs/cgroup/memory.events",
    "/sys/fs/cgroup/pids.events",
    "/sys/fs/cgroup/pids.events.local",
    "/sys/fs/cgroup/memory/memory.oom_control",
    "/sys/fs/cgroup/pids/pids.events",
)
COUNTERS_ARGV = ["grep", "-s", "-H", "-e", "^oom_kill ", "-e", "^max ", *_FILES]
# The Pod's other writable filesystems, each a sized tmpfs (podspec): filling
# one is named like filling the workspace.
SCRATCH = ("/tmp", "/mnt", "/dev/shm")
# The name last, so each line's first five fields read as parse_fs reads them.
FS_ARGV = ["stat", "-f", "-c", "%c %d %b %a %S %n", WORKSPACE, *SCRATCH]
# Builtins only (no fork): stops, then kills, every process in the sandbox
# but its init, itself and init's keep-alive ``sleep``, which is all a fork
# bomb leaves room for. Stopping first (``kill -STOP -1``, swept 50 times, a
# few milliseconds) freezes the bomb so the kills cannot be outrun; each kill
# pass reads /proc to tell the keep-alive by its parent and name. The
# keep-alive must live: were it killed, init would fork a new one while the
# bomb's zombies still hold every slot, and the shell that is init exits on a
# failed fork, ending the whole sandbox. Three rounds catch a process forked
# while a sweep ran; the keep-alive is continued at the end.
KILL_ALL_ARGV = [
    "sh",
    "-c",
    "sweep() { n=0; while [ $n -lt 50 ]; do kill -STOP -1 2>/dev/null; n=$((n+1)); done; }; "
    "each() { for d in /proc/[0-9]*; do p=${d#/proc/}; "
    '{ [ "$p" -gt 1 ] && [ "$p" != $$ ]; } || continue; '
    '2>/dev/null read -r s < "$d/stat" || continue; c=${s#* }; c=${c%%)*}; s=${s##*) }; set -- $s; '
    '{ [ "$2" = 1 ] && [ "$c" = "(sleep" ]; } && continue; kill -KILL "$p" 2>/dev/null; done; }; '
    "for r in 1 2 3; do sweep; each; done; kill -CONT -1 2>/dev/null; true",
]


# How an exec that could not start for want of a process slot fails: the
# runtime's own fork refused, or runc's init child killed by the pids cgroup
# before it reported back (runc then sees its pipe reset).
_NO_PROCESS_SLOT = ("resource temporarily unavailable", "read init-p: connection reset by peer")


def no_process_slot(failure: str) -> bool:
    """Whether an exec's failure says the sandbox's process table was full
    (which says nothing about whether the sandbox still runs)."""
    failure = failure.lower()
    return any(sign in failure for sign in _NO_PROCESS_SLOT)


@dataclass(frozen=True)
class Counters:
    """The container's limit counters at one moment; only a rise between two readings means anything."""

    oom_kills: int = 0
    pids_max_events: int = 0


def parse_counters(text: str) -> Counters | None:
    """From COUNTERS_ARGV's output; None when no counter file was readable."""
    oom = pids = 0
    seen = False
    for line in text.splitlines():
        path, _, rest = line.partition(":")
        key, _, value = rest.partition(" ")
        try:
            n = int(value.strip())
        except ValueError:
            continue
        seen = True
        if key == "oom_kill" and "memory" in path:
            oom = max(oom, n)
        elif key == "max" and "pids" in path:
            pids = max(pids, n)
    return Counters(oom, pids) if seen else None


@dataclass(frozen=True)
class Workspace:
    """The workspace filesystem's inodes and blocks, total and free, as statvfs reports them."""

    files: int
    files_free: int
    blocks: int
    blocks_free: int
    block_size: int


def parse_fs(text: str) -> Workspace | None:
    """From FS_ARGV's output; None when it is not five numbers."""
    with contextlib.suppress(ValueError):
        files, ffree, blocks, bavail, bsize = (int(x) for x in text.split()[:5])
        return Workspace(files, ffree, blocks, bavail, bsize)
    return None


def explain_counters(before: Counters, after: Counters) -> tuple[ExecOutcome, str] | None:
    """The limit a failed command hit, by the counter that rose (an OOM kill first); None if none rose."""
    if after.oom_kills > before.oom_kills:
        return ExecOutcome.OOM_KILLED, "a process hit the sandbox's memory limit and was killed"
    if after.pids_max_events > before.pids_max_events:
        return ExecOutcome.PIDS_EXHAUSTED, "the sandbox's process limit was reached (fork refused)"
    return None


def parse_filesystems(text: str) -> dict[str, Workspace]:
    """Mount -> its filesystem, from FS_ARGV's output (a mount stat could not read is absent)."""
    found: dict[str, Workspace] = {}
    for line in text.splitlines():
        fields = line.split(maxsplit=5)
        fs = parse_fs(line)
        if fs is not None and len(fields) == 6:
            found[fields[5]] = fs
    return found


def explain_fs(fs: Workspace, where: str = "the workspace") -> tuple[ExecOutcome, str] | None:
    """FILE_LIMIT when no inode is free, DISK_FULL when no block is; None while there is room."""
    if fs.files and fs.files_free == 0:
        return ExecOutcome.FILE_LIMIT, f"{where} holds its maximum of {fs.files} files"
    if fs.blocks and fs.blocks_free == 0:
        return ExecOutcome.DISK_FULL, f"{where} is full ({fs.blocks * fs.block_size} bytes)"
    return None


def explain_filesystems(found: dict[str, Workspace]) -> tuple[ExecOutcome, str] | None:
    """The first of the workspace and the scratch mounts that is out of inodes or bytes."""
    for mount in (WORKSPACE, *SCRATCH):
        fs = found.get(mount)
        why = explain_fs(fs, "the workspace" if mount == WORKSPACE else mount) if fs else None
        if why is not None:
            return why
    return None
