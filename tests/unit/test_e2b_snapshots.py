"""The E2B front end's snapshot book: how references (ids, names, tags)
resolve, how a name moves to a later snapshot, list pages; and the
snapshot routes' refusals, answered before any call reaches sandboxd (the
client here points nowhere)."""

from __future__ import annotations

from typing import cast

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from sandboxd.client import AsyncClient
from sandboxd.e2b.app import CONTROL
from sandboxd.e2b.control import Refused
from sandboxd.e2b.snapshots import Book, Snap, page, parse_limit, parse_name
from tests.unit.e2b_app import KEY

pytestmark = pytest.mark.timeout(30)

NOWHERE = cast(AsyncClient, object())
"""Never called: the book only holds it."""


def _snap(book: Book, key: str = "k", name: str = "", tag: str = "default", source: str = "i1") -> Snap:
    snap = Snap(
        id=Book.new_id(),
        key=key,
        client=NOWHERE,
        snapshot_id="sn-" + Book.new_id(),
        pool="p",
        image="",
        template="base",
        source=source,
        live=False,
        seq=book.next_seq(),
        name=name,
        tag=tag,
    )
    book.add(snap)
    return snap


def test_references_resolve_by_id_name_and_tag_within_one_key() -> None:
    book = Book()
    plain = _snap(book)
    named = _snap(book, name="ckpt")
    tagged = _snap(book, name="ckpt", tag="v2")
    theirs = _snap(book, key="other", name="ckpt")
    assert plain.info() == {"snapshotID": f"{plain.id}:default", "names": []}
    assert tagged.info() == {"snapshotID": "ckpt:v2", "names": ["ckpt:v2"]}
    assert book.resolve("k", plain.id) is plain
    assert book.resolve("k", f"{plain.id}:default") is plain
    assert book.resolve("k", f"{plain.id}:v2") is None
    assert book.resolve("k", "ckpt") is named and book.resolve("k", "ckpt:default") is named
    assert book.resolve("k", "ckpt:v2") is tagged
    assert book.resolve("other", "ckpt") is theirs
    assert book.resolve("other", plain.id) is None, "another key's snapshot is not found"
    assert book.resolve("k", "ckpt:v3") is None and book.resolve("k", "team/ckpt") is None
    assert book.matching("k", "ckpt", every_tag=True) == [named, tagged]
    assert book.matching("k", "ckpt", every_tag=False) == [named]


def test_a_later_snapshot_of_a_name_and_tag_takes_the_name_over() -> None:
    book = Book()
    first = _snap(book, name="ckpt")
    second = Snap(**{**first.__dict__, "id": Book.new_id(), "seq": book.next_seq()})
    assert book.add(second) is first
    assert book.resolve("k", "ckpt") is second
    assert first.ref == f"{first.id}:default" and book.resolve("k", first.ref) is first
    assert book.of_key("k") == [first, second]


def test_pages_follow_the_order_taken_and_survive_deletes() -> None:
    book = Book()
    snaps = [_snap(book) for _ in range(5)]
    shown, token = page(book.of_key("k"), 2, "")
    assert shown == snaps[:2] and token
    book.drop(snaps[2])
    shown, token = page(book.of_key("k"), 2, token)
    assert shown == snaps[3:5] and token == ""
    assert page(book.of_key("k"), 10, "") == (book.of_key("k"), "")
    with pytest.raises(Refused) as bad:
        page(snaps, 2, "abc")
    assert bad.value.status == 400


def test_names_and_limits_are_checked() -> None:
    assert parse_name(None) == ("", "default")
    assert parse_name("ckpt") == ("ckpt", "default")
    assert parse_name("ckpt:v2") == ("ckpt", "v2")
    for bad in [5, "a/b", "-x", "x:-", "s" + "0" * 20]:
        with pytest.raises(Refused) as refused:
            parse_name(bad)
        assert refused.value.status == 400
    assert parse_limit(None) == 100 and parse_limit("7") == 7
    for bad_limit in ["0", "101", "-1", "x"]:
        with pytest.raises(Refused):
            parse_limit(bad_limit)


async def test_snapshot_route_refusals(e2b_http: TestClient[web.Request, web.Application]) -> None:
    auth = {"X-API-Key": KEY}
    assert (await e2b_http.get("/snapshots")).status == 401
    r = await e2b_http.post("/sandboxes/inope/snapshots", json={}, headers=auth)
    assert (r.status, (await r.json())["code"]) == (404, 404)
    r = await e2b_http.get("/snapshots", headers=auth)
    assert (r.status, await r.json(), r.headers.get("x-next-token")) == (200, [], None)
    for query in ["limit=0", "limit=x", "nextToken=zz"]:
        r = await e2b_http.get(f"/snapshots?{query}", headers=auth)
        assert r.status == 400, query
    # The SDK escapes ':' (and '/') in the id: the route sees the reference whole.
    r = await e2b_http.delete("/templates/ckpt%3Av2", headers=auth)
    assert (r.status, (await r.json())["message"]) == (404, "snapshot 'ckpt:v2' not found")
    # A built template is not a snapshot: deleting it is answered as not served.
    e2b_http.app[CONTROL].catalog.template(KEY, "mine")
    r = await e2b_http.delete("/templates/mine", headers=auth)
    assert r.status == 400 and "deleting templates is not served" in (await r.json())["message"]
    # The builder's routes under /templates keep theirs.
    r = await e2b_http.request("DELETE", "/templates/tags", json={"name": "x", "tags": ["a"]}, headers=auth)
    assert r.status == 404 and "template" in (await r.json())["message"]
