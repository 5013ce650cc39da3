"""Workspaces read in place and their change journals, on a plain directory
of this host: records as the in-sandbox listing prints them, links described
and never followed, a FIFO that blocks nothing, and journals that record
exactly what was touched or say they cannot be trusted."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandboxd.backends import hostfs
from sandboxd.backends.hostfs import HostWorkspace
from sandboxd.backends.snapshot_shell import LIST_FORMAT
from sandboxd.core.snapshots import journal as journals
from sandboxd.core.snapshots.journal import Watcher

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "d" / "e").mkdir(parents=True)
    (root / "d" / "f.txt").write_bytes(b"hello")
    (root / "big").write_bytes(os.urandom(200_000))
    (root / "empty").write_bytes(b"")
    (root / "link").symlink_to("/")
    (root / "d" / "rel").symlink_to("../big")
    os.mkfifo(root / "pipe")
    os.chmod(root / "d" / "f.txt", 0o600)
    return root


@pytest.fixture
def view(tree: Path) -> Iterator[HostWorkspace]:
    ws = HostWorkspace(os.open(tree, os.O_RDONLY | os.O_DIRECTORY))
    try:
        yield ws
    finally:
        ws.close()


def find_listing(root: Path) -> set[tuple[str, ...]]:
    out = subprocess.run(
        ["find", ".", "-mindepth", "1", "-printf", LIST_FORMAT], cwd=root, capture_output=True, check=True
    ).stdout.split(b"\0")[:-1]
    rows = set()
    for i in range(0, len(out), 3):
        kind, mode, size, mtime, ctime, uid, gid = out[i].decode().split(" ")
        path, target = out[i + 1].decode(), out[i + 2].decode()
        rows.add((kind, str(int(mode, 8)), size, mtime, ctime, path, target, uid, gid))
    return rows


def as_rows(records: list[tuple[str, int, int, str, str, str, str, int, int, int]]) -> set[tuple[str, ...]]:
    return {(k, str(m), str(s), mt, ct, p, t, str(u), str(g)) for k, m, s, mt, ct, p, t, _, u, g in records}


def test_walk_and_scan_describe_entries_as_find_does(tree: Path, view: HostWorkspace) -> None:
    want = find_listing(tree)
    _, walked = view.walk()
    assert as_rows(walked) == want
    scanned = list(view.scan())
    assert as_rows([r for r, _ in scanned]) == want
    contents = {r[5]: c for r, c in scanned if c is not None}
    os.link(tree / "big", tree / "again")
    assert {r[5]: r[7] for r, _ in view.scan() if r[0] == "f"} == {
        "d/f.txt": 1,
        "big": 2,
        "again": 2,
        "empty": 1,
    }
    assert contents == {"d/f.txt": b"hello", "big": (tree / "big").read_bytes(), "empty": b""}
    assert dict(view.read_files([("big", 200_000), ("d/f.txt", 1), ("pipe", 0), ("link", 1)])) == {
        "big": (tree / "big").read_bytes(),
        "d/f.txt": b"hello",  # longer than listed: read whole all the same
        "pipe": b"",  # a FIFO opened non-blocking reads empty: nothing waits
        "link": None,  # never followed
    }


def test_paths_through_links_are_refused(tree: Path, view: HostWorkspace) -> None:
    (tree / "d" / "up").symlink_to(tree.parent)
    stats = dict(view.stat_many(["d/up", "d/up/ws/big", "link/etc/passwd"]))
    assert stats["link/etc/passwd"] is None
    assert stats["d/up/ws/big"] is None
    assert view.walk_dir("link") == []
    assert dict(view.read_files([("link/etc/passwd", 10)])) == {"link/etc/passwd": None}
    assert stats["d/up"] is not None and stats["d/up"][0] == "l"
    assert not view.each_dir(["d", "link"], lambda fd, rel: None)


@pytest.mark.parametrize("resolver", ["openat2", "walk"])
def test_links_chains_and_dots_are_refused_by_either_resolver(
    tree: Path, view: HostWorkspace, resolver: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """openat2 (RESOLVE_BENEATH, no links) where the kernel has it, else the
    component walk: the same answers for links out, chains, ``..`` in a
    target and in the path, and a link that stays inside."""
    if resolver == "walk":
        monkeypatch.setattr(hostfs, "_openat2", None)
    elif hostfs._openat2 is None:
        pytest.skip("no openat2 on this machine")
    (tree / "chain").symlink_to("link")
    (tree / "dots").symlink_to("d/../..")
    (tree / "inside").symlink_to("d")
    for rel in ("link", "link/etc", "chain/etc", "dots/ws", "inside/e", "d/../d", "..", "d/rel"):
        assert view.walk_dir(rel) == [], rel
        assert view.open_file(f"{rel}/x") is None, rel
    assert dict(view.read_files([("inside/f.txt", 5), ("chain/etc/hostname", 5)])) == {
        "inside/f.txt": None,
        "chain/etc/hostname": None,
    }
    # Real directories still open, whichever resolver.
    assert {r[5] for r in view.walk_dir("d/e")} == {"d/e"}
    f = view.open_file("d/f.txt")
    assert f is not None and b"".join(f.chunks()) == b"hello"
    f.close()


@pytest.fixture
def watcher() -> Iterator[Watcher]:
    w = Watcher()
    try:
        yield w
    finally:
        w.close()


def test_a_journal_records_what_was_touched(tree: Path, view: HostWorkspace, watcher: Watcher) -> None:
    journal = watcher.journal()
    view.walk(journal.watch)
    assert journal.take() == journals.Changes()
    (tree / "d" / "f.txt").write_bytes(b"changed")
    (tree / "new").mkdir()
    (tree / "new" / "inner").write_bytes(b"x")
    (tree / "empty").unlink()
    os.chmod(tree / "big", 0o640)
    changes = journal.take()
    assert changes is not None
    assert changes.touched == {"d/f.txt", "new", "empty", "big", ""}
    assert changes.written == {"d/f.txt"}
    assert changes.fresh == {"new"}
    assert "new/inner" not in changes.touched, "a directory made since is not watched until walked"
    assert journal.take() == journals.Changes(), "taking starts afresh"


def test_a_moved_directory_or_a_storm_breaks_a_journal(
    tree: Path, view: HostWorkspace, watcher: Watcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = watcher.journal()
    view.walk(journal.watch)
    os.rename(tree / "d", tree / "moved")
    assert journal.take() is None
    assert not journal.wds, "a broken journal stops its events"

    fresh = watcher.journal()
    view.walk(fresh.watch)
    monkeypatch.setattr(journals, "MAX_TOUCHED", 10)
    for i in range(20):
        (tree / f"f{i}").write_bytes(b"")
    assert fresh.take() is None
    fresh.close()
