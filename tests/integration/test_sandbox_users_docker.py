"""A host uid per sandbox, on the real engine: sandboxes share no per-user
kernel limit (one that takes every inotify instance and queues real-time
signals to its limit leaves the others working), tools find the user on the
read-only root, and every shell of a sandbox (one-shot, session, kept) runs
as its user under the same limits."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import pytest

from sandboxd.backends.base import GVISOR, SANDBOX_UID
from sandboxd.backends.uids import DEFAULT_UIDS
from sandboxd.client import AsyncClient, Sandbox
from tests.integration.conftest import poll

pytestmark = [pytest.mark.docker, pytest.mark.timeout(240)]

LIMITS = {"memory_bytes": 256 << 20, "pids": 64}

# Takes every inotify instance its uid may have (EMFILE), then queues
# SIGRTMIN to itself, blocked, until the kernel refuses (EAGAIN), and holds
# both until killed. Under gVisor the sentry's own caps answer instead.
HOG = r"""
import ctypes, errno, json, os, signal, time
libc = ctypes.CDLL(None, use_errno=True)
fds = []
while len(fds) < 100000:
    fd = libc.inotify_init1(0)
    if fd < 0:
        inotify = errno.errorcode[ctypes.get_errno()]
        break
    fds.append(fd)
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGRTMIN})
queued, timers, timer_create = 0, [], "ok"
while queued < 1000000 and len(timers) < 1000:
    if libc.sigqueue(os.getpid(), signal.SIGRTMIN, ctypes.c_void_p(0)) == 0:
        queued += 1
        continue
    sigqueue = errno.errorcode[ctypes.get_errno()]
    # Every signal pending to the uid counts (a shell's SIGCHLD too): a slot
    # freed since is taken by a timer, until none is left (gVisor caps each
    # signal's queue instead, and its timers need no slot).
    timer = ctypes.c_void_p()
    if libc.timer_create(1, None, ctypes.byref(timer)) != 0:
        timer_create = errno.errorcode[ctypes.get_errno()]
        break
    timers.append(timer)
took = {"instances": len(fds), "inotify": inotify, "queued": queued, "sigqueue": sigqueue}
took["timer"] = timer_create
try:
    f = open("/workspace/hog.json", "w")
except OSError:  # the descriptors ran out before the instances (gVisor): room to report
    os.close(fds.pop())
    f = open("/workspace/hog.json", "w")
with f:
    json.dump(took, f)
time.sleep(3600)
"""

# What a fresh process of a sandbox can have: an inotify instance, a POSIX
# timer (which needs a queued-signal slot of its uid).
CHECK = r"""
import ctypes, errno, json
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init1(0)
inotify = "ok" if fd >= 0 else errno.errorcode[ctypes.get_errno()]
timer = ctypes.c_void_p()
r = libc.timer_create(1, None, ctypes.byref(timer))
print(json.dumps({"inotify": inotify, "timer": "ok" if r == 0 else errno.errorcode[ctypes.get_errno()]}))
"""

WHO = (
    'id -u; id -g; id -un; whoami; echo "$HOME $USER $LOGNAME"; stat -c %u:%g /workspace; '
    "python3 -c 'import getpass, os, pwd; print(getpass.getuser(), pwd.getpwuid(os.getuid()).pw_name)'"
)


@pytest.fixture
def runtime(each_runtime: str) -> str:
    return each_runtime


@pytest.fixture
async def two(client: AsyncClient, image: str, runtime: str) -> AsyncIterator[tuple[Sandbox, Sandbox]]:
    await client.create_pool("users", image, min_ready=0, max_size=4, runtime=runtime, limits=LIMITS)
    lease = await client.lease("users", n=2, lease_ttl=600, timeout=120)
    try:
        yield lease.sandboxes[0], lease.sandboxes[1]
    finally:
        await lease.release()


async def _uid(sb: Sandbox) -> int:
    r = await sb.exec("id -u")
    assert r.ok, r
    return int(r.stdout)


async def test_each_sandbox_runs_as_a_uid_of_its_own_that_tools_name(
    two: tuple[Sandbox, Sandbox], runtime: str
) -> None:
    a, b = two
    ua, ub = await _uid(a), await _uid(b)
    if runtime == GVISOR:
        # Each sentry is a kernel of its own (nothing counted per host uid),
        # and a live restore needs alike specs: the images' own user.
        assert ua == ub == SANDBOX_UID
    else:
        assert ua != ub
        for uid in (ua, ub):
            assert uid != SANDBOX_UID and DEFAULT_UIDS.base <= uid < DEFAULT_UIDS.base + DEFAULT_UIDS.count
    r = await a.exec(WHO)
    assert r.ok, r
    assert r.text.splitlines() == [
        str(ua),
        str(ua),
        "sandbox",
        "sandbox",
        "/workspace sandbox sandbox",
        f"{ua}:{ua}",
        "sandbox sandbox",
    ]
    # A session's shell is the same user; files written through the API are its.
    assert (await a.exec("id -u; id -un", session="s")).text == f"{ua}\nsandbox\n"
    await a.write_file("mine.txt", "x")
    assert (await a.exec("stat -c %u mine.txt")).text == f"{ua}\n"
    # git trusts a repository its user owns; the tables are read-only.
    r = await a.exec(
        "git init -q r && cd r && git -c user.name=n -c user.email=n@e commit -q --allow-empty -m m && "
        "git log --format=%s"
    )
    assert r.ok and r.text == "m\n", r
    assert not (await a.exec("echo x >> /etc/passwd")).ok
    tables = (await b.exec("cat /etc/passwd /etc/group")).stdout
    assert f"sandbox:x:{ub}:{ub}:".encode() in tables and f"sandbox:x:{ub}:".encode() in tables
    assert tables.startswith(b"root:x:0:0:"), "the image's other users are kept"


async def test_one_sandbox_taking_its_users_kernel_limits_leaves_the_other_working(
    two: tuple[Sandbox, Sandbox], runtime: str
) -> None:
    hog, other = two
    held = asyncio.ensure_future(hog.exec(["python3", "-c", HOG], timeout=300))
    try:
        await poll(lambda: _has(hog, "hog.json"), timeout=120, what="the hog to hold its limits")
        took = json.loads(await hog.read_file("hog.json"))
        assert took["inotify"] == "EMFILE" and took["sigqueue"] == "EAGAIN", took
        if runtime != GVISOR:
            # The host's kernel counts per uid: the hog's own uid is spent...
            assert took["timer"] == "EAGAIN" and took["queued"] > 1000, took
            assert json.loads((await hog.exec(["python3", "-c", CHECK])).stdout)["inotify"] == "EMFILE"
        # ... and the other sandbox, with a uid of its own, is untouched.
        for session in ("", "s"):
            r = await other.exec(["python3", "-c", CHECK], session=session)
            assert r.ok and json.loads(r.stdout) == {"inotify": "ok", "timer": "ok"}, r
            r = await other.exec("timeout 1 true", session=session)
            assert r.ok and r.stderr == b"", r
    finally:
        with contextlib.suppress(Exception):
            await hog.exec("pkill -f 'import ctypes, errno, json, os, signal'")
        held.cancel()
        with contextlib.suppress(BaseException):
            await held


async def test_every_shell_has_the_same_limits(two: tuple[Sandbox, Sandbox], runtime: str) -> None:
    """One-shot commands and a session's shell: the same rlimits, and the
    sandbox's pids limit holds for what a session starts."""
    sb, _ = two
    oneshot = await sb.exec("cat /proc/self/limits")
    session = await sb.exec("cat /proc/self/limits", session="lim")
    # Past the forked shells' stdin: an engine exec of its own.
    own_exec = await sb.exec("cat >/dev/null; cat /proc/self/limits", stdin=b"x" * (256 << 10))
    root = await sb.exec("cat /proc/self/limits", user="root")
    assert oneshot.ok and session.ok and own_exec.ok and root.ok
    assert oneshot.stdout == session.stdout == own_exec.stdout == root.stdout
    # The memory limit holds for a session's command as for a one-shot one
    # (under gVisor it stops the whole sandbox, test_hostile_docker).
    for where in ("", "lim") if runtime != GVISOR else ():
        r = await sb.exec("python3 -c 'b = bytearray(400 << 20)'", session=where, timeout=60)
        assert r.outcome == "OOM_KILLED", r
    # Past the pids limit: forks are refused in a session as in a one-shot
    # command, and the session goes on.
    for session in ("", "lim"):
        r = await sb.exec("for i in $(seq 100); do sleep 300 & done; wait", session=session, timeout=10)
        assert r.outcome == "PIDS_EXHAUSTED", r
    assert (await sb.exec("echo alive", session="lim")).text == "alive\n"


async def _has(sb: Sandbox, name: str) -> bool:
    return (await sb.exec(f"test -s {name}")).ok
