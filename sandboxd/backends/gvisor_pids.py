"""The process limit of gVisor sandboxes, on either backend.

Under gVisor the process limit is RLIMIT_NPROC inside the sandbox (the host's
pids cgroup counts gVisor's own threads, and a limit there stops the whole
sandbox instead of refusing one fork). A refused fork or clone fails with
EAGAIN and leaves no counter anyone can read, so what the command printed is
the only trace; and while a fork bomb holds every slot, gVisor refuses new
execs too (each is a process), so the bomb is stopped from a shell started
before it, with builtins only.
"""

from __future__ import annotations

import re

from sandboxd.backends.base import GVISOR

__all__ = ["KILL_ALL", "RESCUE_SESSION", "STDERR_KEPT", "engine_pids", "refused_fork"]

# What a refused fork or clone prints from the shells and runtimes commonly
# run (bash, dash, Python's os.fork and threading, glibc's posix_spawn users).
_FORK_REFUSED = re.compile(
    rb"fork: (retry: )?Resource temporarily unavailable|Cannot fork|can't fork|"
    rb"can't start new thread|BlockingIOError: \[Errno 11\]"
)
STDERR_KEPT = 8 << 10
"""How much of a command's stderr (its end) is kept to look for a refused fork."""
RESCUE_SESSION = ".sandboxd-rescue"
"""A session kept in every gVisor sandbox to run KILL_ALL in: its shell runs
builtins without forking."""
# Stops, then kills, every process of the sandbox that the runtime did not
# start itself (those have parent 0: the roots of sessions and one-shot
# runners, kept so they go on serving) but for the container's own init and
# keep-alive (pids 1 and 2), the shells its keeper keeps with their wrappers
# (sandboxd.backends.docker.keeper: each pid in a .pid file beside its FIFO)
# and the pumps of their relays (children of a root whose $0 is
# sandboxd-relay), with shell builtins only: while a fork bomb holds the
# process limit nothing can be started, and gVisor sandboxes have no per-exec
# cgroup to freeze from the host. Stopping first, in rounds, keeps the bomb
# from refilling the slots each kill frees.
KILL_ALL = (
    "declare -A spare relays; "
    'for f in "${SANDBOXD_KEEP%/*}"/.sandboxd-shells/*.pid; do [ -e "$f" ] || continue; '
    'p=; { read -r p < "$f"; read -r s < "/proc/$p/stat"; } 2>/dev/null || continue; '
    "s=${s##*) }; set -- $s; spare[$p]=1; spare[$2]=1; done; "
    'for d in /proc/[0-9]*; do { read -r s < "$d/stat"; } 2>/dev/null || continue; s=${s##*) }; set -- $s; '
    "(($2 == 0)) || continue; a=; "
    "{ for i in 1 2 3 4; do IFS= read -r -d '' a || break; done; } 2>/dev/null < \"$d/cmdline\"; "
    '[ "$a" = sandboxd-relay ] && relays[${d#/proc/}]=1; done; '
    "each() { local sig=$1 d p s; for d in /proc/[0-9]*; do p=${d#/proc/}; ((p > 2 && p != $$)) || continue; "
    '[ -n "${spare[$p]}" ] && continue; '
    'read -r s < "$d/stat" || continue; s=${s##*) }; set -- $s; '
    '(($2 != 0)) && [ -z "${relays[$2]}" ] && kill "$sig" "$p" 2>/dev/null; done; }; '
    "for r in 1 2 3 4 5; do each -STOP; done; each -KILL; true"
)


def refused_fork(stderr: bytes) -> bool:
    """Whether ``stderr`` shows a fork or thread start refused for want of processes."""
    return _FORK_REFUSED.search(stderr) is not None


# gVisor's own host threads count against the engine's pids limit (about 26
# at rest and two per sandbox process under systrap, measured), so a gVisor
# sandbox gets this much room there and its own limit as RLIMIT_NPROC, which
# gVisor enforces on fork and clone inside.
_GVISOR_BASE_THREADS = 128
_GVISOR_THREADS_PER_TASK = 2


def engine_pids(runtime: str, pids: int) -> int:
    """The engine's pids limit for a sandbox of ``runtime`` whose own limit is ``pids``."""
    if runtime == GVISOR:
        return _GVISOR_BASE_THREADS + _GVISOR_THREADS_PER_TASK * pids
    return pids
