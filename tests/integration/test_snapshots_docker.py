"""Snapshots against the real engine: fidelity of files, modes, symlinks,
empty directories, cwd and environment; fork; incremental capture; a corrupt
snapshot destroys its targets. Each test runs twice: with workspaces read in
place from the host, and read through the sandbox (listing commands and tar
streams, as on a remote engine or on Kubernetes)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import docker
import pytest

from sandboxd import errors
from sandboxd.app import App, build_app
from sandboxd.backends.base import GVISOR, RUNC
from sandboxd.backends.docker.users import USER_TABLES
from sandboxd.client import AsyncClient, Sandbox
from sandboxd.core.snapshots import LABEL_SNAPSHOT, blob_key, contents, tenant_namespace
from sandboxd.core.snapshots import manifest as mf
from sandboxd.settings import DockerBackendSettings
from tests.integration.conftest import NO_GVISOR, gvisor_registered, make_settings, poll, running_app

pytestmark = [pytest.mark.docker, pytest.mark.timeout(180)]


# How the workspace is read, and the runtime of the ``pool`` fixture's pool:
# gVisor sandboxes are always read through the sandbox.
MODES = [
    pytest.param(("in-place", RUNC), id="in-place"),
    pytest.param(("through-sandbox", RUNC), id="through-sandbox"),
    pytest.param(("through-sandbox", GVISOR), id="gvisor"),
]


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest, engine: docker.DockerClient) -> tuple[str, str]:
    read, runtime = request.param
    if runtime == GVISOR and not gvisor_registered(engine):
        pytest.skip(NO_GVISOR)
    return str(read), str(runtime)


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


def in_place(app: App) -> bool:
    backend = app.settings.backend
    return isinstance(backend, DockerBackendSettings) and backend.host_workspaces


SETUP = r"""
set -e
mkdir -p src/pkg empty locked 'we ird'
printf 'print(1)\n' > src/pkg/main.py
printf '#!/bin/sh\necho run\n' > run.sh && chmod 0755 run.sh
printf 'shared' > shared && chmod 0777 shared
printf 'secret' > secret && chmod 0600 secret
printf 'x' > 'we ird/na me' && printf 'nl' > "$(printf 'new\nline')"
chmod 0700 locked && chmod 1777 src && chmod 0555 src/pkg
ln -s src/pkg/main.py rel-link && ln -s /workspace/src abs-link && ln -s missing dangling
head -c 300000 /dev/urandom > blob.bin
"""

LISTING = "cd /workspace && find . -printf '%y %m %s %p -> %l\\n' | LC_ALL=C sort && md5sum blob.bin"


async def test_round_trip_fork_and_incremental(app: App, client: AsyncClient, pool: str) -> None:
    source = await client.lease(pool, timeout=60)
    try:
        sb = source[0]
        r = await sb.exec(SETUP)
        assert r.ok, r
        r = await sb.exec(
            "cd src/pkg && export GREETING=$'hi\\nthere' MODE=train && unset HOSTNAME", session="a"
        )
        assert r.ok, r
        want = (await sb.exec(LISTING)).text
        snap = await sb.snapshot(session="a", policy_version=5, turn=2, labels={"run": "it"})
        assert snap.cwd == "/workspace/src/pkg"
        assert snap.env["GREETING"] == "hi\nthere" and "HOSTNAME" not in snap.env
    finally:
        await source.release()

    fork = await client.restore(snap.id, n=3, timeout=60)
    try:
        for target in fork:
            assert (await target.exec(LISTING)).text == want
            r = await target.exec('pwd; printf "%s|" "$GREETING" "$MODE" "${HOSTNAME-unset}"', session="a")
            assert r.text == "/workspace/src/pkg\nhi\nthere|train|unset|"
            assert target.info.labels[LABEL_SNAPSHOT] == snap.id
        # Incremental: change one file, add one, delete one.
        first = fork[0]
        change = (
            "cd /workspace && chmod u+w src/pkg && printf 'print(2)\\n' > src/pkg/main.py "
            "&& rm secret && printf new > new.txt"
        )
        assert (await first.exec(change)).ok
        child = await first.snapshot(session="a", policy_version=6)
        assert child.parent_id == snap.id
        assert child.stored_bytes == len("print(2)\n") + len("new")
        assert [(c.id, c.policy_version) for c in child.chain] == [(snap.id, 5), (child.id, 6)]
        again = await client.restore(child.id, timeout=60)
        try:
            r = await again[0].exec("cat /workspace/src/pkg/main.py /workspace/new.txt; ls /workspace/secret")
            assert r.stdout.startswith(b"print(2)\nnew") and r.exit_code != 0
        finally:
            await again.release()
    finally:
        await fork.release()


async def test_corrupt_snapshot_fails_and_leaves_no_sandbox(
    app: App, client: AsyncClient, pool: str, tmp_path: Path
) -> None:
    async with client.acquire(pool, timeout=60) as sb:
        assert (await sb.exec("printf 'precious' > a.txt")).ok
        snap = await sb.snapshot()
    assert app.snapshots is not None
    entries = list(((await app.snapshots._catalog.entries(snap.id)) or {}).values())
    key = blob_key(tenant_namespace("default"), entries[0].digest)
    pack, offset, size = (await app.snapshots._catalog.locate([key]))[key]
    with (app.settings.state_dir / "blobs" / pack).open("r+b") as fh:
        fh.seek(offset)
        fh.write(b"T" * size)
    with pytest.raises(errors.FailedPrecondition, match="corrupt"):
        await client.restore(snap.id, timeout=60)
    leased = await client.list_sandboxes(pool, state=3)
    assert leased == []


async def test_concurrent_snapshots_and_gc(app: App, client: AsyncClient, pool: str) -> None:
    snapshots = app.snapshots
    assert snapshots is not None
    group = await client.lease(pool, n=3, timeout=60)
    try:
        await asyncio.gather(
            *(
                s.exec(f"head -c 20000 /dev/urandom > own; printf same > common; echo {i} > i")
                for i, s in enumerate(group)
            )
        )

        async def churn(sb: Sandbox) -> list[str]:
            kept = []
            for round_ in range(3):
                assert (await sb.exec(f"echo {round_} >> i")).ok
                kept.append((await sb.snapshot()).id)
                await snapshots.gc()
            return kept

        kept = [sid for ids in await asyncio.gather(*(churn(s) for s in group)) for sid in ids]
    finally:
        await group.release()
    await snapshots.gc()
    restored = await client.restore(kept[-1], timeout=60)
    try:
        assert (await restored[0].exec("cat i")).ok
    finally:
        await restored.release()


async def test_large_restore_goes_through_the_inbox(app: App, client: AsyncClient, pool: str) -> None:
    async with client.acquire(pool, timeout=60) as sb:
        r = await sb.exec("head -c 2000000 /dev/urandom > big && printf a > small && md5sum big > sum")
        assert r.ok, r
        snap = await sb.snapshot()
    inboxes = app.settings.state_dir / "inbox"
    staged = inboxes.with_name("inbox-staged")
    fork = await client.restore(snap.id, n=2, timeout=60)
    try:
        for target in fork:
            assert "big: OK" in (await target.exec("md5sum -c sum")).text
            # Only what was linked for this sandbox, only while it was extracted (the
            # user tables mounted over /etc stay); never writable.
            listed = (await target.exec("ls -A /.sandboxd/inbox")).text.split()
            assert set(listed) <= {name for _, name in USER_TABLES}, listed
            assert not (await target.exec("touch /.sandboxd/inbox/x")).ok
            assert (inboxes / target.id).is_dir()
        assert list(staged.iterdir()) == []
        # The restore's cutoff stands in for a listing: only what changed is read.
        assert (await fork[0].exec("printf b > small")).ok
        child = await fork[0].snapshot()
        assert child.parent_id == snap.id and child.stored_bytes == 1
    finally:
        await fork.release()
    await poll(lambda: not any((inboxes / t.id).exists() for t in fork), what="inboxes removed")


async def test_restore_streams_when_sandboxes_have_no_inbox(tmp_path: Path, image: str) -> None:
    app = build_app(make_settings(tmp_path, **{"backend.inbox_dir": ""}))
    await app.start()
    try:
        async with AsyncClient(app.address) as client:
            await client.create_pool("noinbox", image, min_ready=1, max_size=2)
            async with client.acquire("noinbox", timeout=60) as sb:
                assert (await sb.exec("head -c 200000 /dev/urandom > big && md5sum big > sum")).ok
                snap = await sb.snapshot()
            restored = await client.restore(snap.id, timeout=60)
            try:
                assert "big: OK" in (await restored[0].exec("md5sum -c sum")).text
                assert not (await restored[0].exec("test -e /.sandboxd")).ok
            finally:
                await restored.release()
            await client.delete_pool("noinbox", force=True)
    finally:
        await app.stop(grace=1)
    assert not (tmp_path / "state" / "inbox").exists()


async def test_large_first_snapshot_reads_while_it_lists(
    app: App, client: AsyncClient, pool: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over 8 MB and no baseline: through the sandbox, the tar stream starts
    before the listing is parsed; in place, listing and reading are one pass
    (nothing asks how large it is). The capture is exactly what was listed."""
    assert app.snapshots is not None
    answers: list[bool] = []
    real_large = app.snapshots._workspaces.large

    async def large(rec: Any) -> bool:
        answers.append(await real_large(rec))
        return answers[-1]

    monkeypatch.setattr(app.snapshots._workspaces, "large", large)
    async with client.acquire(pool, timeout=60) as sb:
        r = await sb.exec(
            "mkdir -p d && for i in 1 2 3; do head -c 3500000 /dev/urandom > d/big$i; done "
            "&& printf x > small && ln -s d/big1 link"
        )
        assert r.ok, r
        sums = (await sb.exec("md5sum d/* small && readlink link")).text
        snap = await sb.snapshot()
    assert snap.size_bytes == 3 * 3500000 + 1 and snap.entry_count == 6
    assert answers == ([] if in_place(app) else [True])
    restored = await client.restore(snap.id, timeout=60)
    try:
        assert (await restored[0].exec("md5sum d/* small && readlink link")).text == sums
    finally:
        await restored.release()


CHURN = r"""
set -e
cd /workspace
mv tree moved                        # a subtree moved in: its children keep their ctimes
rm gone.txt                          # deletions show only as missing names
rm -r gonedir
rm -r swap
printf file > swap                   # a directory replaced by a file
chmod 0700 keep/mode.sh              # a change of mode alone
printf 'SAME' > keep/same            # same content and size, old mtime: ctime tells
touch -d @1000000000 keep/same
mkdir -p fresh/empty
ln -s ../moved/a fresh/link
"""

SNAP_VIEW = (
    "cd /workspace && find . -printf '%y %m %s %p -> %l\\n' | LC_ALL=C sort "
    "&& find . -type f -exec md5sum {} + | LC_ALL=C sort"
)


async def test_incremental_listing_follows_moves_deletes_and_mode_changes(
    client: AsyncClient, pool: str
) -> None:
    """A snapshot after a snapshot lists only what changed (ctime) plus every
    name; the result restores to exactly what a full listing would see."""
    async with client.acquire(pool, timeout=60) as sb:
        setup = (
            "mkdir -p tree/a/b gonedir/x swap keep && printf 1 > tree/a/b/deep && printf 2 > tree/a/top "
            "&& printf g > gone.txt && printf x > gonedir/x/f && printf s > swap/inner "
            "&& printf '#!/bin/sh\\n' > keep/mode.sh && printf 'SAME' > keep/same "
            "&& printf u > keep/untouched"
        )
        assert (await sb.exec(setup)).ok
        first = await sb.snapshot()
        r = await sb.exec(CHURN)
        assert r.ok, r
        want = (await sb.exec(SNAP_VIEW)).text
        second = await sb.snapshot()
    assert second.parent_id == first.id
    # The moved files, 'swap' and 'keep/same' are read again; only 'swap' holds new content.
    assert second.stored_bytes == len("file"), second.stored_bytes
    restored = await client.restore(second.id, timeout=60)
    try:
        assert (await restored[0].exec(SNAP_VIEW)).text == want
    finally:
        await restored.release()


SWAPPER = r"""
cd /workspace
mkdir -p real/sub && printf inner > real/sub/f && mkfifo pipe
( while :; do mv real aside && ln -s / real && rm real && mv aside real; done ) >/dev/null 2>&1 &
echo started
"""


async def test_a_workspace_swapping_directories_for_links_is_never_left(
    app: App, client: AsyncClient, pool: str
) -> None:
    """While the sandbox keeps replacing a directory by a link to / (and a
    FIFO sits in the workspace), every snapshot holds only workspace entries:
    nothing is read through a link, the FIFO blocks nothing, and a link
    caught pointing out is refused by name."""
    assert app.snapshots is not None
    async with client.acquire(pool, timeout=60) as sb:
        assert (await sb.exec(SWAPPER, session="bg")).text == "started\n"
        taken = refused = 0
        for _ in range(6):
            try:
                snap = await sb.snapshot()
            except errors.FailedPrecondition as e:
                # Caught pointing out, or (read through the sandbox) a listed
                # file gone by the time tar reached it.
                assert "leaves the workspace" in str(e) or "changed while" in str(e), e
                refused += 1
                continue
            taken += 1
            resolved = await app.snapshots._catalog.entries(snap.id)
            assert resolved is not None
            allowed = {"real", "real/sub", "real/sub/f", "aside", "aside/sub", "aside/sub/f"}
            assert set(resolved) <= allowed, set(resolved) - allowed
            for e in resolved.values():
                if e.kind == mf.FILE:
                    assert e.size == 5, e  # "inner", never a file from elsewhere
        assert taken + refused == 6


JOURNAL_SETUP = (
    "mkdir -p keep olddir/x && printf a > keep/a && printf b > keep/b && printf c > keep/c "
    "&& printf 'SAME' > keep/same && printf 'mmmmmmmm' > keep/m && printf o > olddir/x/f"
)
# Kinds, modes, links and contents; FIFOs (never carried) and the sizes of
# directories (which count a FIFO's entry) left out.
JOURNAL_VIEW = (
    "cd /workspace && find . ! -type p -printf '%y %m %p -> %l\\n' | LC_ALL=C sort "
    "&& find . -type f -exec md5sum {} + | LC_ALL=C sort"
)
MMAP_WRITE = (
    "python3 -c \"import mmap; f = open('keep/m', 'r+b'); m = mmap.mmap(f.fileno(), 0); "
    "m[0:4] = b'MMAP'; m.close(); f.close()\""
)
JOURNALED = [
    "printf changed > keep/a",
    "printf n > new.txt && mkdir -p nd/sub && printf d > nd/sub/f && ln -s ../keep/a nd/link",
    "rm keep/b && rm -r olddir",
    "chmod 0700 keep/c",
    "printf 'SAME' > keep/same && touch -d @1000000000 keep/same",
    MMAP_WRITE,
    "mkfifo fifo && rm nd/sub/f",
    "",
]


async def test_snapshots_of_a_restored_workspace_follow_its_journal(
    tmp_path: Path, engine: docker.DockerClient, image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In place, each snapshot after a restore or a snapshot looks only at
    the paths the workspace's change journal recorded (no walk), and every
    one restores to exactly what the sandbox held: edits, new trees and
    links, deletions, a mode change, a same-size rewrite with an old mtime,
    a write through a shared mapping, a FIFO (left out), a write through one
    name of a file with two. A directory moved, a file given a second name,
    or a snapshot that failed after taking the journal, makes the next one
    walk; the one after follows a new journal."""
    async with running_app(make_settings(tmp_path), engine) as app:
        assert app.snapshots is not None
        manager = app.snapshots
        walks: list[str] = []
        real_list = manager._workspaces.list_in_place

        async def spy_list(*a: Any, **kw: Any) -> Any:
            walks.append("walk")
            return await real_list(*a, **kw)

        monkeypatch.setattr(manager._workspaces, "list_in_place", spy_list)
        async with AsyncClient(app.address) as client:
            await client.create_pool("j", image, min_ready=1, max_size=4)
            async with client.acquire("j", timeout=60) as sb:
                assert (await sb.exec(JOURNAL_SETUP)).ok
                first = await sb.snapshot()
            restored = await client.restore(first.id, timeout=60)
            try:
                target = restored[0]
                for step in JOURNALED:
                    if step:
                        r = await target.exec(step)
                        assert r.ok, (step, r)
                    want = (await target.exec(JOURNAL_VIEW)).text
                    snap = await target.snapshot()
                    assert walks == [], f"{step!r} was looked at by a walk"
                    if not step:
                        assert snap.stored_bytes == 0
                    check = await client.restore(snap.id, timeout=60)
                    try:
                        assert (await check[0].exec(JOURNAL_VIEW)).text == want, step
                    finally:
                        await check.release()
                # A file that gets a second name: that snapshot walks to learn
                # all its names; later writes through one show under both.
                assert (await target.exec("ln keep/a hard")).ok
                await target.snapshot()
                assert walks == ["walk"]
                assert (await target.exec("printf through-a > keep/a")).ok
                linked = await target.snapshot()
                assert walks == ["walk"]
                check = await client.restore(linked.id, timeout=60)
                try:
                    got = await check[0].read_files(["hard", "keep/a"])
                    assert got == {"hard": b"through-a", "keep/a": b"through-a"}
                finally:
                    await check.release()
                # A snapshot that fails after taking the journal loses nothing:
                # the next one walks.
                assert (await target.exec("printf lost > keep/lost && ln -s /etc bad")).ok
                with pytest.raises(errors.FailedPrecondition, match="leaves the workspace"):
                    await target.snapshot()
                assert (await target.exec("rm bad")).ok
                kept = await target.snapshot()
                assert walks == ["walk"] * 2
                check = await client.restore(kept.id, timeout=60)
                try:
                    assert (await check[0].read_files(["keep/lost"])) == {"keep/lost": b"lost"}
                finally:
                    await check.release()
                assert (await target.exec("mv nd moved")).ok
                await target.snapshot()
                assert walks == ["walk"] * 3, "a moved directory: one walk"
                assert (await target.exec("printf again > moved/again")).ok
                last = await target.snapshot()
                assert walks == ["walk"] * 3, "then the journal again"
                assert last.stored_bytes == len("again")
            finally:
                await restored.release()


async def test_a_snapshot_after_its_parent_was_deleted_and_collected_is_whole(
    app: App, client: AsyncClient, pool: str
) -> None:
    """The parent's blobs are gone: what the next snapshot would carry over
    is read again (in place: the journal is not trusted for it)."""
    assert app.snapshots is not None
    async with client.acquire(pool, timeout=60) as sb:
        assert (await sb.exec("mkdir -p d && printf one > d/one && printf two > two")).ok
        parent = await sb.snapshot()
        await client.delete_snapshot(parent.id)
        assert (await app.snapshots.gc()).deleted_blobs >= 2
        assert (await sb.exec("printf three > three")).ok
        child = await sb.snapshot()
    restored = await client.restore(child.id, timeout=60)
    try:
        got = await restored[0].read_files(["d/one", "two", "three"])
        assert got == {"d/one": b"one", "two": b"two", "three": b"three"}
    finally:
        await restored.release()


async def test_a_journal_that_recorded_most_of_the_workspace_is_answered_by_a_walk(
    tmp_path: Path, engine: docker.DockerClient, image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rewrite of most files costs less as one walk than as a look per
    recorded path; the snapshot is the same either way."""
    monkeypatch.setattr(contents, "_REWALK_TOUCHED", 2)
    async with running_app(make_settings(tmp_path), engine) as app:
        assert app.snapshots is not None
        walks: list[str] = []
        real_list = app.snapshots._workspaces.list_in_place

        async def spy_list(*a: Any, **kw: Any) -> Any:
            walks.append("walk")
            return await real_list(*a, **kw)

        monkeypatch.setattr(app.snapshots._workspaces, "list_in_place", spy_list)
        async with AsyncClient(app.address) as client:
            await client.create_pool("w", image, min_ready=1, max_size=2)
            async with client.acquire("w", timeout=60) as sb:
                assert (await sb.exec("for f in a b c d; do printf $f > $f; done")).ok
                await sb.snapshot()
                assert (await sb.exec("printf x > d")).ok
                await sb.snapshot()
                assert walks == [], "a small change follows the journal"
                assert (await sb.exec("for f in a b c; do printf $f$f > $f; done")).ok
                snap = await sb.snapshot()
                assert walks == ["walk"]
            restored = await client.restore(snap.id, timeout=60)
            try:
                got = await restored[0].read_files(["a", "b", "c", "d"])
                assert got == {"a": b"aa", "b": b"bb", "c": b"cc", "d": b"x"}
            finally:
                await restored.release()
