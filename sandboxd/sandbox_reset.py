"""Resetting a used sandbox in place and checking it: the one mechanism both
a recycling pool (sandboxd.core.pools.recycle) and run-code's reuse
(sandboxd.adapters.sandboxfusion_warm) run.

Each step is a small Python program run by the sandbox's root-owned
``python3`` (``-I -S``: no environment, no user site, no site import), as
the sandbox's user, that prints one JSON line. The *baseline*, taken once
before anything of a tenant runs, records what the sandbox is as it came:
a digest of every writable mount (names, modes, owners, sizes and times,
and the SysV IPC tables), the paths those mounts hold, the sandbox's own
processes and a fingerprint of each (executable, command line, tracer,
threads, its executable mappings and how many of their pages were copied on write).
The *reset* stops and kills every other process, removes every path the
baseline did not list (and every SysV IPC object of the user), then digests
again. A sandbox passes (``verdict``) only if nothing survived, every own
process is there with its fingerprint unchanged (a leftover that traced one
and rewrote its code would show), nothing was left that could not be
removed, and the digest is the baseline's: a path the tenant changed rather
than added is never "restored", it makes the sandbox fail.

Nothing here imports the server or the client: both sides import it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "STEP_LIB",
    "Baseline",
    "ResetReport",
    "baseline_argv",
    "parse_baseline",
    "parse_report",
    "reset_argv",
    "reset_stdin",
    "verdict",
]

# The functions every step uses; a step appends its own dispatch. hashlib
# and shutil load only where needed: OpenSSL alone costs milliseconds per step.
STEP_LIB = r"""
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
def others(infra=(), any_user=False):
    # Live processes (the user's, or anyone's) but this step's own chain and
    # the sandbox's own (infra). A zombie is not one: nothing of it runs any more.
    keep, uid, found = ancestors(), os.getuid(), []
    for p in os.listdir("/proc"):
        if p.isdigit() and int(p) != 1 and int(p) not in keep:
            try:
                if any_user or os.stat(f"/proc/{p}").st_uid == uid:
                    fs = fields(p)
                    if fs[0] not in "ZX" and ident(p, fs) not in infra:
                        found.append(int(p))
            except (OSError, IndexError):
                pass
    return found
def kill_others(infra, any_user=False, seconds=3.0):
    # Stop first so a forking process cannot outrun the kills, then kill, in
    # rounds until none is left alive. A killed process still shows as
    # running until it is scheduled to exit, which on a busy host takes a
    # while: so the rounds are bounded by time, not by count.
    found, deadline = [], time.monotonic() + seconds
    while True:
        found = others(set(infra), any_user)
        if not found or time.monotonic() > deadline:
            return len(found)
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for p in found:
                try:
                    os.kill(p, sig)
                except OSError:
                    pass
        time.sleep(0.002)
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
def walk(root, onerror=None):
    # Every path below one writable mount, not crossing into another mount.
    try:
        top = os.lstat(root)
    except OSError:
        return
    yield root, top
    if not stat.S_ISDIR(top.st_mode):
        return
    for d, dirs, files in os.walk(root, onerror=onerror):
        kept = []
        for x in sorted(dirs):
            path = os.path.join(d, x)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            yield path, st
            if st.st_dev == top.st_dev:
                kept.append(x)
        dirs[:] = kept
        for f in sorted(files):
            try:
                yield os.path.join(d, f), os.lstat(os.path.join(d, f))
            except OSError:
                continue
def digest(skip=None):
    # Every writable mount, not only /tmp: what a tenant can change anywhere.
    import hashlib
    h, unreadable = hashlib.sha256(), 0
    def failed(_):
        nonlocal unreadable
        unreadable += 1
    skipped = None
    for root in writable_mounts():
        for name, st in walk(root, failed):
            if skip and (name == skip or name.startswith(skip + "/")):
                continue
            times = f"{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}"
            # A directory's times change with its entries, which are listed
            # themselves; a device's, a FIFO's or a socket's with the I/O
            # through it (the sandbox's own shells start on FIFOs).
            if stat.S_ISDIR(st.st_mode) or stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) or \
                    stat.S_ISFIFO(st.st_mode) or stat.S_ISSOCK(st.st_mode):
                times = f"{st.st_rdev}"
            h.update(f"{name}\0{st.st_mode}\0{st.st_uid}\0{st.st_gid}\0{times}\n".encode())
    for ipc in ("shm", "msg", "sem"):
        try:
            h.update(open("/proc/sysvipc/" + ipc, "rb").read())
        except OSError:
            pass
    return h.hexdigest(), unreadable
def listing():
    return sorted(name for root in writable_mounts() for name, _ in walk(root))
def landlock_abi():
    libc = ctypes.CDLL(None, use_errno=True)
    # landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)
    return max(libc.syscall(444, None, 0, 1), 0)
def remove(path):
    import shutil
    if os.path.isdir(path) and not os.path.islink(path):
        # Directories the tenant made unreadable or unwritable: their owner
        # may open them again, each before the walk goes into it.
        try:
            os.chmod(path, 0o700)
        except OSError:
            pass
        for d, dirs, _ in os.walk(path):
            for x in dirs:
                try:
                    if not os.path.islink(os.path.join(d, x)):
                        os.chmod(os.path.join(d, x), 0o700)
                except OSError:
                    pass
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        try:
            os.unlink(path)
        except OSError:
            pass
    return not os.path.lexists(path)
def own_infra():
    # The sandbox's own processes: its init (pid 1) and what init started
    # before any tenant ran (the main process; a keeper and its relays).
    out = []
    for p in os.listdir("/proc"):
        if p.isdigit() and int(p) not in ancestors():
            try:
                fs = fields(p)
                if int(p) == 1 or int(fs[1]) == 1:
                    out.append(ident(p, fs))
            except (OSError, IndexError, ValueError):
                pass
    return sorted(out)
def fingerprint(pid):
    # What a process that traced this one and rewrote it would change: its
    # program, arguments, tracer, thread count, executable mappings, and
    # the anonymous pages of those: code overwritten through /proc/<pid>/mem
    # is copied on write into one. Not their dirty pages: a file page of a
    # just-unpacked image is dirty until written back, then clean. Under
    # gVisor's systrap (a [usertrap] mapping) the platform itself copies text
    # pages as it patches each syscall site first run, so there the count
    # would move on its own and is left out.
    import hashlib
    h = hashlib.sha256()
    try:
        h.update(os.readlink(f"/proc/{pid}/exe").encode())
    except OSError:
        h.update(b"?exe")
    h.update(open(f"/proc/{pid}/cmdline", "rb").read())
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(("TracerPid:", "Threads:")):
            h.update(line.encode())
    exe, copied, patched = False, 0, False
    for line in open(f"/proc/{pid}/smaps"):
        parts = line.split()
        if len(parts) >= 5 and "-" in parts[0] and len(parts[1]) == 4:
            exe = "x" in parts[1]
            patched = patched or parts[5:] == ["[usertrap]"]
            if exe:
                h.update((" ".join([parts[0], parts[1]] + parts[5:]) + "\n").encode())
        elif exe and parts and parts[0] == "Anonymous:":
            copied += int(parts[1])
    h.update(b"patched" if patched else f"copied {copied}".encode())
    return h.hexdigest()
def fingerprints(idents):
    out = {}
    for i in idents:
        pid = i.split(":")[0]
        try:
            if ident(pid) == i:
                out[i] = fingerprint(pid)
        except (OSError, IndexError):
            pass
    return out
def remove_ipc():
    # SysV IPC objects are not files: every one the user owns goes.
    libc = ctypes.CDLL(None, use_errno=True)
    uid, left = os.getuid(), 0
    rmid = {"shm": lambda i: libc.shmctl(i, 0, None), "msg": lambda i: libc.msgctl(i, 0, None),
            "sem": lambda i: libc.semctl(i, 0, 0)}
    if not os.path.exists("/proc/sysvipc"):
        # A kernel without the tables (gVisor): its ids are small and handed
        # out in order, so every id up to IPC_PROBE is tried (IPC_STAT).
        buf = ctypes.create_string_buffer(512)
        stat_of = {"shm": lambda i: libc.shmctl(i, 2, buf), "msg": lambda i: libc.msgctl(i, 2, buf),
                   "sem": lambda i: libc.semctl(i, 0, 2, buf)}
        for table in ("shm", "msg", "sem"):
            for i in range(IPC_PROBE):
                if stat_of[table](i) == 0:
                    left += rmid[table](i) != 0 and stat_of[table](i) == 0
        return left
    for table, col in (("shm", 7), ("msg", 7), ("sem", 4)):
        try:
            rows = open("/proc/sysvipc/" + table).read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if len(cols) > col and int(cols[col]) == uid:
                left += rmid[table](int(cols[1])) != 0
            elif len(cols) > col:
                left += 1
    return left
IPC_PROBE = 1024
def events():
    # The sandbox's cgroup counters of OOM kills and forks refused at its
    # pids limit (v1 or v2 layout); -1 where it cannot see them.
    def read(paths, key):
        for path in paths:
            try:
                for line in open(path):
                    if line.startswith(key + " "):
                        return int(line.split()[1])
            except (OSError, ValueError, IndexError):
                pass
        return -1
    c = "/sys/fs/cgroup/"
    return [read([c + "memory.events", c + "memory/memory.oom_control"], "oom_kill"),
            read([c + "pids.events", c + "pids/pids.events"], "max")]
def wipe(keep):
    # Removes every path of the writable mounts the baseline did not list
    # (deepest first: a directory goes with what it holds).
    keep, left, removed = set(keep), 0, 0
    extra = [name for root in writable_mounts() for name, _ in walk(root) if name not in keep]
    for name in sorted(extra, key=lambda n: -n.count("/")):
        if os.path.lexists(name):
            if remove(name):
                removed += 1
            else:
                left += 1
    return removed, left
"""

# The pool's two steps: take the baseline, reset against it.
_POOL_STEP = (
    STEP_LIB
    + r"""
mode = sys.argv[1]
out = {}
if mode == "baseline":
    out["digest"], out["unreadable"] = digest()
    out["infra"] = own_infra()
    out["fingerprints"] = fingerprints(out["infra"])
    out["listing"] = listing()
    out["events"] = events()
else:
    base = json.loads(sys.stdin.read())
    infra = base["infra"]
    out["survivors"] = kill_others(infra, any_user=True)
    now = fingerprints(infra)
    out["infra_changed"] = sorted(i for i in infra if now.get(i) != base["fingerprints"].get(i))
    out["removed"], out["left"] = wipe(base["listing"])
    out["ipc_left"] = remove_ipc()
    out["digest"] = digest()[0]
    out["events"] = events()
print(json.dumps(out))
"""
)

_PYTHON = ("python3", "-I", "-S", "-c")

# Most paths a baseline may list: a sandbox whose writable mounts hold more
# at start (an image that fills its scratch) is not recycled.
MAX_LISTING = 20_000


@dataclass(frozen=True)
class Baseline:
    """A sandbox as it came, before any tenant ran: what a reset restores and checks against."""

    digest: str
    infra: tuple[str, ...]
    """Its own processes, as ``pid:start time``."""
    fingerprints: Mapping[str, str]
    listing: tuple[str, ...]
    """Every path its writable mounts held."""
    unreadable: int = 0
    events: tuple[int, ...] = ()
    """Its cgroup's OOM kills and pids-limit refusals so far (-1: not visible)."""

    @property
    def usable(self) -> str:
        """ "" when a reset can be trusted against this baseline; else why not."""
        if self.unreadable:
            return f"{self.unreadable} paths of its writable mounts cannot be read"
        if not any(i.startswith("1:") for i in self.infra):
            return "its init process is not visible"
        if len(self.listing) > MAX_LISTING:
            return f"its writable mounts hold {len(self.listing)} paths at start"
        return ""


@dataclass(frozen=True)
class ResetReport:
    """What a reset found and did."""

    survivors: int
    infra_changed: tuple[str, ...]
    removed: int
    left: int
    ipc_left: int
    digest: str
    events: tuple[int, ...] = ()


def baseline_argv() -> list[str]:
    """The argv of the baseline step (run as the sandbox's user, before any tenant)."""
    return [*_PYTHON, _POOL_STEP, "baseline"]


def parse_baseline(stdout: bytes | str) -> Baseline:
    """The baseline step's answer; ValueError when it is not one."""
    out: dict[str, Any] = json.loads(stdout)
    try:
        return Baseline(
            digest=str(out["digest"]),
            infra=tuple(str(i) for i in out["infra"]),
            fingerprints={str(k): str(v) for k, v in dict(out["fingerprints"]).items()},
            listing=tuple(str(p) for p in out["listing"]),
            unreadable=int(out.get("unreadable") or 0),
            events=tuple(int(n) for n in out.get("events") or ()),
        )
    except (KeyError, TypeError) as e:
        raise ValueError(f"not a baseline: {e}") from e


def reset_argv() -> list[str]:
    """The argv of the reset step; its stdin is ``reset_stdin(baseline)``."""
    return [*_PYTHON, _POOL_STEP, "reset"]


def reset_stdin(baseline: Baseline) -> bytes:
    """The reset step's input: the baseline it restores and checks against."""
    return json.dumps(
        {
            "infra": list(baseline.infra),
            "fingerprints": dict(baseline.fingerprints),
            "listing": list(baseline.listing),
        }
    ).encode()


def parse_report(stdout: bytes | str) -> ResetReport:
    """The reset step's answer; ValueError when it is not one."""
    out: dict[str, Any] = json.loads(stdout)
    try:
        return ResetReport(
            survivors=int(out["survivors"]),
            infra_changed=tuple(str(i) for i in out["infra_changed"]),
            removed=int(out["removed"]),
            left=int(out["left"]),
            ipc_left=int(out["ipc_left"]),
            digest=str(out["digest"]),
            events=tuple(int(n) for n in out.get("events") or ()),
        )
    except (KeyError, TypeError) as e:
        raise ValueError(f"not a reset report: {e}") from e


def verdict(baseline: Baseline, report: ResetReport) -> str:
    """ "" when the reset left the sandbox as its baseline; else what is in doubt."""
    doubts: list[str] = []
    if report.survivors:
        doubts.append(f"{report.survivors} processes survived the kill")
    if report.infra_changed:
        doubts.append(f"its own processes changed or are gone ({', '.join(report.infra_changed[:4])})")
    if report.left:
        doubts.append(f"{report.left} paths could not be removed")
    if report.ipc_left:
        doubts.append(f"{report.ipc_left} IPC objects could not be removed")
    if report.events != baseline.events:
        doubts.append("it had an OOM kill or hit its pids limit")
    if report.digest != baseline.digest:
        doubts.append("its writable mounts differ from the image's (a path was changed, not added)")
    return "; ".join(doubts)
