"""Owners in snapshot manifests: the format carries them (and reads the
formats that did not), listings map the sandbox's own uid to SANDBOX_UID and
refuse what no restore could give back, and the restore plan creates every
entry by its owner with each directory closed only after what it holds."""

from __future__ import annotations

import json
import posixpath
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandboxd.backends.base import SANDBOX_UID
from sandboxd.backends.snapshot_shell import owned_round_script, restore_script
from sandboxd.core.snapshots import manifest as mf
from sandboxd.core.snapshots import owners
from sandboxd.core.snapshots.listing import Listed, parse_listing, recorded
from sandboxd.core.snapshots.manifest import DIR, FILE, LINK, Entry, UnsafeSnapshot
from sandboxd.errors import FailedPrecondition

S = SANDBOX_UID
DIGEST = mf.EMPTY_DIGEST


def test_owners_round_trip_and_old_formats_restore_as_the_sandbox_users() -> None:
    entries = [
        Entry("tests", DIR, 0o755, uid=0, gid=0),
        Entry("tests/test.py", FILE, 0o644, 0, DIGEST, uid=0, gid=0),
        Entry("mine\udcff", FILE, 0o600, 0, DIGEST),
    ]
    assert mf.decode(mf.encode(entries)) == entries
    base = {e.path: e for e in entries}
    delta = mf.encode_delta([Entry("tests/x", LINK, 0o777, target="test.py", uid=0, gid=0)], ["mine\udcff"])
    assert mf.is_delta(delta)
    assert sorted(mf.apply_delta(base, delta)) == ["tests", "tests/test.py", "tests/x"]
    assert mf.apply_delta(base, delta)["tests/x"].owner == (0, 0)
    # Formats 1 and 2 (no owners): every entry the sandbox user's.
    old = zlib.compress(json.dumps({"v": 1, "entries": [["a", "f", 420, 0, DIGEST, "", 1.0]]}).encode())
    assert mf.decode(old) == [Entry("a", FILE, 0o644, 0, DIGEST, mtime=1.0, uid=S, gid=S)]
    old_put = [["b", "d", 493, 0, "", "", 0.0]]
    old_delta = zlib.compress(json.dumps({"v": 2, "put": old_put, "del": []}).encode())
    assert mf.apply_delta({}, old_delta)["b"].owner == (S, S)
    # The digest names owners, yet a workspace of the sandbox user's keeps the digest it had.
    plain = [Entry("a", FILE, 0o644, 0, DIGEST)]
    assert mf.digest_of(plain) == mf.digest_of([plain[0]._replace(mtime=5.0)])
    assert mf.digest_of(plain) != mf.digest_of([plain[0]._replace(uid=0, gid=0)])
    header = mf.tar_header(entries[1])
    assert header[108:116] == b"0000000\0" and header[116:124] == b"0000000\0"


@pytest.mark.parametrize(
    ("entry", "why"),
    [
        (Entry("a", FILE, 0o644, 0, DIGEST, uid=1001, gid=1001), "neither the sandbox user's nor root's"),
        (Entry("a", FILE, 0o644, 0, DIGEST, uid=0, gid=S), "neither"),
        (Entry("a" * (mf.MAX_PATH_BYTES + 1), DIR, 0o755), f"longer than {mf.MAX_PATH_BYTES} bytes"),
        (Entry("\u20ac" * (mf.MAX_PATH_BYTES // 3 + 1), DIR, 0o755), "longer than"),
    ],
)
def test_manifests_with_owners_or_paths_no_restore_can_give_are_refused(entry: Entry, why: str) -> None:
    with pytest.raises(UnsafeSnapshot, match=why):
        mf.validate([entry])


def test_listings_record_the_sandbox_user_as_sandbox_uid_and_refuse_other_owners() -> None:
    raw = b"1.5\0f 644 3 1.0 1.0 2001 2001\0./mine\xff\0\0d 700 0 1.0 1.0 0 0\0./secret\0\0"
    _, listed = parse_listing(raw, (2001, 2001))
    assert [(i.path, i.uid, i.gid) for i in listed] == [("mine\udcff", S, S), ("secret", 0, 0)]
    with pytest.raises(FailedPrecondition, match=r"mine\\xff is owned by 2001:2001") as got:
        parse_listing(raw, (3000, 3000))
    got.value.message.encode("utf-8")  # sendable, whatever the name's bytes
    deep = Listed("f", 0o644, 0, "0", "0", "x/" * 2100, "", uid=S, gid=S)
    with pytest.raises(FailedPrecondition, match="no restore could write back"):
        recorded(deep, (S, S))


def _tree(draw: st.DrawFn) -> list[Entry]:
    entries: list[Entry] = []
    dirs = [""]
    for i in range(draw(st.integers(1, 25))):
        parent = draw(st.sampled_from(dirs))
        path = posixpath.join(parent, f"e{i}")
        kind = draw(st.sampled_from([FILE, DIR, LINK]))
        uid = draw(st.sampled_from([0, S]))
        mode = draw(st.sampled_from([0, 0o700, 0o755, 0o1777, 0o600, 0o444, 0o111]))
        if kind == DIR:
            dirs.append(path)
            entries.append(Entry(path, DIR, mode, uid=uid, gid=uid))
        elif kind == FILE:
            entries.append(Entry(path, FILE, mode & 0o777, 0, DIGEST, uid=uid, gid=uid))
        else:
            entries.append(Entry(path, LINK, 0o777, target="e0", uid=uid, gid=uid))
    return entries


@settings(max_examples=200, deadline=None)
@given(st.composite(_tree)())
def test_a_restore_plan_creates_each_entry_by_its_owner_and_closes_directories_last(
    entries: list[Entry],
) -> None:
    rounds = owners.plan(entries)
    assert rounds[0].actor == owners.SANDBOX
    by_path = {e.path: e for e in entries}
    made: dict[str, str] = {}
    final: dict[str, int] = {}
    opened: set[str] = set()
    for i, step in enumerate(rounds):
        if i:
            assert step.actor != rounds[i - 1].actor
        for e in step.create:
            parent = posixpath.dirname(e.path)
            assert parent == "" or parent in made, "created before its parent"
            # The parent is still open (0777), whoever made it.
            assert parent == "" or parent not in final
            assert owners.actor_of(by_path[e.path]) == step.actor
            made[e.path] = step.actor
        for mode, path in step.modes:
            e = by_path[path]
            assert made[path] == step.actor, "only the owner sets a mode"
            assert path not in final, "a mode set twice after it was final"
            if e.kind == DIR and path not in opened:
                assert mode == owners.OPEN_DIR_MODE
                opened.add(path)
                continue
            assert mode == e.mode
            if e.kind == DIR:
                # Closed only once everything below it is final.
                below = [p for p in by_path if p.startswith(path + "/") and by_path[p].kind != LINK]
                assert all(p in final for p in below)
            final[path] = mode
    assert set(made) == set(by_path)
    assert final == {e.path: e.mode for e in entries if e.kind != LINK}
    # A workspace of the sandbox user's alone is the plain restore.
    assert not owners.needs_rounds(e for e in entries if e.uid == S)


def test_round_scripts_read_their_modes_then_the_tar() -> None:
    payload = owners.modes_payload([(0o700, "a\udcff")])
    assert payload == b"700\0a\xff\0\0"
    first = owned_round_script(first=True)
    assert first.startswith("# sandboxd:owned-round\nexport LC_ALL=C\nfind /workspace -maxdepth 0 ")
    assert "chmod 0777 /workspace" not in owned_round_script(first=False)
    assert "chmod 755 -- /workspace" in restore_script(fixups=False, top_mode="755")


@pytest.mark.parametrize(
    ("entries", "why"),
    [
        (
            [Entry("k", FILE, 0o000, 0, DIGEST)],
            r"/workspace/k cannot be snapshotted: .* may not read it \(mode 0000\)",
        ),
        ([Entry("d", DIR, 0o300)], r"may not list it \(mode 0300\)"),
        (
            [Entry("secret", DIR, 0o700, uid=0, gid=0), Entry("secret/mine", FILE, 0o644, 0, DIGEST)],
            r"secret/mine cannot be snapshotted: its owner \(the sandbox user\) may not search 'secret'",
        ),
        (
            [Entry("mine", DIR, 0o700), Entry("mine/\udcffkey", FILE, 0o600, 0, DIGEST, uid=0, gid=0)],
            r"mine/\\xffkey cannot be snapshotted: its owner \(root\)",
        ),
    ],
)
def test_what_its_owner_could_not_read_in_the_sandbox_is_refused_naming_it(
    entries: list[Entry], why: str
) -> None:
    with pytest.raises(FailedPrecondition, match=why):
        owners.refuse_unreadable(entries)


def test_a_grader_and_the_users_own_closed_files_are_taken() -> None:
    owners.refuse_unreadable(
        [
            Entry("secret", DIR, 0o700, uid=0, gid=0),
            Entry("secret/key", FILE, 0o600, 0, DIGEST, uid=0, gid=0),
            Entry("tests", DIR, 0o755, uid=0, gid=0),
            Entry("tests/mine", FILE, 0o400, 0, DIGEST),  # the user's, in root's open directory
            Entry("tmp", DIR, 0o1777),
            Entry("tmp/x", LINK, 0o777, target="../tests"),
        ]
    )
