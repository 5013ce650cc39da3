"""Warm sandboxes for ``/run_code``, reused between requests only when that is provably safe.

A container start costs hundreds of milliseconds (seconds under a burst);
a short program costs tens. So a sandbox that served one request is kept
for the next, with these rules:

- each request runs in a fresh directory ``/tmp/sf-<random>`` (``w/`` is its
  cwd, ``h/`` its HOME), made mode 0700 by a setup step;
- after the request every process of the sandbox's user is killed, not only
  the command's tree, and the directory is deleted;
- before and after, the sandbox reports a digest of everything the user can
  change outside that directory (the world-writable directories, the user's
  home, the workspace, System V IPC objects): reuse only if the digest is
  the one the sandbox had when it first came, no process of the user is left,
  and every command of the request ended by exiting (not by a time-out, an
  output cap, a memory or pid limit);
- anything else, and every sandbox after ``max_uses`` requests, is released,
  which destroys it; reused sandboxes are kept per memory limit, because the
  limit is fixed when a sandbox is acquired.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
from dataclasses import dataclass, field

from sandboxd import errors
from sandboxd.client import AsyncClient, Lease, Sandbox

__all__ = ["CLEAN_OUTCOMES", "Slot", "WarmSandboxes", "setup_command", "teardown_command"]

# Outcomes after which nothing of the request can outlive the cleanup.
CLEAN_OUTCOMES = frozenset({"EXITED"})

# Runs as the sandbox's user, in the sandbox's own python3 (root-owned, so a
# request cannot replace it). Prints one JSON line.
_PROBE = r"""
# hashlib and shutil load only where needed: OpenSSL alone costs milliseconds per request.
import base64, json, os, signal, stat, sys
ROOTS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/workspace", os.path.expanduser("~"))
def digest(skip):
    import hashlib
    h = hashlib.sha256()
    for root in ROOTS:
        for d, dirs, files in os.walk(root):
            dirs[:] = sorted(x for x in dirs if os.path.join(d, x) != skip)
            for name in [d, *(os.path.join(d, f) for f in sorted(files))]:
                try:
                    st = os.lstat(name)
                except OSError:
                    continue
                # A directory's times change with its entries, which are listed themselves.
                times = f"{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}"
                if stat.S_ISDIR(st.st_mode):
                    times = ""
                h.update(f"{name}\0{st.st_mode}\0{st.st_uid}\0{times}\n".encode())
    for ipc in ("shm", "msg", "sem"):
        try:
            h.update(open("/proc/sysvipc/" + ipc, "rb").read())
        except OSError:
            pass
    return h.hexdigest()
def ancestors():
    pids, pid = set(), os.getpid()
    while pid > 1:
        pids.add(pid)
        try:
            pid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return pids
def ident(pid):
    # pid and start time: a pid reused by a later process is another process.
    return f"{pid}:{open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()[19]}"
def others(infra=()):
    keep, uid, found = ancestors(), os.getuid(), []
    for p in os.listdir("/proc"):
        if p.isdigit() and int(p) != 1 and int(p) not in keep:
            try:
                if os.stat(f"/proc/{p}").st_uid == uid and ident(p) not in infra:
                    found.append(int(p))
            except (OSError, IndexError):
                pass
    return found
mode, top = sys.argv[1], sys.argv[2]
out = {}
if mode == "setup":
    # Only on a fresh sandbox: a kept one was checked by the last clean-up,
    # and nothing of the user's has run since.
    if sys.argv[3] == "fresh":
        out["digest"] = digest(None)
        # The processes already there are the sandbox's own (its main process,
        # sandboxd's shells): the clean-up spares exactly those.
        out["infra"] = sorted(ident(p) for p in others())
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
    # Stop first so a forking process cannot outrun the kills, then kill.
    infra = set(json.loads(sys.argv[4]))
    for _ in range(20):
        found = others(infra)
        if not found:
            break
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for p in found:
                try:
                    os.kill(p, sig)
                except OSError:
                    pass
    out["survivors"] = len(others(infra))
    files = {}
    for name in json.loads(sys.argv[3]):
        path = os.path.join(top + "/w", name)
        if os.path.isfile(path) and not os.path.islink(path):
            with open(path, "rb") as f:
                files[name] = base64.b64encode(f.read()).decode()
    out["files"] = files
    import shutil
    shutil.rmtree(top, ignore_errors=True)
    out["digest"] = digest(None)
print(json.dumps(out))
"""


# -I: no environment variables or user site-packages; -S: no site import (faster start).
_PYTHON = ["python3", "-I", "-S", "-c", _PROBE]


def setup_command(top: str, *, fresh: bool) -> list[str]:
    """The argv that makes ``top`` and writes the files (JSON on stdin) there; on a ``fresh``
    sandbox it first reports the digest and the sandbox's own processes."""
    return [*_PYTHON, "setup", top, "fresh" if fresh else "kept"]


def teardown_command(top: str, fetch: list[str], infra: list[str]) -> list[str]:
    """The argv that kills the user's processes but ``infra``, reads ``fetch``, deletes ``top``
    and reports the digest."""
    return [*_PYTHON, "teardown", top, json.dumps(fetch), json.dumps(infra)]


@dataclass(eq=False)
class Slot:
    """A warm sandbox held under its own lease."""

    lease: Lease
    sandbox: Sandbox
    memory_bytes: int
    baseline: str = ""
    infra: list[str] = field(default_factory=list)
    """The sandbox's own processes (pid:start time), found on its first use."""
    uses: int = 0
    heartbeat_at: float = field(default_factory=time.monotonic)

    def new_top(self) -> str:
        """A fresh per-request directory name."""
        return f"/tmp/sf-{secrets.token_hex(8)}"


class WarmSandboxes:
    """Leases sandboxes from ``pool`` and keeps the clean ones for reuse (see the module docstring)."""

    def __init__(
        self,
        client: AsyncClient,
        pool: str,
        *,
        max_uses: int = 50,
        max_idle: int = 64,
        lease_ttl: float = 120.0,
    ) -> None:
        self.client = client
        self.pool = pool
        self.max_uses = max_uses
        self.max_idle = max_idle
        self.lease_ttl = lease_ttl
        self._idle: dict[int, list[Slot]] = {}
        self._held: set[Slot] = set()
        self._waiters: dict[int, list[asyncio.Future[Slot]]] = {}
        self._releasing: set[asyncio.Future[None]] = set()
        self._closed = False
        self._keeper: asyncio.Task[None] | None = None
        self.reused = 0
        self.destroyed = 0

    def in_use(self) -> list[str]:
        """Ids of the sandboxes serving a request now."""
        return [slot.sandbox.id for slot in self._held]

    async def take(self, memory_bytes: int, timeout: float) -> Slot:
        """A clean sandbox with this memory limit (0 = the pool's): a kept one, one another
        request gives back while this waits, or a new lease, whichever comes first."""
        if self._keeper is None:
            self._keeper = asyncio.create_task(self._heartbeats())
        idle = self._idle.get(memory_bytes)
        if idle:
            self.reused += 1
            return self._hold(idle.pop())
        # With the pool at its size, a new lease waits for a release that a
        # kept sandbox never makes: so a sandbox given back meanwhile serves too.
        handed: asyncio.Future[Slot] = asyncio.get_running_loop().create_future()
        waiters = self._waiters.setdefault(memory_bytes, [])
        waiters.append(handed)
        leasing = asyncio.create_task(self._lease(memory_bytes, timeout))
        try:
            await asyncio.wait({handed, leasing}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            leasing.cancel()
            leasing.add_done_callback(self._adopt)
            if handed.done():
                self._offer(handed.result())
            raise
        finally:
            if handed in waiters:
                waiters.remove(handed)
        if handed.done():
            leasing.cancel()
            # A lease granted as it was cancelled is kept for the next request.
            leasing.add_done_callback(self._adopt)
            self.reused += 1
            return self._hold(handed.result())
        handed.cancel()
        return self._hold(leasing.result())

    async def _lease(self, memory_bytes: int, timeout: float) -> Slot:
        limits = {"memory_bytes": memory_bytes} if memory_bytes else None
        lease = await self.client.lease(self.pool, lease_ttl=self.lease_ttl, timeout=timeout, limits=limits)
        return Slot(lease, lease[0], memory_bytes)

    def _hold(self, slot: Slot) -> Slot:
        self._held.add(slot)
        return slot

    def _adopt(self, task: asyncio.Task[Slot]) -> None:
        if not task.cancelled() and task.exception() is None:
            self._offer(task.result())

    def _offer(self, slot: Slot) -> None:
        # A waiting request first; else kept, up to max_idle.
        for waiter in self._waiters.get(slot.memory_bytes, []):
            if not waiter.done():
                waiter.set_result(slot)
                return
        idle = self._idle.setdefault(slot.memory_bytes, [])
        if self._closed or len(idle) >= self.max_idle:
            task = asyncio.ensure_future(self._release(slot))
            self._releasing.add(task)
            task.add_done_callback(self._releasing.discard)
            return
        idle.append(slot)

    async def give_back(self, slot: Slot, *, clean: bool) -> None:
        """Keeps ``slot`` for the next request if ``clean`` and under its use count; else destroys it."""
        self._held.discard(slot)
        slot.uses += 1
        if clean and not self._closed and slot.uses < self.max_uses:
            self._offer(slot)
            return
        await self._release(slot)

    async def _release(self, slot: Slot) -> None:
        self.destroyed += 1
        with contextlib.suppress(errors.SandboxdError):
            await slot.lease.release()

    async def _heartbeats(self) -> None:
        # Idle sandboxes are held only by this process: keep their leases alive.
        while not self._closed:
            await asyncio.sleep(self.lease_ttl / 3)
            now = time.monotonic()
            for slot in [s for group in self._idle.values() for s in group] + list(self._held):
                if now - slot.heartbeat_at < self.lease_ttl / 3:
                    continue
                try:
                    await slot.lease.heartbeat(self.lease_ttl)
                    slot.heartbeat_at = now
                except errors.SandboxdError:
                    # Expired or gone: forget it; a held one fails its request on its own.
                    for group in self._idle.values():
                        if slot in group:
                            group.remove(slot)

    async def close(self) -> None:
        """Destroys every kept sandbox and stops the heartbeats."""
        self._closed = True
        if self._keeper is not None:
            self._keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keeper
        slots = [s for group in self._idle.values() for s in group]
        self._idle.clear()
        await asyncio.gather(*(self._release(s) for s in slots), *self._releasing)
