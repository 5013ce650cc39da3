"""Writes into a workspace as the sandbox's user, on a plain directory of this
host, by both paths a WriteFiles can take: from the host
(sandboxd.backends.hostwrite, with the user's file rights from
sandboxd.backends.fscreds) and by the extraction script the sandbox runs
(sandboxd.backends.extract, run here as that user with setpriv). What the
user may not do inside a sandbox is refused by both, with the same typed
error naming the path, nothing changed and no temporary left; what the user
may do is done by both; a call is all or nothing."""

from __future__ import annotations

import io
import os
import shutil
import stat
import subprocess
import tarfile
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sandboxd.backends import fscreds
from sandboxd.backends.extract import put_refusal, put_tar_argv
from sandboxd.backends.hostwrite import TEMP_PREFIX, write_files
from sandboxd.core.files import FileData, build_tar, shared_parent
from sandboxd.errors import FailedPrecondition, PermissionDenied

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(
        not fscreds.available() or shutil.which("setpriv") is None,
        reason="needs root on Linux (setfsuid per thread) and setpriv",
    ),
]

UID = GID = 4242
OTHER = 4343

Files = list[tuple[str, bytes, int]]
Writer = Callable[[Files, int, int], bool]


@pytest.fixture
def base() -> Iterator[Path]:
    """A directory every user can search down to (the script walks from /)."""
    path = Path(tempfile.mkdtemp(prefix="sandboxd-ws-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path)


@pytest.fixture
def ws(base: Path) -> Path:
    """A workspace owned by the user, with a grader of root's in it, as a
    sandbox's is after root put its tests there: tests/ (0755) with
    test.py (0644), secret/ (0700) with key (0600), a sticky shared/ (1777)
    holding root's and the user's files, and the user's own files."""
    root = base / "ws"
    root.mkdir()
    os.chown(root, UID, GID)
    (root / "tests").mkdir(mode=0o755)
    (root / "tests" / "test.py").write_bytes(b"assert graded\n")
    (root / "secret").mkdir(mode=0o700)
    (root / "secret" / "key").write_bytes(b"k")
    os.chmod(root / "secret" / "key", 0o600)
    shared = root / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    (shared / "roots").write_bytes(b"root's")
    (shared / "mine").write_bytes(b"mine")
    os.chown(shared / "mine", UID, GID)
    mine = root / "mine"
    mine.mkdir()
    os.chown(mine, UID, GID)
    (mine / "roots.txt").write_bytes(b"root's in the user's directory")
    (mine / "a.txt").write_bytes(b"old a")
    os.chown(mine / "a.txt", UID, GID)
    (mine / "adir").mkdir()
    os.chown(mine / "adir", UID, GID)
    return root


@pytest.fixture
def fd(ws: Path) -> Iterator[int]:
    fd = os.open(ws, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield fd
    finally:
        os.close(fd)


def extract_as(ws: Path, files: Files, uid: int, gid: int) -> bool:
    """The sandbox's path: the extraction script as ``uid`` (uid 0 with no
    capabilities at all, as the sandbox's root), its exit read as a backend does."""
    # As WriteFiles builds it: extracted in the deepest directory the files share.
    group = [FileData(f"{ws}/{rel}", data, mode) for rel, data, mode in files]
    dest = shared_parent(group, str(ws))
    caps = ["--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=-all"]
    argv = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", *caps, *put_tar_argv(dest)]
    done = subprocess.run(
        argv, input=build_tar(group, dest), capture_output=True, umask=0o022, timeout=30, check=False
    )
    refusal = put_refusal(done.returncode, dest, done.stderr.decode(errors="replace").strip())
    if refusal is not None:
        raise refusal
    return True


@pytest.fixture(params=["host", "sandbox"])
def write(request: pytest.FixtureRequest, ws: Path, fd: int) -> Writer:
    """Writes files as a user by one of the two paths."""
    if request.param == "host":
        return lambda files, uid, gid: write_files(fd, files, uid, gid)
    return lambda files, uid, gid: extract_as(ws, files, uid, gid)


def state(root: Path) -> dict[str, tuple[int, int, int, bytes]]:
    """Every entry: (mode, uid, gid, content or link target)."""
    out: dict[str, tuple[int, int, int, bytes]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            body = b""
            if stat.S_ISREG(st.st_mode):
                body = p.read_bytes()
            elif stat.S_ISLNK(st.st_mode):
                body = os.fsencode(os.readlink(p))
            out[str(p.relative_to(root))] = (st.st_mode, st.st_uid, st.st_gid, body)
    return out


def temps(root: Path) -> list[str]:
    return [str(p) for p in root.rglob(TEMP_PREFIX + "*")]


@pytest.mark.parametrize(
    ("path", "match"),
    [
        ("tests/new.py", "tests: permission denied"),
        ("tests/test.py", "tests: permission denied"),
        ("tests/sub/x.py", "tests/sub: permission denied"),
        ("secret/key", "secret: permission denied"),
        ("secret/new", "secret: permission denied"),
        ("shared/roots", "shared/roots: permission denied"),
    ],
)
def test_what_the_user_may_not_do_in_the_sandbox_is_refused(
    ws: Path, write: Writer, path: str, match: str
) -> None:
    before = state(ws)
    with pytest.raises(PermissionDenied, match=match):
        write([("mine/ok.txt", b"fine", 0o644), (path, b"forged", 0o644)], UID, GID)
    assert state(ws) == before, "nothing changed, the file before it included"
    assert temps(ws) == []


def test_what_the_user_may_do_is_done_as_the_user(ws: Path, write: Writer) -> None:
    files = [
        ("mine/roots.txt", b"replaced", 0o644),  # root's file in the user's directory: rename over it
        ("mine/a.txt", b"new a", 0o600),
        ("shared/mine", b"own file in a sticky directory", 0o644),
        ("shared/new", b"new name in a sticky directory", 0o755),
        ("deep/er/f.bin", bytes(range(256)), 0o777),
    ]
    assert write(files, UID, GID) is True
    for rel, data, mode in files:
        st = (ws / rel).lstat()
        assert ((ws / rel).read_bytes(), st.st_uid, st.st_gid) == (data, UID, GID), rel
        assert stat.S_IMODE(st.st_mode) == mode & ~0o022, rel
    for d in ("deep", "deep/er"):
        st = (ws / d).lstat()
        assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o755, UID, GID), d
    assert temps(ws) == []
    assert (ws / "tests" / "test.py").read_bytes() == b"assert graded\n"


def test_group_and_read_only_directories_follow_the_mode(ws: Path, write: Writer) -> None:
    for name, gid, mode in (
        ("ours", GID, 0o775),
        ("theirs", OTHER, 0o775),
        ("ro", GID, 0o555),
        ("drop", 0, 0o733),
    ):
        (ws / name).mkdir()
        os.chown(ws / name, 0 if name != "ro" else UID, gid)
        os.chmod(ws / name, mode)
    assert write([("ours/f", b"x", 0o644)], UID, GID) is True
    # Write and search without read: a drop box the user can put files in.
    assert write([("drop/f", b"x", 0o644)], UID, GID) is True
    with pytest.raises(PermissionDenied, match="theirs: permission denied"):
        write([("theirs/f", b"x", 0o644)], UID, GID)
    with pytest.raises(PermissionDenied, match="ro: permission denied"):
        write([("ro/f", b"x", 0o644)], UID, GID)
    # Root (uid 0 without capabilities, as in the sandbox) is bound by the mode too.
    with pytest.raises(PermissionDenied, match="ro: permission denied"):
        write([("ro/f", b"x", 0o644)], 0, 0)
    assert write([("tests/test.py", b"root's own", 0o644)], 0, 0) is True
    assert (ws / "tests" / "test.py").stat().st_uid == 0
    assert temps(ws) == []


def test_a_directory_where_a_file_goes_refuses_the_whole_call(ws: Path, write: Writer) -> None:
    before = state(ws)
    with pytest.raises(FailedPrecondition, match="mine/adir is a directory"):
        write(
            [("mine/a.txt", b"changed", 0o644), ("made/new.txt", b"n", 0o644), ("mine/adir", b"x", 0o644)],
            UID,
            GID,
        )
    assert state(ws) == before, "a.txt not replaced, made/ removed"
    assert temps(ws) == []


def test_a_refusal_at_commit_puts_back_what_was_moved(ws: Path, write: Writer) -> None:
    # Staging passes (the sticky directory is writable); replacing root's
    # file there is refused only by the rename, after a.txt and new.txt moved.
    before = state(ws)
    with pytest.raises(PermissionDenied, match="shared/roots: permission denied"):
        write(
            [("mine/a.txt", b"changed", 0o644), ("mine/new.txt", b"n", 0o644), ("shared/roots", b"x", 0o644)],
            UID,
            GID,
        )
    assert state(ws) == before
    assert temps(ws) == []


def test_links_on_the_way_are_left_to_the_sandbox(ws: Path, fd: int) -> None:
    (ws / "mine" / "to-secret").symlink_to("../secret")
    os.lchown(ws / "mine" / "to-secret", UID, GID)
    (ws / "mine" / "file").write_bytes(b"")
    before = state(ws)
    assert write_files(fd, [("mine/ok", b"x", 0o644), ("mine/to-secret/key", b"x", 0o644)], UID, GID) is False
    assert write_files(fd, [("mine/file/below", b"x", 0o644)], UID, GID) is False
    assert state(ws) == before
    assert temps(ws) == []
    # A link in a file's place is replaced, never written through.
    (ws / "mine" / "link").symlink_to("../tests/test.py")
    assert write_files(fd, [("mine/link", b"new", 0o644)], UID, GID) is True
    assert not (ws / "mine" / "link").is_symlink()
    assert (ws / "tests" / "test.py").read_bytes() == b"assert graded\n"


def _thread_status() -> dict[str, str]:
    lines = Path("/proc/thread-self/status").read_text().splitlines()
    return {k: v.strip() for k, _, v in (line.partition(":") for line in lines)}


def test_only_the_worker_thread_takes_the_users_rights_and_they_are_put_back() -> None:
    before = _thread_status()
    seen: dict[str, str] = {}
    other: list[dict[str, str]] = []
    started, release = threading.Event(), threading.Event()

    def watcher() -> None:
        started.set()
        release.wait(10)
        other.append(_thread_status())

    t = threading.Thread(target=watcher)
    t.start()
    started.wait(10)

    def inside() -> None:
        seen.update(_thread_status())
        release.set()
        t.join(10)
        raise ValueError("raised inside")

    with pytest.raises(ValueError, match="raised inside"):
        fscreds.run_as(UID, GID, inside)
    assert seen["Uid"].split()[3] == str(UID) and seen["Gid"].split()[3] == str(GID)
    assert int(seen["CapEff"], 16) == 0 and seen["Groups"] == ""
    assert other[0]["Uid"] == before["Uid"] and other[0]["CapEff"] == before["CapEff"], "no other thread"
    assert other[0]["Groups"] == before["Groups"]
    # The worker put them back before it ended; a new one starts from the process's.
    assert fscreds.run_as(UID, GID, lambda: _thread_status()["Uid"]).split()[3] == str(UID)
    after = _thread_status()
    assert (after["Uid"], after["CapEff"], after["Groups"]) == (
        before["Uid"],
        before["CapEff"],
        before["Groups"],
    )


def test_a_rename_the_kernel_refuses_late_puts_back_the_whole_call(ws: Path, write: Writer) -> None:
    # An immutable file passes every permission check and is refused only
    # by the rename itself, after the files before it moved.
    target = ws / "mine" / "pinned"
    target.write_bytes(b"pinned")
    os.chown(target, UID, GID)
    if subprocess.run(["chattr", "+i", str(target)], capture_output=True, check=False).returncode:
        pytest.skip("this filesystem has no immutable files (chattr +i)")
    try:
        before = state(ws)
        with pytest.raises(PermissionDenied, match="mine/pinned: permission denied"):
            write(
                [("mine/a.txt", b"changed", 0o644), ("new/n.txt", b"n", 0o644), ("mine/pinned", b"x", 0o644)],
                UID,
                GID,
            )
        assert state(ws) == before
        assert temps(ws) == []
    finally:
        subprocess.run(["chattr", "-i", str(target)], check=True)


def test_read_only_directories_in_an_upload_arrive_and_leave_nothing_behind(ws: Path) -> None:
    # A restore or an upload of a tree with a read-only directory (0555)
    # holding files: staged, moved to its place, and its mode kept.
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, mode, kind in (("ro", 0o555, tarfile.DIRTYPE), ("ro/in", 0o555, tarfile.DIRTYPE)):
            info = tarfile.TarInfo(name)
            info.type, info.mode = kind, mode
            tar.addfile(info)
        info = tarfile.TarInfo("ro/in/f")
        info.size, info.mode = 2, 0o444
        tar.addfile(info, io.BytesIO(b"hi"))
    argv = ["setpriv", f"--reuid={UID}", f"--regid={GID}", "--clear-groups", *put_tar_argv(str(ws / "mine"))]
    done = subprocess.run(
        argv, input=buf.getvalue(), capture_output=True, umask=0o022, timeout=30, check=False
    )
    assert done.returncode == 0, done.stderr
    assert (ws / "mine" / "ro" / "in" / "f").read_bytes() == b"hi"
    assert stat.S_IMODE((ws / "mine" / "ro").stat().st_mode) == 0o555
    assert stat.S_IMODE((ws / "mine" / "ro" / "in").stat().st_mode) == 0o555
    assert temps(ws) == []
    # Again over it: ro/in is the user's but read-only, so nothing may be
    # created in it, as in the sandbox; refused, and nothing is left.
    done = subprocess.run(
        argv, input=buf.getvalue(), capture_output=True, umask=0o022, timeout=30, check=False
    )
    refusal = put_refusal(done.returncode, str(ws), done.stderr.decode())
    assert isinstance(refusal, PermissionDenied) and "mine/ro/in: permission denied" in refusal.message
    assert temps(ws) == []
