"""The E2B front end's state file: built templates and E2B snapshots saved
and loaded whole, written atomically, a file it cannot read refused naming
it, API keys kept only as digests; and an app started over one (its
sandboxd a fake here): snapshots sandboxd lost dropped, a template whose
image is gone answering creates so, a build interrupted by the restart an
error saying so, and the close keeping the snapshots."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import pytest
from aiohttp.test_utils import TestClient, TestServer

from sandboxd import errors
from sandboxd.client import AsyncClient
from sandboxd.e2b import E2bSettings, make_app
from sandboxd.e2b.catalog import BUILDING, ERROR, READY, Catalog, owner_of
from sandboxd.e2b.snapshots import Book, Snap
from sandboxd.e2b.state import RESTARTED, VERSION, StateError, Store, decode, encode
from sandboxd.v1 import preflight_pb2

pytestmark = pytest.mark.timeout(30)

KEY = "e2b_" + "c4" * 20
OTHER = "e2b_" + "d5" * 20
NOWHERE = cast(AsyncClient, object())


def _snap(book: Book, key: str, name: str = "", snapshot_id: str = "") -> Snap:
    snap = Snap(
        id=Book.new_id(),
        key=owner_of(key),
        client=NOWHERE,
        snapshot_id=snapshot_id or "sn-" + Book.new_id(),
        pool="p",
        image="img:1",
        template="base",
        source="i1",
        live=False,
        seq=book.next_seq(),
        name=name,
    )
    book.add(snap)
    return snap


def _names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def _filled() -> tuple[Catalog, Book]:
    """A catalog with a ready build (tagged), one still building and one
    failed; a book with a named and an unnamed snapshot."""
    catalog, book = Catalog(), Book()
    built = catalog.template(KEY, "tpl")
    ready = catalog.new_build(built)
    ready.status, ready.image = READY, "sandboxd-build:aaa"
    ready.start_cmd, ready.ready_cmd, ready.user, ready.workdir = "sleep 1", "true", "user", "/opt"
    built.tag(["default", "v1"], ready.id)
    running = catalog.new_build(built)
    running.status = BUILDING
    built.tag(["v2"], running.id)
    failed = catalog.new_build(built)
    failed.fail("boom")
    built.tag(["v3"], failed.id)
    _snap(book, KEY, name="ckpt")
    _snap(book, OTHER)
    return catalog, book


async def test_round_trip_keeps_ready_builds_tags_and_snapshots(tmp_path: Path) -> None:
    catalog, book = _filled()
    path = tmp_path / "e2b.json"
    await Store(path, catalog, book).save()
    builts, snaps = await Store(path, Catalog(), Book()).load()

    (built,) = builts
    original = catalog.find(KEY, "tpl")
    assert original is not None
    assert (built.id, built.name, built.owner) == (original.id, "tpl", owner_of(KEY))
    ready_id = original.tags["v1"][0]
    running_id = original.tags["v2"][0]
    assert set(built.builds) == {ready_id, running_id}, "the failed build is not kept"
    ready = built.builds[ready_id]
    assert (ready.status, ready.image, ready.start_cmd, ready.ready_cmd, ready.user, ready.workdir) == (
        READY,
        "sandboxd-build:aaa",
        "sleep 1",
        "true",
        "user",
        "/opt",
    )
    assert ready.created_at == original.builds[ready_id].created_at
    interrupted = built.builds[running_id]
    assert interrupted.status == ERROR and interrupted.reason is not None
    assert interrupted.reason["message"] == RESTARTED
    assert set(built.tags) == {"default", "v1", "v2"}, "the failed build's tag is not kept"
    assert built.tags["v1"] == original.tags["v1"]

    assert [(s.id, s.key, s.snapshot_id, s.name, s.tag, s.seq) for s in snaps] == [
        (s.id, s.key, s.snapshot_id, s.name, s.tag, s.seq) for s in book.all()
    ]
    restored = Book()
    restored.restore(snaps)
    assert restored.next_seq() == 3, "later snapshots list after the loaded ones"


async def test_a_loaded_template_is_found_by_its_key_only(tmp_path: Path) -> None:
    catalog, book = _filled()
    path = tmp_path / "e2b.json"
    await Store(path, catalog, book).save()
    builts, snaps = await Store(path, Catalog(), Book()).load()
    fresh = Catalog()
    for b in builts:
        fresh.add(b)
    assert fresh.find(KEY, "tpl") is builts[0]
    assert fresh.find(KEY, builts[0].id) is builts[0]
    assert fresh.find(OTHER, "tpl") is None and fresh.find(OTHER, builts[0].id) is None
    found = fresh.resolve(KEY, "tpl:v1")
    assert found is not None and found.image == "sandboxd-build:aaa"
    again = Book()
    again.restore(snaps)
    assert again.resolve(owner_of(KEY), "ckpt") is not None
    assert again.resolve(owner_of(OTHER), "ckpt") is None


async def test_no_api_key_is_written(tmp_path: Path) -> None:
    catalog, book = _filled()
    path = tmp_path / "e2b.json"
    await Store(path, catalog, book).save()
    raw = path.read_bytes()
    for key in (KEY, OTHER):
        assert key.encode() not in raw
        assert owner_of(key).encode() in raw
    assert owner_of(KEY) != owner_of(OTHER) and owner_of(KEY) == owner_of(KEY)
    assert oct(path.stat().st_mode & 0o777) == oct(0o600)


async def test_each_save_replaces_the_file_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    catalog, book = _filled()
    path = tmp_path / "e2b.json"
    store = Store(path, catalog, book)
    await store.save()
    first = path.read_bytes()
    _snap(book, KEY, name="later")
    await store.save()
    assert path.read_bytes() != first and len(json.loads(path.read_bytes())["snapshots"]) == 3
    assert _names(tmp_path) == ["e2b.json"], "no temporary file left"

    # A write cut short before its rename leaves the previous file as it was.
    before = path.read_bytes()

    def fail(src: Any, dst: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    _snap(book, KEY, name="lost")
    await store.save()  # logged, kept in memory
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert _names(tmp_path) == ["e2b.json"]
    await store.save()
    assert len(json.loads(path.read_bytes())["snapshots"]) == 4, "the next save writes it"

    # A temporary file a crash left behind is removed at the next load.
    (tmp_path / ".e2b.json.dead.tmp").write_bytes(b"{partial")
    await Store(path, Catalog(), Book()).load()
    assert _names(tmp_path) == ["e2b.json"]


async def test_concurrent_saves_are_coalesced(tmp_path: Path) -> None:
    import asyncio

    catalog, book = _filled()
    store = Store(tmp_path / "e2b.json", catalog, book)
    await asyncio.gather(*(store.save() for _ in range(20)))
    assert store._written == 20


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"{not json", "not a readable"),
        (b"[]", "not an E2B state file"),
        (json.dumps({"format": "sandboxd-e2b-state", "version": VERSION + 1}).encode(), "newer sandboxd"),
        (json.dumps({"format": "sandboxd-e2b-state", "version": "1"}).encode(), "version"),
        (
            json.dumps(
                {"format": "sandboxd-e2b-state", "version": 1, "templates": {}, "snapshots": []}
            ).encode(),
            "corrupt",
        ),
        (
            json.dumps(
                {
                    "format": "sandboxd-e2b-state",
                    "version": 1,
                    "templates": [
                        {"id": "t1", "name": "n", "owner": "o", "builds": [], "tags": [{"tag": "x"}]}
                    ],
                    "snapshots": [],
                }
            ).encode(),
            "corrupt",
        ),
        (
            json.dumps(
                {"format": "sandboxd-e2b-state", "version": 1, "templates": [], "snapshots": [{"id": "s"}]}
            ).encode(),
            "corrupt",
        ),
    ],
)
async def test_a_file_it_cannot_read_is_refused_naming_it(tmp_path: Path, content: bytes, why: str) -> None:
    path = tmp_path / "e2b.json"
    path.write_bytes(content)
    with pytest.raises(StateError) as refused:
        await Store(path, Catalog(), Book()).load()
    assert str(path) in str(refused.value) and why in str(refused.value)
    assert path.read_bytes() == content, "the file is left as it was"


def test_decode_of_an_encoded_empty_state() -> None:
    assert decode(Path("x"), json.dumps(encode(Catalog(), Book())).encode()) == ([], [])


class FakeSandboxd:
    """The calls a state load and the snapshot close make, answered from sets."""

    def __init__(self, gone_snapshots: set[str], missing_images: set[str]) -> None:
        self.gone_snapshots = gone_snapshots
        self.missing_images = missing_images
        self.deleted: list[str] = []
        self.target = "nowhere"

    async def get_snapshot(self, snapshot_id: str) -> object:
        if snapshot_id in self.gone_snapshots:
            raise errors.NotFound(f"snapshot {snapshot_id} not found")
        return object()

    async def preflight(
        self, *, concurrent: int, image: str = "", **_: Any
    ) -> preflight_pb2.PreflightResponse:
        answer = preflight_pb2.PreflightResponse(ok=True)
        if image in self.missing_images:
            answer.ok = False
            answer.problems.add(
                kind=preflight_pb2.PROBLEM_KIND_IMAGE_MISSING, message=f"image {image!r} is gone"
            )
        return answer

    async def delete_snapshot(self, snapshot_id: str) -> None:
        self.deleted.append(snapshot_id)

    async def close(self) -> None:
        pass


@pytest.fixture
async def saved(tmp_path: Path) -> AsyncIterator[tuple[Path, Catalog, Book]]:
    catalog, book = _filled()
    built = catalog.find(KEY, "tpl")
    assert built is not None
    other = catalog.new_build(built)
    other.status, other.image = READY, "sandboxd-build:gone"
    built.tag(["old"], other.id)
    _snap(book, KEY, name="lost", snapshot_id="sn-lost")
    path = tmp_path / "e2b.json"
    await Store(path, catalog, book).save()
    yield path, catalog, book


async def test_an_app_loads_checks_and_keeps_its_state(saved: tuple[Path, Catalog, Book]) -> None:
    path, catalog, _ = saved
    sandboxd = FakeSandboxd({"sn-lost"}, {"sandboxd-build:gone"})
    settings = E2bSettings(api_keys=frozenset({KEY, OTHER}), state_file=path)
    app = make_app(cast(AsyncClient, sandboxd), settings)
    auth = {"X-API-Key": KEY}
    async with TestClient(TestServer(app)) as http:
        r = await http.get("/snapshots", headers=auth)
        assert [s["snapshotID"] for s in await r.json()] == ["ckpt:default"], "the lost snapshot is dropped"
        assert "sn-lost" not in path.read_text(), "and the file saved without it"
        r = await http.get("/snapshots", headers={"X-API-Key": OTHER})
        assert len(await r.json()) == 1

        r = await http.post("/sandboxes", json={"templateID": "tpl:old"}, headers=auth)
        message = (await r.json())["message"]
        assert r.status == 404 and "sandboxd-build:gone is no longer on the engine" in message, message
        assert "build the template again" in message

        built = catalog.find(KEY, "tpl")
        assert built is not None
        running_id = built.tags["v2"][0]
        r = await http.get(f"/templates/{built.id}/builds/{running_id}/status", headers=auth)
        answer = await r.json()
        assert answer["status"] == "error" and "restarted" in answer["reason"]["message"]
        r = await http.get(f"/templates/{built.id}/builds/{running_id}/status", headers={"X-API-Key": OTHER})
        assert r.status == 404, "another key does not see the template"
    assert sandboxd.deleted == [], "the close keeps saved snapshots"
    assert len(json.loads(path.read_bytes())["snapshots"]) == 2


async def test_an_app_over_a_corrupt_file_does_not_start(tmp_path: Path) -> None:
    path = tmp_path / "e2b.json"
    path.write_bytes(b"\x00garbage")
    app = make_app(cast(AsyncClient, FakeSandboxd(set(), set())), E2bSettings(state_file=path))
    with pytest.raises(StateError, match="e2b.json"):
        async with TestClient(TestServer(app)):
            pass
    assert path.read_bytes() == b"\x00garbage"


async def test_without_a_state_file_the_close_deletes_the_snapshots() -> None:
    from sandboxd.e2b.snapshots import BOOK

    sandboxd = FakeSandboxd(set(), set())
    app = make_app(cast(AsyncClient, sandboxd), E2bSettings())
    async with TestClient(TestServer(app)) as http:
        snap = _snap(http.app[BOOK], KEY)
        snap.client = cast(AsyncClient, sandboxd)
    assert sandboxd.deleted == [snap.snapshot_id]


def test_e2b_api_state_dir_flag_and_a_corrupt_file_stopping_it(tmp_path: Path) -> None:
    import argparse

    from sandboxd.cli import main
    from sandboxd.e2b.cli import STATE_FILE, add_parser

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["e2b-api", "--state-dir", str(tmp_path)])
    assert args.e2b_state_dir == tmp_path
    assert parser.parse_args(["e2b-api"]).e2b_state_dir is None, "in memory unless asked"

    (tmp_path / STATE_FILE).write_bytes(b"{")
    with pytest.raises(SystemExit) as stopped:
        main(["e2b-api", "--target", "127.0.0.1:1", "--port", "0", "--state-dir", str(tmp_path)])
    assert str(tmp_path / STATE_FILE) in str(stopped.value.code) and "refusing to start" in str(
        stopped.value.code
    )


async def test_settings_from_names_the_state_file(tmp_path: Path) -> None:
    import argparse

    from sandboxd.e2b.cli import STATE_FILE, add_parser, settings_from

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command"))
    with_dir = await settings_from(parser.parse_args(["e2b-api", "--state-dir", str(tmp_path)]), None)
    assert with_dir.state_file == tmp_path / STATE_FILE
    assert (await settings_from(parser.parse_args(["e2b-api"]), None)).state_file is None
