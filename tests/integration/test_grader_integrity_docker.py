"""A grader put in a sandbox by root cannot be changed by the sandbox's user
through any write the API offers, against the real engine: small writes
(from the host where it can, else through the sandbox), large ones (above
the host-side limit: always through the sandbox), uploads and the Prime
adapter's upload, before and after a snapshot is restored; each refused
PERMISSION_DENIED, the same on every path, with nothing written and nothing
left behind, while root's own call does it. A call is all or nothing, and a
sandbox racing the host-side writer to swap root's directory in never gets
it opened to it. Each test runs with host-side writes on and off (runc) and
under gVisor, where every write goes through the sandbox."""

from __future__ import annotations

import asyncio
import contextlib
import io
import tarfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import docker
import pytest

from sandboxd import errors
from sandboxd.app import App
from sandboxd.backends.base import GVISOR, RUNC
from sandboxd.backends.docker import backend as docker_backend
from sandboxd.backends.hostwrite import write_files
from sandboxd.client import AsyncClient, Sandbox
from tests.integration.conftest import NO_GVISOR, gvisor_registered, make_settings, poll, running_app

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

MODES = [
    pytest.param(("in-place", RUNC), id="in-place"),
    pytest.param(("through-sandbox", RUNC), id="through-sandbox"),
    pytest.param(("through-sandbox", GVISOR), id="gvisor"),
]

LARGE = 5 << 20  # above the host-side writer's limit (4 MiB)


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest, engine: docker.DockerClient) -> tuple[str, str]:
    write, runtime = request.param
    if runtime == GVISOR and not gvisor_registered(engine):
        pytest.skip(NO_GVISOR)
    return str(write), str(runtime)


@pytest.fixture
def runtime(mode: tuple[str, str]) -> str:
    return mode[1]


@pytest.fixture
async def app(
    mode: tuple[str, str], tmp_path: Path, engine: docker.DockerClient, image: str
) -> AsyncIterator[App]:
    settings = make_settings(tmp_path, **{"backend.host_workspaces": mode[0] == "in-place"})
    async with running_app(settings, engine) as app:
        yield app


@pytest.fixture
def host_writes(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """What each host-side write did: "written", "left" (to the sandbox) or
    the class name of what it raised."""
    seen: list[str] = []

    def recorded(*args: object) -> bool:
        try:
            done = write_files(*args)  # type: ignore[arg-type]
        except Exception as e:
            seen.append(type(e).__name__)
            raise
        seen.append("written" if done else "left")
        return done

    monkeypatch.setattr(docker_backend, "write_files", recorded)
    yield seen


GRADER = r"""
set -e
cd /workspace
mkdir tests secret
printf 'assert solve() == 42\n' > tests/test.py
printf 'k3y' > secret/key
chmod 0755 tests && chmod 0644 tests/test.py && chmod 0700 secret && chmod 0600 secret/key
"""
SHOW = (
    "cd /workspace && find tests secret -printf '%U:%G %m %s %p\\n' | LC_ALL=C sort"
    " && md5sum tests/* secret/*"
)
TEMPS = "find / -xdev -name '.sandboxd-put*' 2>/dev/null | head -5"


def tar_of(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


WRITES: list[tuple[str, dict[str, bytes]]] = [
    ("small", {"tests/test.py": b"assert True\n"}),
    ("small", {"tests/conftest.py": b"import pytest\n"}),
    ("small", {"tests/sub/test_more.py": b"x"}),
    ("small", {"secret/key": b"forged"}),
    ("small", {"secret/new": b"x"}),
    ("small", {"allowed.txt": b"fine", "tests/test.py": b"assert True\n"}),
    ("large", {"tests/test.py": b"#" * LARGE}),
    ("large", {"secret/key": b"#" * LARGE}),
    ("large", {"allowed.txt": b"fine", "tests/conftest.py": b"#" * LARGE}),
]
UPLOADS: list[tuple[str, dict[str, bytes]]] = [
    ("/workspace", {"tests/test.py": b"assert True\n"}),
    ("/workspace", {"allowed.txt": b"fine", "tests/conftest.py": b"x"}),
    ("/workspace/tests", {"test.py": b"assert True\n"}),
    ("/workspace/secret", {"key": b"forged"}),
]


async def refused_everywhere(sb: Sandbox, client: AsyncClient) -> None:
    """Every write of the grader as the sandbox's user is PERMISSION_DENIED,
    changes nothing and leaves nothing behind."""
    before = await sb.exec(SHOW, user="root")
    assert before.ok, before
    for size, files in WRITES:
        with pytest.raises(errors.PermissionDenied, match="permission denied") as got:
            await sb.write_files(files)
        named = got.value.message
        assert "/workspace/tests" in named or "/workspace/secret" in named, (size, files.keys(), named)
        assert (await sb.exec("test ! -e allowed.txt")).ok, ("all or nothing", size, files.keys())
    for dest, files in UPLOADS:
        with pytest.raises(errors.PermissionDenied, match="permission denied"):
            await client.upload_dir(sb.id, tar_of(files), dest)
        assert (await sb.exec("test ! -e allowed.txt")).ok, ("all or nothing", dest, files.keys())
    assert (await sb.exec(SHOW, user="root")).text == before.text
    assert (await sb.exec(TEMPS, user="root")).text.strip() == ""


async def test_the_grader_refuses_every_write_by_the_user_and_takes_roots(
    mode: tuple[str, str], app: App, client: AsyncClient, pool: str, host_writes: list[str]
) -> None:
    async with client.acquire(pool, timeout=60) as sb:
        # Root (with no capabilities) creates in the workspace where it is
        # open to all, as a runc sandbox's is; a gVisor sandbox's is opened so.
        assert (await sb.exec("chmod 1777 /workspace")).ok
        assert (await sb.exec(GRADER, user="root")).ok
        await refused_everywhere(sb, client)
        small = sum(1 for size, _ in WRITES if size == "small")
        if mode[0] == "in-place":
            assert host_writes == ["PermissionDenied"] * small, "the small writes were refused from the host"
        else:
            assert host_writes == []
        # Root's own call does it, whatever its size, and the file stays root's.
        await sb.write_files({"tests/test.py": b"assert solve() == 43\n"}, user="root")
        await sb.write_files({"tests/data.bin": b"\1" * LARGE}, user="root")
        shown = await sb.exec("stat -c '%u:%g %a %s' tests/test.py tests/data.bin; cat tests/test.py")
        assert shown.text.splitlines() == ["0:0 644 21", f"0:0 644 {LARGE}", "assert solve() == 43"], shown
        # And what the user may do is done: its own file, replaced, is its own.
        await sb.write_files({"mine.txt": b"fine"})
        await sb.write_files({"mine.txt": b"#" * LARGE})
        assert (await sb.exec("stat -c '%U %s' mine.txt")).text.strip() == f"sandbox {LARGE}"
        snap = await sb.snapshot()
    restored = await client.restore(snap.id, timeout=90)
    try:
        await refused_everywhere(restored[0], client)
    finally:
        await restored.release()


async def test_a_call_whose_last_file_meets_a_directory_changes_nothing(
    client: AsyncClient, pool: str, host_writes: list[str]
) -> None:
    async with client.acquire(pool, timeout=60) as sb:
        assert (await sb.exec("mkdir -p d/sub && printf old > a.txt")).ok
        for size in (1, LARGE):
            files = {"a.txt": b"n" * size, "made/b.txt": b"b", "d": b"x"}
            with pytest.raises(errors.FailedPrecondition, match="/workspace/d is a directory"):
                await sb.write_files(files)
            r = await sb.exec("cat a.txt; test ! -e made && test -d d/sub && echo intact")
            assert r.text.strip() == "oldintact", (size, r)
            assert (await sb.exec(TEMPS, user="root")).text.strip() == ""


# Round i: the racer says ready<i>, then spins on one atomic exchange of
# root's vault with new<i>; the host writes new<i>/f.txt, and the moment it
# has made the directory, root's vault takes its place, before the host
# opens it. At done<i> (the round is over) the racer counts a leak if the
# vault became the user's, opened up, or readable, and swaps it back.
RACER = r"""
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD, EXCHANGE = -100, 2
def exchange(a, b):
    return libc.renameat2(AT_FDCWD, a.encode(), AT_FDCWD, b.encode(), EXCHANGE) == 0
def swapped(i):
    spins = 0
    while True:
        if exchange("vault", f"new{i}"):
            return True
        if ctypes.get_errno() != errno.ENOENT or os.path.exists(f"done{i}"):
            return False
        spins += 1
        if not spins & 0xFFF and os.path.exists("stop"):
            return False
os.chdir("/workspace")
me, swaps, leaks, i = os.getuid(), 0, 0, 0
while not os.path.exists("stop"):
    open(f"ready{i}", "w").close()
    if swapped(i):
        swaps += 1
        while not os.path.exists(f"done{i}") and not os.path.exists("stop"):
            pass
        st = os.stat(f"new{i}")
        if st.st_uid == me or st.st_mode & 0o077:
            leaks += 1
        for probe in (lambda: os.listdir(f"new{i}"), lambda: open(f"new{i}/marker").read()):
            try:
                probe()
                leaks += 1
            except OSError:
                pass
        exchange("vault", f"new{i}")
    while not os.path.exists(f"done{i}") and not os.path.exists("stop"):
        pass
    i += 1
print(swaps, leaks)
"""


async def test_swapping_roots_directory_in_while_the_host_writes_gains_nothing(
    tmp_path: Path, engine: docker.DockerClient, image: str, host_writes: list[str]
) -> None:
    settings = make_settings(tmp_path, **{"backend.host_workspaces": True})
    async with running_app(settings, engine) as app, AsyncClient(app.address) as client:
        await client.create_pool("race", image, min_ready=1, max_size=2, runtime=RUNC)
        async with client.acquire("race", timeout=60) as sb:
            made = await sb.exec(
                "mkdir /workspace/vault && printf s3 > /workspace/vault/marker && "
                "chmod 0600 /workspace/vault/marker && chmod 0700 /workspace/vault",
                user="root",
            )
            assert made.ok, made
            racer = asyncio.create_task(sb.exec(["python3", "-c", RACER], timeout=240))
            outcomes: dict[str, int] = {}
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 120
            rounds = 0
            try:
                while rounds < 200 and loop.time() < deadline:
                    ready = await sb.exec(f"until [ -e ready{rounds} ]; do sleep 0.001; done", timeout=30)
                    assert ready.ok, ready
                    try:
                        await sb.write_files({f"new{rounds}/f.txt": b"x"})
                        outcomes["ok"] = outcomes.get("ok", 0) + 1
                    except errors.PermissionDenied as e:
                        outcomes[type(e).__name__] = outcomes.get(type(e).__name__, 0) + 1
                    await sb.write_files({f"done{rounds}": b""})
                    rounds += 1
            finally:
                with contextlib.suppress(errors.SandboxdError):
                    await sb.write_files({"stop": b""})
            await poll(lambda: racer.done(), timeout=60, what="the racer to stop")
            raced = racer.result()
            assert raced.ok, raced
            swaps, leaks = map(int, raced.text.split())
            assert rounds >= 1 and swaps >= 1, (rounds, swaps, outcomes)
            assert leaks == 0, f"root's directory was opened to the user {leaks} times"
            where = await sb.exec(
                "cd /workspace && d=$(dirname $(find . -name marker)) && stat -c '%u:%g %a' $d $d/marker "
                "&& ls -A $d && cat $d/marker && find . -xdev -name '.sandboxd-put*'",
                user="root",
            )
            assert where.text.split() == ["0:0", "700", "0:0", "600", "marker", "s3"], (where, outcomes)
            assert "written" in host_writes, "the host wrote some rounds itself"
        await client.delete_pool("race", force=True)


async def test_a_sticky_directory_keeps_its_rule(client: AsyncClient, pool: str) -> None:
    async with client.acquire(pool, timeout=60) as sb:
        made = await sb.exec("printf r > /tmp/roots && chmod 0644 /tmp/roots && stat -c %a /tmp", user="root")
        assert made.ok and made.text.strip() == "1777", made
        for size in (1, LARGE):
            with pytest.raises(errors.PermissionDenied, match="/tmp/roots: permission denied"):
                await sb.write_files({"/tmp/roots": b"x" * size, "/tmp/mine": b"m"})
            shown = await sb.exec("stat -c '%u %s' /tmp/roots; test ! -e /tmp/mine && echo none")
            assert shown.text.split() == ["0", "1", "none"], (size, shown)
        # A name of its own there, and its own file replaced, it may.
        await sb.write_files({"/tmp/mine": b"m"})
        await sb.write_files({"/tmp/mine": b"mm"})
        assert (await sb.exec("cat /tmp/mine")).text == "mm"
        assert (await sb.exec(TEMPS, user="root")).text.strip() == ""


async def test_a_read_only_directory_uploads_and_restores_and_leaves_nothing(
    client: AsyncClient, pool: str
) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in ("ro", "ro/in"):
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o555
            tar.addfile(info)
        info = tarfile.TarInfo("ro/in/f")
        info.size, info.mode = 2, 0o444
        tar.addfile(info, io.BytesIO(b"hi"))
    show = "cd /workspace && find ro -printf '%m %p\\n' | LC_ALL=C sort && cat ro/in/f"
    want = "444 ro/in/f\n555 ro\n555 ro/in\nhi"
    async with client.acquire(pool, timeout=60) as sb:
        await client.upload_dir(sb.id, buf.getvalue(), "/workspace")
        assert (await sb.exec(show)).text.strip() == want
        # Again: ro/in is read-only, so nothing may be made in it, as in the sandbox.
        with pytest.raises(errors.PermissionDenied, match="/workspace/ro/in: permission denied"):
            await client.upload_dir(sb.id, buf.getvalue(), "/workspace")
        assert (await sb.exec(TEMPS, user="root")).text.strip() == ""
        snap = await sb.snapshot()
    restored = await client.restore(snap.id, timeout=90)
    try:
        assert (await restored[0].exec(show)).text.strip() == want
        assert (await restored[0].exec(TEMPS, user="root")).text.strip() == ""
    finally:
        await restored.release()
