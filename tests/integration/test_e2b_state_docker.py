"""Built templates and E2B snapshots surviving a restart of ``sandboxd
serve --e2b-port`` (its state directory kept), through the unchanged
``e2b`` SDK on the real engine: a template built with the SDK's builder
starts sandboxes after the restart, a snapshot taken before it restores its
file, lists and deletes; a template whose image was removed from the engine
meanwhile answers creates saying so; no API key is written to the state
file, and nothing is left behind."""

from __future__ import annotations

import asyncio
import json
import secrets
from pathlib import Path
from typing import Any

import docker
import pytest

from sandboxd.client import AsyncClient
from tests.integration.conftest import poll
from tests.integration.e2b_server import point_sdk, serve_process

pytest.importorskip("e2b")

pytestmark = [pytest.mark.docker, pytest.mark.timeout(480)]

KEY = "e2b_" + "7a" * 20
POOL = "anyimage"


def _before_restart(image: str, token: str) -> dict[str, str]:
    """Builds two templates, snapshots a sandbox of the first with a file
    written; answers the snapshot's id."""
    from e2b import Sandbox, Template

    kept = Template().from_image(image).run_cmd(f"echo kept {token} > /etc/e2b-marker", user="root")
    Template.build(kept, "tpl-kept")
    dropped = Template().from_image(image).run_cmd(f"echo dropped {token} > /etc/e2b-marker", user="root")
    Template.build(dropped, "tpl-dropped")
    sbx = Sandbox.create("tpl-kept", timeout=120)
    try:
        sbx.files.write("/workspace/note.txt", f"before the restart {token}")
        snap = sbx.create_snapshot(name="kept")
        unnamed = sbx.create_snapshot()
    finally:
        sbx.kill()
    return {"named": snap.snapshot_id, "unnamed": unnamed.snapshot_id}


def _after_restart(snaps: dict[str, str]) -> dict[str, Any]:
    from e2b import Sandbox, SandboxException

    seen: dict[str, Any] = {}
    sbx = Sandbox.create("tpl-kept", timeout=120)
    try:
        seen["marker"] = sbx.commands.run("cat /etc/e2b-marker").stdout
    finally:
        sbx.kill()
    try:
        Sandbox.create("tpl-dropped", timeout=60)
    except SandboxException as e:
        seen["dropped"] = str(e)
    seen["listed"] = sorted(s.snapshot_id for s in Sandbox.list_snapshots().next_items())
    restored = Sandbox.create(snaps["named"], timeout=120)
    try:
        seen["note"] = restored.files.read("/workspace/note.txt")
    finally:
        restored.kill()
    seen["deleted"] = [Sandbox.delete_snapshot(s) for s in (snaps["named"], snaps["unnamed"])]
    seen["left"] = Sandbox.list_snapshots().next_items()
    return seen


def _create_refusal(template: str) -> str:
    from e2b import Sandbox, SandboxException

    try:
        Sandbox.create(template, timeout=60).kill()
    except SandboxException as e:
        return str(e)
    return "created"


async def _nothing_leased(client: AsyncClient) -> None:
    async def released() -> bool:
        return not any(s.lease_id for s in await client.list_sandboxes())

    await poll(released, timeout=60, what="every sandbox released")


async def test_templates_and_snapshots_survive_a_restart(
    image: str, engine: docker.DockerClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    instance = "it-e2b-state-" + secrets.token_hex(3)
    token = secrets.token_hex(4)
    args = ["--e2b-build-pool", POOL, "--e2b-api-key", KEY, "--e2b-acquire-timeout", "120"]
    state = tmp_path / "state" / f"{instance}-e2b.json"
    async with serve_process(engine, tmp_path, instance, args) as (client, url):
        await client.create_pool(POOL, image, min_ready=0, max_size=4, images=["*"])
        point_sdk(monkeypatch, url, KEY)
        snaps = await asyncio.to_thread(_before_restart, image, token)
        assert len(await client.list_snapshots()) == 2
        await _nothing_leased(client)

    saved = json.loads(await asyncio.to_thread(state.read_bytes))
    assert KEY.encode() not in await asyncio.to_thread(state.read_bytes), "no API key on disk"
    images = {t["name"]: t["builds"][0]["image"] for t in saved["templates"]}
    assert set(images) == {"tpl-kept", "tpl-dropped"} and len(saved["snapshots"]) == 2
    # The second template's image leaves the engine while the server is down.
    await asyncio.to_thread(engine.images.remove, images["tpl-dropped"], force=True)

    async with serve_process(engine, tmp_path, instance, args) as (client, url):
        point_sdk(monkeypatch, url, KEY)
        try:
            seen = await asyncio.to_thread(_after_restart, snaps)
            # The kept template's image leaves the engine while the server runs.
            await asyncio.to_thread(engine.images.remove, images["tpl-kept"], force=True)
            evicted = await asyncio.to_thread(_create_refusal, "tpl-kept")
        finally:
            for left in await client.list_snapshots():
                await client.delete_snapshot(left.id)
        assert seen["marker"] == f"kept {token}\n"
        assert f"{images['tpl-dropped']} is no longer on the engine" in seen["dropped"], seen["dropped"]
        assert "build the template again" in seen["dropped"]
        assert f"{images['tpl-kept']} is no longer on the engine" in evicted, evicted
        assert "build the template again" in evicted
        assert seen["listed"] == sorted(snaps.values())
        assert seen["note"] == f"before the restart {token}"
        assert seen["deleted"] == [True, True] and seen["left"] == []
        assert await client.list_snapshots() == [], "sandboxd's snapshots deleted with them"
        await _nothing_leased(client)
        await client.delete_pool(POOL, force=True)
    saved = json.loads(await asyncio.to_thread(state.read_bytes))
    assert saved["snapshots"] == []
