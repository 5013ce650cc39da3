"""The E2B front end refuses bad requests itself, with E2B's statuses and
codes, before any call reaches sandboxd (the client here points nowhere)."""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from sandboxd.client import AsyncClient
from sandboxd.e2b import E2bSettings, make_app

KEY = "e2b_" + "ab" * 20


@pytest.fixture
async def http() -> AsyncIterator[TestClient[web.Request, web.Application]]:
    client = AsyncClient("127.0.0.1:1")
    app = make_app(client, E2bSettings(api_keys=frozenset({KEY})))
    async with TestClient(TestServer(app)) as c:
        yield c
    await client.close()


async def test_control_api_refusals(http: TestClient[web.Request, web.Application]) -> None:
    r = await http.post("/sandboxes", json={"templateID": "base"})
    assert r.status == 401
    r = await http.post("/sandboxes", json={"templateID": "base"}, headers={"X-API-Key": "e2b_00"})
    assert (r.status, (await r.json())["message"]) == (401, "invalid API key")
    auth = {"X-API-Key": KEY}
    for body, says in [
        ({}, "templateID is required"),
        ({"templateID": "base", "timeout": -5}, "timeout must be an integer"),
        ({"templateID": "base", "metadata": {"a": 1}}, "metadata must map strings to strings"),
        ({"templateID": "base", "envVars": ["A=1"]}, "envVars must map strings to strings"),
    ]:
        r = await http.post("/sandboxes", json=body, headers=auth)
        assert r.status == 400 and says in (await r.json())["message"], body
    r = await http.post("/sandboxes", data=b"{not json", headers=auth)
    assert r.status == 400
    for method, path in [
        ("GET", "/sandboxes/inone"),
        ("DELETE", "/sandboxes/inone"),
        ("POST", "/sandboxes/inone/pause"),
    ]:
        r = await http.request(method, path, headers=auth)
        assert r.status == 404, path
    r = await http.get("/v2/sandboxes", params={"metadata": "no-pair"}, headers=auth)
    assert r.status == 400
    r = await http.get("/v2/sandboxes", headers=auth)
    assert (r.status, await r.json()) == (200, [])


async def test_envd_refusals(http: TestClient[web.Request, web.Application]) -> None:
    r = await http.post("/process.Process/List", json={})
    assert (r.status, (await r.json())["code"]) == (400, "invalid_argument")
    r = await http.post("/process.Process/List", json={}, headers={"E2b-Sandbox-Id": "inone"})
    assert (r.status, (await r.json())["code"]) == (404, "not_found")
    r = await http.get("/health", headers={"E2b-Sandbox-Id": "inone"})
    assert r.status == 502, "the SDK's is_running reads 502 as gone"
    r = await http.get("/files", params={"path": "/x"}, headers={"E2b-Sandbox-Id": "inone"})
    assert r.status == 404
    body = b'{"process":{"cmd":"ls"}}'
    r = await http.post(
        "/process.Process/Start",
        data=struct.pack(">BI", 0, len(body) + 3) + body,
        headers={"Content-Type": "application/connect+json", "E2b-Sandbox-Id": "inone"},
    )
    assert (r.status, (await r.json())["message"]) == (400, "request envelope length does not match its body")
    r = await http.post("/process.Process/Start", data=b"x", headers={"Content-Type": "application/proto"})
    assert (await r.json())["code"] == "invalid_argument"
