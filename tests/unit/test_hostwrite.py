"""Host-side writes (sandboxd.backends.hostwrite) on a plain directory of this
host, with the kernel's own checks under a user's file rights
(sandboxd.backends.fscreds): what that user may not do inside a sandbox is
refused here, typed and naming the path, with nothing changed and no
temporary left; a call is all or nothing."""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandboxd.backends import fscreds
from sandboxd.backends.hostwrite import TEMP_PREFIX, write_files
from sandboxd.errors import FailedPrecondition, PermissionDenied

pytestmark = [
    pytest.mark.timeout(30),
    pytest.mark.skipif(not fscreds.available(), reason="needs root on Linux (setfsuid per thread)"),
]

UID = GID = 4242
OTHER = 4343


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    """A workspace owned by the user, with a grader of root's in it, as a
    sandbox's is after root put its tests there: tests/ (0755) with
    test.py (0644), secret/ (0700) with key (0600), a sticky shared/ (1777)
    holding root's and the user's files, and the user's own files."""
    root = tmp_path / "ws"
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
        ("tests/new.py", "tests/new.py: permission denied"),
        ("tests/test.py", "tests/test.py: permission denied"),
        ("tests/sub/x.py", "tests/sub: permission denied"),
        ("secret/key", "secret/key: permission denied"),
        ("secret/new", "secret/new: permission denied"),
        ("shared/roots", "shared/roots: permission denied"),
    ],
)
def test_what_the_user_may_not_do_in_the_sandbox_is_refused(ws: Path, fd: int, path: str, match: str) -> None:
    before = state(ws)
    with pytest.raises(PermissionDenied, match=match):
        write_files(fd, [("mine/ok.txt", b"fine", 0o644), (path, b"forged", 0o644)], UID, GID)
    assert state(ws) == before, "nothing changed, the file before it included"
    assert temps(ws) == []


def test_what_the_user_may_do_is_done_as_the_user(ws: Path, fd: int) -> None:
    files = [
        ("mine/roots.txt", b"replaced", 0o644),  # root's file in the user's directory: rename over it
        ("mine/a.txt", b"new a", 0o600),
        ("shared/mine", b"own file in a sticky directory", 0o644),
        ("shared/new", b"new name in a sticky directory", 0o755),
        ("deep/er/f.bin", bytes(range(256)), 0o777),
    ]
    assert write_files(fd, files, UID, GID) is True
    for rel, data, mode in files:
        st = (ws / rel).lstat()
        assert ((ws / rel).read_bytes(), st.st_uid, st.st_gid) == (data, UID, GID), rel
        assert stat.S_IMODE(st.st_mode) == mode & ~0o022, rel
    for d in ("deep", "deep/er"):
        st = (ws / d).lstat()
        assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o755, UID, GID), d
    assert temps(ws) == []
    assert (ws / "tests" / "test.py").read_bytes() == b"assert graded\n"


def test_group_and_read_only_directories_follow_the_mode(ws: Path, fd: int) -> None:
    for name, gid, mode in (
        ("ours", GID, 0o775),
        ("theirs", OTHER, 0o775),
        ("ro", GID, 0o555),
        ("drop", 0, 0o733),
    ):
        (ws / name).mkdir()
        os.chown(ws / name, 0 if name != "ro" else UID, gid)
        os.chmod(ws / name, mode)
    assert write_files(fd, [("ours/f", b"x", 0o644)], UID, GID) is True
    # Write and search without read: a drop box the user can put files in.
    assert write_files(fd, [("drop/f", b"x", 0o644)], UID, GID) is True
    with pytest.raises(PermissionDenied, match="theirs/f"):
        write_files(fd, [("theirs/f", b"x", 0o644)], UID, GID)
    with pytest.raises(PermissionDenied, match="ro/f"):
        write_files(fd, [("ro/f", b"x", 0o644)], UID, GID)
    # Root (uid 0 without capabilities, as in the sandbox) is bound by the mode too.
    with pytest.raises(PermissionDenied, match="ro/f"):
        write_files(fd, [("ro/f", b"x", 0o644)], 0, 0)
    assert write_files(fd, [("tests/test.py", b"root's own", 0o644)], 0, 0) is True
    assert (ws / "tests" / "test.py").stat().st_uid == 0
    assert temps(ws) == []


def test_a_directory_where_a_file_goes_refuses_the_whole_call(ws: Path, fd: int) -> None:
    before = state(ws)
    with pytest.raises(FailedPrecondition, match="mine/adir is a directory"):
        write_files(
            fd,
            [("mine/a.txt", b"changed", 0o644), ("made/new.txt", b"n", 0o644), ("mine/adir", b"x", 0o644)],
            UID,
            GID,
        )
    assert state(ws) == before, "a.txt not replaced, made/ removed"
    assert temps(ws) == []


def test_a_refusal_at_commit_puts_back_what_was_moved(ws: Path, fd: int) -> None:
    # Staging passes (the sticky directory is writable); replacing root's
    # file there is refused only by the rename, after a.txt and new.txt moved.
    before = state(ws)
    with pytest.raises(PermissionDenied, match="shared/roots: permission denied"):
        write_files(
            fd,
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
