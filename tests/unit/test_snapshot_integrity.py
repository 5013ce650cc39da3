"""What a snapshot read in place cannot see by itself, on plain directories
of this host: files mapped shared and writable (found from /proc), a file
under a write lease or one that cannot be read (the read fails naming it),
a file appended to while read (read as of its open), and the change
journals' inotify budget (watches per sandbox and in all, instances, a
queue that overflows or a flood breaking only the journals that share it).
"""

from __future__ import annotations

import fcntl
import mmap
import os
import shlex
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from sandboxd.backends import hostmaps, hostread
from sandboxd.backends.base import Limits
from sandboxd.backends.hostfs import HostWorkspace, Unreadable
from sandboxd.backends.shell import tar_create
from sandboxd.core.lifecycle import SandboxRecord
from sandboxd.core.snapshots import journal as journals
from sandboxd.core.snapshots.baselines import Baselines
from sandboxd.core.snapshots.journal import Budget, Journal, Watcher
from sandboxd.core.snapshots.lineage import LABEL_SNAPSHOT
from sandboxd.core.snapshots.listing import Baseline
from sandboxd.core.snapshots.mapped import MAPS_TRAILER, split_maps
from sandboxd.core.snapshots.meters import register_journal_meters
from sandboxd.telemetry import render

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "d").mkdir(parents=True)
    (root / "d" / "f.txt").write_bytes(b"hello")
    (root / "data.bin").write_bytes(b"\0" * 8192)
    return root


def open_view(root: Path, *, proc: bool = False) -> HostWorkspace:
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    # This test's own process stands for the sandbox's: its maps are what is read.
    pfd = os.open("/proc/self", os.O_RDONLY | os.O_DIRECTORY) if proc else -1
    return HostWorkspace(fd, pfd, str(root))


# -- mappings -------------------------------------------------------------------


def test_maps_lines_name_shared_writable_files_below_the_workspace() -> None:
    maps = (
        b"7f00-7f01 rw-s 00000000 00:1b 3   /workspace/db/data.mdb\n"
        b"7f01-7f02 r--s 00000000 00:1b 4   /workspace/read-only\n"
        b"7f02-7f03 rw-p 00000000 00:1b 5   /workspace/private\n"
        b"7f03-7f04 rw-s 00000000 00:1b 6   /workspace/gone (deleted)\n"
        b"7f04-7f05 rw-s 00000000 00:1b 7   /workspace/with space and\\012newline\n"
        b"7f05-7f06 rw-s 00000000 00:05 8   /dev/shm/elsewhere\n"
        b"7f06-7f07 rw-s 00000000 00:05 9   /workspaceX/not-below\n"
        b"7f07-7f08 rw-p 00000000 00:00 0 \n"
    )
    assert hostmaps.shared_writable(maps) == {"db/data.mdb", "with space and\nnewline"}


def test_a_file_mapped_shared_and_writable_is_found(tree: Path) -> None:
    view = open_view(tree, proc=True)
    try:
        assert view.mapped() == frozenset()
        with (tree / "data.bin").open("r+b") as fh:
            shared = mmap.mmap(fh.fileno(), 8192)
        private = mmap.mmap(os.open(tree / "d" / "f.txt", os.O_RDONLY), 5, prot=mmap.PROT_READ)
        try:
            shared[0:4] = b"new!"  # the descriptor is closed: no event, one stamp move at most
            assert view.mapped() == frozenset({"data.bin"})
        finally:
            shared.close()
            private.close()
        assert view.mapped() == frozenset(), "unmapped: not mapped any more"
    finally:
        view.close()


def test_mappings_that_cannot_be_told_are_unknown(tree: Path) -> None:
    view = open_view(tree)
    try:
        assert view.mapped() is None, "no view of the processes: any file may be mapped"
    finally:
        view.close()


# -- what cannot be read exactly ---------------------------------------------------


@pytest.fixture
def leased(tree: Path) -> Iterator[Path]:
    """d/f.txt under a write lease held by this process, which ignores the
    SIGIO each read starts a lease break with (it would kill it)."""
    path = tree / "d" / "f.txt"
    previous = signal.signal(signal.SIGIO, signal.SIG_IGN)
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)
    except OSError as e:
        os.close(fd)
        signal.signal(signal.SIGIO, previous)
        pytest.skip(f"leases are not available here: {e}")
    try:
        yield path
    finally:
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
        os.close(fd)
        signal.signal(signal.SIGIO, previous)


def test_a_leased_file_fails_every_read_naming_it(tree: Path, leased: Path) -> None:
    assert leased.name == "f.txt"
    view = open_view(tree)
    try:
        with pytest.raises(Unreadable, match=r"/workspace/d/f\.txt is held under a write lease"):
            list(view.scan())
        with pytest.raises(Unreadable, match=r"d/f\.txt is held under a write lease"):
            list(view.read_files([("d/f.txt", 5)]))
        with pytest.raises(Unreadable, match=r"d/f\.txt is held under a write lease"):
            view.open_file("d/f.txt")
        # Listing (stat) does not break a lease: the walk itself still answers.
        assert "d/f.txt" in {r[5] for r in view.walk()[1]}
    finally:
        view.close()


def test_gone_since_listed_is_left_out_and_other_errors_fail(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    view = open_view(tree)
    try:
        assert dict(view.read_files([("d/missing", 3), ("missing/x", 3)])) == {
            "d/missing": None,
            "missing/x": None,
        }
        assert view.open_file("missing") is None and view.walk_dir("missing") == []
        real_open = os.open

        def no_descriptors(path: str, flags: int, *args: object, **kwargs: object) -> int:
            if path == "f.txt":
                raise OSError(24, "Too many open files")
            return real_open(path, flags, *args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(os, "open", no_descriptors)
        with pytest.raises(
            Unreadable, match=r"/workspace/d/f\.txt could not be opened \(Too many open files\)"
        ):
            list(view.scan())
    finally:
        view.close()


# -- a file appended to ---------------------------------------------------------


def test_a_file_appended_to_is_read_as_of_its_open(tree: Path) -> None:
    path = tree / "app.log"
    path.write_bytes(b"line\n" * 1000)
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        with path.open("ab") as fh:
            fh.write(b"more\n" * 100_000)
        assert hostread.read_fd(fd, size, exact=True) == b"line\n" * 1000
        os.lseek(fd, 0, os.SEEK_SET)
        # Listed smaller than it is: read up to the size it has when found longer.
        assert hostread.read_fd(fd, 10) == path.read_bytes()
        os.lseek(fd, 0, os.SEEK_SET)
        assert hostread.read_fd(fd, size, 4096, exact=True) is hostread.LARGE
    finally:
        os.close(fd)
    view = open_view(tree)
    try:
        scanned = {r[5]: (r[2], c) for r, c in view.scan()}
        size, content = scanned["app.log"]
        assert isinstance(content, bytes) and len(content) == size, "the record's size is what was read"
    finally:
        view.close()


# -- the journals' budget ---------------------------------------------------------


def dirs(root: Path, n: int) -> list[Path]:
    out = []
    for i in range(n):
        d = root / f"dir{i}"
        d.mkdir(parents=True, exist_ok=True)
        out.append(d)
    return out


def watch(journal: Journal, paths: list[Path]) -> None:
    for p in paths:
        fd = os.open(p, os.O_RDONLY | os.O_DIRECTORY)
        try:
            journal.watch(fd, p.name)
        finally:
            os.close(fd)


@pytest.fixture
def make_watcher() -> Iterator[list[Watcher]]:
    made: list[Watcher] = []
    yield made
    for w in made:
        w.close()


def test_the_budget_derives_from_the_hosts_limits(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "max_user_watches").write_text("8192\n")
    (tmp_path / "max_user_instances").write_text("128\n")
    monkeypatch.setattr(journals, "_LIMITS", tmp_path)
    assert Budget.from_host() == Budget(watches_per_sandbox=512, watches_total=4096, instances=32)
    assert Budget.from_host(per_sandbox=100, instances=2) == Budget(100, 4096, 2)
    assert Budget.from_host(per_sandbox=10_000) == Budget(4096, 4096, 32), "per sandbox within the total"
    monkeypatch.setattr(journals, "_LIMITS", tmp_path / "absent")
    assert Budget.from_host() == Budget(512, 4096, 32), (
        "the kernel's defaults where the limits cannot be read"
    )


def test_watches_per_sandbox_and_in_all_are_bounded(tmp_path: Path, make_watcher: list[Watcher]) -> None:
    w = Watcher(Budget(watches_per_sandbox=3, watches_total=5, instances=4))
    make_watcher.append(w)
    a, b = w.journal(), w.journal()
    assert a is not None and b is not None
    watch(a, dirs(tmp_path / "a", 3))
    assert not a.broken and w.watches == 3
    watch(a, dirs(tmp_path / "a2", 1))
    assert a.broken and a.reason == journals.BUDGET and a.take() is None
    assert w.watches == 0 and not a.wds, "a journal over its budget gives its watches back"
    watch(b, dirs(tmp_path / "b", 3))
    c = w.journal()
    assert c is not None
    watch(c, dirs(tmp_path / "c", 2))
    assert not c.broken and w.watches == 5
    watch(c, dirs(tmp_path / "c2", 1))
    assert c.broken and c.reason == journals.BUDGET, "past the total"
    assert not b.broken and b.take() == journals.Changes()
    assert w.degraded == {journals.BUDGET: 2}
    b.close()
    assert w.watches == 0


def test_each_journal_has_an_instance_of_its_own_while_they_last(
    tmp_path: Path, make_watcher: list[Watcher]
) -> None:
    w = Watcher(Budget(100, 100, instances=2))
    make_watcher.append(w)
    a, b, c = w.journal(), w.journal(), w.journal()
    assert a is not None and b is not None and c is not None
    assert w.instances == 2
    assert a._instance is not b._instance and c._instance in (a._instance, b._instance)
    a.close()
    d = w.journal()
    assert d is not None and d._instance is a._instance, "a free instance is used again"
    assert w.instances == 2


def flood(where: Path, files: int) -> None:
    for i in range(files):
        os.close(os.open(where / f"f{i}", os.O_CREAT | os.O_WRONLY, 0o644))


def queued_events_max() -> int:
    return int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())


def test_an_overflow_breaks_only_the_journals_of_its_instance(
    tmp_path: Path, make_watcher: list[Watcher]
) -> None:
    w = Watcher(Budget(100, 100, instances=2))
    make_watcher.append(w)
    noisy, quiet = w.journal(), w.journal()
    assert noisy is not None and quiet is not None
    (noisy_dir,) = dirs(tmp_path / "noisy", 1)
    (quiet_dir,) = dirs(tmp_path / "quiet", 1)
    watch(noisy, [noisy_dir])
    watch(quiet, [quiet_dir])
    # Undrained, the noisy instance's queue overflows (a create and a close each).
    flood(noisy_dir, queued_events_max() // 2 + 10)
    (quiet_dir / "kept").write_bytes(b"x")
    got = quiet.take()
    assert got is not None and got.written == {"dir0/kept"}
    assert noisy.take() is None and noisy.reason == journals.OVERFLOW
    assert w.degraded == {journals.OVERFLOW: 1}


def test_journals_that_share_an_instance_share_its_overflow(
    tmp_path: Path, make_watcher: list[Watcher]
) -> None:
    w = Watcher(Budget(100, 100, instances=1))
    make_watcher.append(w)
    noisy, other = w.journal(), w.journal()
    assert noisy is not None and other is not None
    (noisy_dir,) = dirs(tmp_path / "noisy", 1)
    (other_dir,) = dirs(tmp_path / "other", 1)
    watch(noisy, [noisy_dir])
    watch(other, [other_dir])
    flood(noisy_dir, queued_events_max() // 2 + 10)
    assert other.take() is None and noisy.take() is None
    assert w.degraded == {journals.OVERFLOW: 2}


def test_a_flood_of_events_cuts_only_that_journal_off(
    tmp_path: Path, make_watcher: list[Watcher], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(journals, "MAX_EVENTS", 50)
    w = Watcher(Budget(100, 100, instances=1))
    make_watcher.append(w)
    noisy, other = w.journal(), w.journal()
    assert noisy is not None and other is not None
    (noisy_dir,) = dirs(tmp_path / "noisy", 1)
    (other_dir,) = dirs(tmp_path / "other", 1)
    watch(noisy, [noisy_dir])
    watch(other, [other_dir])
    target = noisy_dir / "hot"
    for i in range(40):  # one file over and over: few paths, many events
        target.write_bytes(b"%d" % i)
    (other_dir / "kept").write_bytes(b"x")
    w.drain()
    assert noisy.broken and noisy.reason == journals.FLOOD and not noisy.wds
    got = other.take()
    assert got is not None and "dir0/kept" in got.written


# -- a restore in progress ---------------------------------------------------------


def test_a_sandbox_being_restored_is_known_until_the_restore_ends() -> None:
    baselines = Baselines(Budget(10, 10, 1))
    fresh = SandboxRecord("sb-1", "pool", "img", Limits(), labels={LABEL_SNAPSHOT: "sn-1"})
    earlier = SandboxRecord("sb-2", "pool", "img", Limits(), labels={LABEL_SNAPSHOT: "sn-1"})
    baselines.set("sb-2", Baseline("sn-1", []))
    with baselines.restoring("sn-1") as targets:
        # Labelled by its acquire, before the restore knows its id.
        assert baselines.restore_of(fresh) == "sn-1"
        assert baselines.restore_of(earlier) == "", "restored before: it has a baseline"
        targets.update(["sb-1"])
        baselines.set("sb-1", Baseline("sn-1", []))
        assert baselines.restore_of(fresh) == "sn-1"
    assert baselines.restore_of(fresh) == "" and baselines.restore_of(earlier) == ""


def test_the_journals_fall_backs_and_watches_are_metrics(tmp_path: Path, make_watcher: list[Watcher]) -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    try:
        w = Watcher(Budget(watches_per_sandbox=1, watches_total=10, instances=2))
        make_watcher.append(w)
        register_journal_meters(provider.get_meter("test"), w)
        kept, over = w.journal(), w.journal()
        assert kept is not None and over is not None
        watch(kept, dirs(tmp_path / "kept", 1))
        watch(over, dirs(tmp_path / "over", 2))
        text = render(reader.get_metrics_data())
    finally:
        provider.shutdown()
    assert 'sandboxd_snapshot_journal_walks_total{reason="budget"} 1' in text
    assert "sandboxd_snapshot_journal_watches 1" in text
    assert "sandboxd_snapshot_journal_instances 2" in text


def test_the_listing_trailer_names_mapped_files_and_keeps_the_listings_status() -> None:
    maps = "7f00-7f01 rw-s 00000000 00:1b 3   /workspace/db/data.mdb"
    raw = b"listing\0" + maps.encode() + b"%08dMAPS" % len(maps)
    assert split_maps(raw) == (b"listing\0", frozenset({"db/data.mdb"}))
    assert split_maps(b"listing\0") == (b"listing\0", frozenset()), "no trailer: an emulated listing"
    assert split_maps(b"x00000099MAPS") == (b"x00000099MAPS", frozenset()), "a length past the output"
    # Run for real: the listing's own status survives the trailer, and the
    # shell's variables do not outlive it (a session runs it).
    out = subprocess.run(
        ["bash", "-c", "printf 'listing\\0'; false" + MAPS_TRAILER + 'echo "[${__sbx_m-unset}]"'],
        capture_output=True,
        check=False,
    )
    assert out.stdout.endswith(b"MAPS[unset]\n")
    assert split_maps(out.stdout.removesuffix(b"[unset]\n")) == (b"listing\0", frozenset())
    out = subprocess.run(
        ["bash", "-c", "printf 'listing\\0'; false" + MAPS_TRAILER], capture_output=True, check=False
    )
    assert out.returncode == 1 and split_maps(out.stdout)[0] == b"listing\0"


@pytest.mark.parametrize(
    ("says", "status", "answered"),
    [
        ("tar: app.log: file changed as we read it", 1, 0),
        (
            "tar: app.log: file changed as we read it\ntar: b: File shrank by 10 bytes; padding with zeros",
            1,
            1,
        ),
        ("tar: gone: Cannot stat: No such file or directory", 1, 1),
        ("", 1, 1),
        ("tar: app.log: file changed as we read it", 2, 2),
        ("", 0, 0),
    ],
)
def test_tar_reading_a_growing_file_is_no_failure_and_nothing_else_is_hidden(
    tmp_path: Path, says: str, status: int, answered: int
) -> None:
    """tar_create under a stand-in tar that writes its archive, says
    ``says`` on stderr and exits ``status``: only "file changed as we read
    it" alone (a file appended to, stored as tar first found it) passes."""
    fake = tmp_path / "tar"
    fake.write_text(f"#!/bin/sh\nprintf 'ARCHIVE'\nprintf '%s' {shlex.quote(says)} >&2\nexit {status}\n")
    fake.chmod(0o755)
    out = subprocess.run(
        ["sh", "-c", tar_create("x")],
        capture_output=True,
        check=False,
        env={"PATH": f"{tmp_path}:/usr/bin:/bin"},
    )
    assert (out.returncode, out.stdout) == (answered, b"ARCHIVE")
    assert out.stderr.decode().strip() == says, "what tar said is passed on"


def test_a_process_that_is_not_the_containers_leaves_no_descriptor_open() -> None:
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(3):
        assert HostWorkspace.open(os.getpid(), "no-such-container-id") is None
    assert len(os.listdir("/proc/self/fd")) == before
