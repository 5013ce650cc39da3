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

__all__ = ["LANDLOCK_ABI", "LAUNCH_FAILED", "baseline_command", "clean_command", "launch", "setup_command"]

# The Landlock ABI whose scopes the launcher sets.
LANDLOCK_ABI = 6
# The launcher's exit status when the domain cannot be entered (the command does not run).
LAUNCH_FAILED = 125

# hashlib and shutil load only where needed: OpenSSL alone costs milliseconds per step.
_STEP = r"""
import base64, ctypes, json, os, signal, stat, sys, time
def fields(pid):
    # /proc/<pid>/stat from the state on (the name before it may hold anything).
    return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
def ident(pid, fs=None):
    # pid and start time: a pid reused by a later process is another process.
    return f"{pid}:{(fs or fields(pid))[19]}"
def ancestors():
    pids, pid = set(), os.getpid()
    while pid > 1:
        pids.add(pid)
        try:
            pid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return pids
def others(infra=()):
    # The user's live processes but this step's own chain and the sandbox's
    # own (infra). A zombie is not one: nothing of it runs any more.
    keep, uid, found = ancestors(), os.getuid(), []
    for p in os.listdir("/proc"):
        if p.isdigit() and int(p) != 1 and int(p) not in keep:
            try:
                if os.stat(f"/proc/{p}").st_uid == uid:
                    fs = fields(p)
                    if fs[0] not in "ZX" and ident(p, fs) not in infra:
                        found.append(int(p))
            except (OSError, IndexError):
                pass
    return found
# File systems whose entries the kernel makes, not a process: never walked.
VIRTUAL = {"proc", "sysfs", "cgroup", "cgroup2", "devpts", "securityfs", "debugfs", "tracefs",
           "bpf", "pstore", "fusectl", "configfs", "binfmt_misc", "nsfs"}
def writable_mounts():
    found = []
    for line in open("/proc/self/mountinfo"):
        fields = line.split()
        fstype = fields[fields.index("-") + 1]
        if "rw" in fields[5].split(",") and fstype not in VIRTUAL:
            found.append(fields[4].encode().decode("unicode_escape"))
    return sorted(set(found))
def digest(skip):
    # Every writable mount, not only /tmp: what a request can change anywhere.
    import hashlib
    h, unreadable = hashlib.sha256(), 0
    def entry(name, st):
        times = f"{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}"
        # A directory's times change with its entries, which are listed
        # themselves; a device's with the I/O through it.
        if stat.S_ISDIR(st.st_mode) or stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
            times = f"{st.st_rdev}"
        h.update(f"{name}\0{st.st_mode}\0{st.st_uid}\0{st.st_gid}\0{times}\n".encode())
    def failed(_):
        nonlocal unreadable
        unreadable += 1
    for root in writable_mounts():
        try:
            top = os.lstat(root)
        except OSError:
            continue
        entry(root, top)
        if not stat.S_ISDIR(top.st_mode):
            continue
        for d, dirs, files in os.walk(root, onerror=failed):
            kept = []
            for x in sorted(dirs):
                path = os.path.join(d, x)
                if path == skip:
                    continue
                try:
                    st = os.lstat(path)
                except OSError:
                    continue
                entry(path, st)
                # Another mount below is walked (or not) as itself.
                if st.st_dev == top.st_dev:
                    kept.append(x)
            dirs[:] = kept
            for f in sorted(files):
                try:
                    entry(os.path.join(d, f), os.lstat(os.path.join(d, f)))
                except OSError:
                    continue
    for ipc in ("shm", "msg", "sem"):
        try:
            h.update(open("/proc/sysvipc/" + ipc, "rb").read())
        except OSError:
            pass
    return h.hexdigest(), unreadable
def landlock_abi():
    libc = ctypes.CDLL(None, use_errno=True)
    # landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)
    return max(libc.syscall(444, None, 0, 1), 0)
def remove(path):
    import shutil
    def reopen(fn, p, _):
        # A directory the request made unwritable: its owner may open it again.
        os.chmod(os.path.dirname(p), 0o700)
        fn(p)
    if os.path.lexists(path):
        shutil.rmtree(path, onerror=reopen)
    return not os.path.lexists(path)
mode, top = sys.argv[1], sys.argv[2]
out = {}
if mode == "baseline":
    # The processes already there are the sandbox's own (its main process,
    # sandboxd's shells): the clean-up spares exactly those.
    out["digest"], out["unreadable"] = digest(None)
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
    # Stop first so a forking process cannot outrun the kills, then kill, in
    # rounds until none is left alive. A killed process still shows as
    # running until it is scheduled to exit, which on a busy host takes a
    # while: so the rounds are bounded by time, not by count.
    infra = json.loads(sys.argv[4])
    found, deadline = [], time.monotonic() + 3.0
    while infra is not None:
        found = others(set(infra))
        if not found or time.monotonic() > deadline:
            break
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for p in found:
                try:
                    os.kill(p, sig)
                except OSError:
                    pass
        time.sleep(0.002)
    out["survivors"] = len(found) if infra is not None else -1
    files = {}
    for name in json.loads(sys.argv[3]):
        path = os.path.join(top + "/w", name)
        if os.path.isfile(path) and not os.path.islink(path):
            with open(path, "rb") as f:
                files[name] = base64.b64encode(f.read()).decode()
    out["files"] = files
    out["removed"] = remove(top)
    if infra is not None:
        out["digest"] = digest(None)[0]
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
