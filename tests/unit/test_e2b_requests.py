"""The E2B front end refuses bad requests itself, with E2B's statuses and
codes, before any call reaches sandboxd (the client here points nowhere)."""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from sandboxd.client import AsyncClient
from sandboxd.e2b import E2bSettings, make_app
from tests.unit.e2b_app import KEY


async def test_control_api_refusals(e2b_http: TestClient[web.Request, web.Application]) -> None:
    r = await e2b_http.post("/sandboxes", json={"templateID": "base"})
    assert r.status == 401
    r = await e2b_http.post("/sandboxes", json={"templateID": "base"}, headers={"X-API-Key": "e2b_00"})
    assert (r.status, (await r.json())["message"]) == (401, "invalid API key")
    auth = {"X-API-Key": KEY}
    for body, says in [
        ({}, "templateID is required"),
        ({"templateID": "base", "timeout": -5}, "timeout must be an integer"),
        ({"templateID": "base", "metadata": {"a": 1}}, "metadata must map strings to strings"),
        ({"templateID": "base", "envVars": ["A=1"]}, "envVars must map strings to strings"),
    ]:
        r = await e2b_http.post("/sandboxes", json=body, headers=auth)
        assert r.status == 400 and says in (await r.json())["message"], body
    r = await e2b_http.post("/sandboxes", data=b"{not json", headers=auth)
    assert r.status == 400
    for method, path in [
        ("GET", "/sandboxes/inone"),
        ("DELETE", "/sandboxes/inone"),
        ("POST", "/sandboxes/inone/pause"),
    ]:
        r = await e2b_http.request(method, path, headers=auth)
        assert r.status == 404, path
    r = await e2b_http.get("/v2/sandboxes", params={"metadata": "no-pair"}, headers=auth)
    assert r.status == 400
    r = await e2b_http.get("/v2/sandboxes", headers=auth)
    assert (r.status, await r.json()) == (200, [])
    # Without a build pool the SDK's template builds are refused, saying what to do instead.
    for path in ("/v3/templates", "/v2/templates"):
        r = await e2b_http.post(path, json={"name": "task__0a1b"}, headers=auth)
        message = (await r.json())["message"]
        assert r.status == 501 and "--build-pool" in message and "templates file" in message, path
    r = await e2b_http.post("/v3/templates", json={"name": "t"})
    assert r.status == 401
    # The newer create (/v2/sandboxes) refuses what sandboxd does not do, naming it.
    for body, says in [
        ({"templateID": "base", "volumeMounts": [{"name": "v", "path": "/v"}]}, "volumeMounts"),
        ({"templateID": "base", "autoPause": True}, "autoPause"),
        ({"templateID": "base", "autoResume": {"enabled": True}}, "autoResume"),
        ({"templateID": "base", "mcp": {"x": {}}}, "mcp"),
        ({"templateID": "base", "network": {"denyOut": ["10.0.0.0/8"]}}, "network.denyOut"),
    ]:
        r = await e2b_http.post("/v2/sandboxes", json=body, headers=auth)
        assert r.status == 400 and says in (await r.json())["message"], body
    r = await e2b_http.post("/v2/sandboxes/inone/connect", json={"timeout": 10}, headers=auth)
    assert r.status == 404


async def _never(context: Path, on_log: Callable[[str], None]) -> str:
    raise AssertionError("a refused build must not reach the image builder")


async def test_template_builder_refusals() -> None:
    client = AsyncClient("127.0.0.1:1")
    settings = E2bSettings(api_keys=frozenset({KEY}), build_image=_never, build_pool="any")
    auth = {"X-API-Key": KEY}
    async with TestClient(TestServer(make_app(client, settings))) as e2b_http:
        for body, says in [
            ({}, "name is required"),
            ({"name": "bad name"}, "template name"),
            ({"name": "ok", "tags": ["no/slash"]}, "tag"),
        ]:
            r = await e2b_http.post("/v3/templates", json=body, headers=auth)
            assert r.status == 400 and says in (await r.json())["message"], body
        r = await e2b_http.post("/v3/templates", json={"name": "tpl:v1"}, headers=auth)
        assert r.status == 202
        made = await r.json()
        assert made["tags"] == ["v1"] and made["names"] == ["tpl"]
        tid, bid = made["templateID"], made["buildID"]
        r = await e2b_http.get(f"/templates/{tid}/files/{'0' * 64}", headers={"X-API-Key": "e2b_other"})
        assert r.status == 401
        r = await e2b_http.get(f"/templates/{tid}/files/{'0' * 64}", headers=auth)
        assert r.status == 201 and (await r.json())["present"] is False
        for steps, says in [
            ({"steps": [{"type": "RUN", "args": ["true"]}]}, "step base: a base image"),
            ({"fromImage": "x", "steps": [{"type": "HEALTHCHECK", "args": []}]}, "step 1: unknown step type"),
            (
                {
                    "fromImage": "x",
                    "steps": [{"type": "COPY", "args": ["../up", "/x"], "filesHash": "0" * 64}],
                },
                "step 1",
            ),
            (
                {"fromImage": "x", "steps": [{"type": "COPY", "args": ["a", "/x"], "filesHash": "0" * 64}]},
                "not uploaded",
            ),
            ({"fromImage": "x", "fromImageRegistry": {"type": "aws"}}, "registry credentials"),
        ]:
            r = await e2b_http.post("/v3/templates", json={"name": "tpl"}, headers=auth)
            bid = (await r.json())["buildID"]
            r = await e2b_http.post(f"/v2/templates/{tid}/builds/{bid}", json=steps, headers=auth)
            assert r.status == 400 and says in (await r.json())["message"], steps
            r = await e2b_http.get(f"/templates/{tid}/builds/{bid}/status", headers=auth)
            status = await r.json()
            assert status["status"] == "error" and says in status["reason"]["message"], steps
        r = await e2b_http.get(f"/templates/{tid}/builds/nope/status", headers=auth)
        assert r.status == 404
        r = await e2b_http.get("/templates/nope/tags", headers=auth)
        assert r.status == 404
        r = await e2b_http.put("/e2b-uploads/not-a-token", data=b"x")
        assert r.status == 404
        r = await e2b_http.post("/sandboxes", json={"templateID": "tpl"}, headers=auth)
        assert (
            r.status == 404
            and "tag 'default' does not exist for template 'tpl'" in (await r.json())["message"]
        )
    await client.close()


async def test_envd_refusals(e2b_http: TestClient[web.Request, web.Application]) -> None:
    r = await e2b_http.post("/process.Process/List", json={})
    assert (r.status, (await r.json())["code"]) == (400, "invalid_argument")
    r = await e2b_http.post("/process.Process/List", json={}, headers={"E2b-Sandbox-Id": "inone"})
    assert (r.status, (await r.json())["code"]) == (404, "not_found")
    r = await e2b_http.get("/health", headers={"E2b-Sandbox-Id": "inone"})
    assert r.status == 502, "the SDK's is_running reads 502 as gone"
    r = await e2b_http.get("/files", params={"path": "/x"}, headers={"E2b-Sandbox-Id": "inone"})
    assert r.status == 404
    body = b'{"process":{"cmd":"ls"}}'
    r = await e2b_http.post(
        "/process.Process/Start",
        data=struct.pack(">BI", 0, len(body) + 3) + body,
        headers={"Content-Type": "application/connect+json", "E2b-Sandbox-Id": "inone"},
    )
    assert (r.status, (await r.json())["message"]) == (400, "request envelope length does not match its body")
    r = await e2b_http.post(
        "/process.Process/Start", data=b"x", headers={"Content-Type": "application/proto"}
    )
    assert (await r.json())["code"] == "invalid_argument"
