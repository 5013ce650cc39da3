"""The service's own steps inside a ``/run_code`` sandbox, and the launcher
that confines a request's commands and keeps the first part of their
output. Each step is a small Python program run
by the sandbox's root-owned ``python3`` (``-I -S``: no environment, no user
site, no site import) that prints one JSON line.

Steps and requests run as the same uid (the sandbox's user), so a step could
be subverted by what a request left running (a leftover process may ptrace
the step, or the sandbox's idle shells that run it, and rewrite its answer).
So every command of a request starts in a Landlock domain of its own
(LANDLOCK_SCOPE_SIGNAL and the abstract-socket scope, ABI 6): from there no
process can ptrace, open ``/proc/<pid>/mem`` of, or signal anything outside
the domain — not the steps, not the sandbox's shells, not a later request.
The steps run outside any domain: they can see and kill everything the
request left. Where the kernel has no such Landlock, sandboxes are not reused.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from sandboxd.sandbox_reset import STEP_LIB

__all__ = ["LANDLOCK_ABI", "LAUNCH_FAILED", "baseline_command", "clean_command", "launch", "setup_command"]

# The Landlock ABI whose scopes the launcher sets.
LANDLOCK_ABI = 6
# The launcher's exit status when the domain cannot be entered (the command does not run).
LAUNCH_FAILED = 125

# The kills, the digest of every writable mount and the removal are the
# shared reset steps' (sandboxd.sandbox_reset), the same a recycling pool runs.
_STEP = STEP_LIB + r"""
mode, top = sys.argv[1], sys.argv[2]
out = {}
if mode == "baseline":
    # The processes already there are the sandbox's own (its main process,
    # sandboxd's shells): the clean-up spares exactly those.
    out["digest"], out["unreadable"] = digest()
    out["infra"] = sorted(ident(p) for p in others())
    out["landlock"] = landlock_abi()
    # Which of the languages' tools the image has, on the PATH requests get.
    dirs = [d for d in os.environ.get("PATH", "").split(":") if d]
    out["tools"] = sorted(
        t for t in json.loads(sys.argv[3]) if any(os.access(os.path.join(d, t), os.X_OK) for d in dirs)
    )
elif mode == "setup":
    os.makedirs(top + "/w", mode=0o700)
    os.makedirs(top + "/h", mode=0o700)
    os.chmod(top, 0o700)
    # name -> base64, written the way SandboxFusion's restore_files does
    # (joined onto the cwd, so absolute names stay absolute).
    for name, data in json.loads(sys.stdin.buffer.read() or b"{}").items():
        path = os.path.join(top + "/w", name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))
else:
    infra = json.loads(sys.argv[4])
    out["survivors"] = kill_others(infra) if infra is not None else -1
    files = {}
    for name in json.loads(sys.argv[3]):
        path = os.path.join(top + "/w", name)
        if os.path.isfile(path) and not os.path.islink(path):
            with open(path, "rb") as f:
                files[name] = base64.b64encode(f.read()).decode()
    out["files"] = files
    out["removed"] = remove(top)
    if infra is not None:
        out["digest"] = digest()[0]
print(json.dumps(out))
"""

# Runs a request's command (``sh -c COMMAND``), in a fresh Landlock domain
# that scopes signals and abstract sockets when asked to confine it (struct
# landlock_ruleset_attr: handled_access_fs, handled_access_net, scoped).
# Prints nothing of its own. With a capture cap it relays the command's
# stdout and stderr through pipes, passing on the first CAP bytes of each and
# reading and dropping the rest: the program runs on to its own end and
# status, and its answer keeps the first part of each stream, as
# SandboxFusion's does (which, unlike this, blocks a program once its pipe
# is full). The command ends when its shell does (what is already in the
# pipes is passed on), as SandboxFusion's ends when its process does: a
# background child holding the pipes does not hold the answer. The relay
# forks before the domain is entered, so the command can neither trace,
# stop nor signal it (nor make it pass on more). Python ignores SIGPIPE and
# SIGXFSZ, and ignored signals survive exec: the command gets the defaults.
_LAUNCH = rf"""
import os, sys, _signal
command, cap, confine = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
def run():
    if confine:
        import ctypes, struct
        libc = ctypes.CDLL(None, use_errno=True)
        attr = ctypes.create_string_buffer(struct.pack("QQQ", 0, 0, 0x3), 24)
        fd = libc.syscall(444, attr, 24, 0)
        if fd < 0 or libc.syscall(446, fd, 0) != 0:
            os._exit({LAUNCH_FAILED})
        os.close(fd)
    for sig in (_signal.SIGPIPE, _signal.SIGXFSZ):
        _signal.signal(sig, _signal.SIG_DFL)
    os.execv("/bin/sh", ["sh", "-c", command])
if not cap:
    run()
pipes = [os.pipe(), os.pipe()]
pid = os.fork()
if pid == 0:
    try:
        for n, (r, w) in zip((1, 2), pipes):
            os.dup2(w, n)
        for r, w in pipes:
            os.close(r)
            os.close(w)
        run()
    finally:
        os._exit(127)
import select
room = {{}}
for n, (r, w) in zip((1, 2), pipes):
    os.close(w)
    room[r] = [n, cap]
def pump(fd):
    # One read: False once the stream is at its end (or cannot be read).
    try:
        data = os.read(fd, 1 << 16)
    except BlockingIOError:
        return False
    except OSError:
        data = b""
    if not data:
        del room[fd]
        os.close(fd)
        return False
    out, left = room[fd]
    keep = data[:left]
    room[fd][1] = left - len(keep)
    while keep:
        try:
            keep = keep[os.write(out, keep):]
        except OSError:
            # Nobody reads the answer any more: drain on, so the program is not stopped.
            room[fd][1] = 0
            break
    return True
try:
    exited = os.pidfd_open(pid)
except (AttributeError, OSError):
    exited = None
status = None
while room:
    watched = list(room) + ([exited] if exited is not None else [])
    # Without a pidfd, a look at the shell every 50 ms.
    ready = select.select(watched, [], [], None if exited is not None else 0.05)[0]
    if exited is None:
        done, st = os.waitpid(pid, os.WNOHANG)
        status = st if done else None
    if exited in ready or status is not None:
        # The shell is done: pass on what it left in the pipes, then end.
        for fd in list(room):
            os.set_blocking(fd, False)
            for _ in range(64):
                if not pump(fd):
                    break
        break
    for fd in ready:
        if fd in room:
            pump(fd)
if status is None:
    status = os.waitpid(pid, 0)[1]
code = os.waitstatus_to_exitcode(status)
os._exit(code if code >= 0 else 128 - code)
"""

_PYTHON = ["python3", "-I", "-S", "-c"]


def launch(command: str, *, confine: bool, capture: int) -> list[str]:
    """The argv that runs the shell ``command``: in a Landlock domain of its own if
    ``confine``; with ``capture`` > 0, only the first ``capture`` bytes of each of its
    output streams are passed on and the rest is dropped (the program never stops
    for its output)."""
    return [*_PYTHON, _LAUNCH, command, str(capture), "1" if confine else "0"]


def baseline_command(tools: Sequence[str] = ()) -> list[str]:
    """Reports the digest of the writable mounts, the sandbox's own processes and the
    kernel's Landlock ABI: the sandbox as it came, before any request; and which of
    ``tools`` are on its PATH (``tools``)."""
    return [*_PYTHON, _STEP, "baseline", "/", json.dumps(list(tools))]


def setup_command(top: str) -> list[str]:
    """Makes ``top`` and writes the files (JSON name -> base64 on stdin) there."""
    return [*_PYTHON, _STEP, "setup", top]


def clean_command(top: str, fetch: list[str], infra: list[str] | None) -> list[str]:
    """Kills the user's processes but ``infra``, reads ``fetch``, removes ``top`` and
    reports the digest. With ``infra`` None (a sandbox used once) it kills nothing
    and only reads and removes."""
    return [*_PYTHON, _STEP, "clean", top, json.dumps(fetch), json.dumps(infra)]
