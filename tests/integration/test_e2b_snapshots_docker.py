"""E2B's sandbox snapshots through the unchanged ``e2b`` SDK against
sandboxd's E2B API on the real engine: create_snapshot, creates from a
snapshot (four at once), list_snapshots with its filters and pages,
delete_snapshot, the filesystem mode, API keys kept apart, a live snapshot
under gVisor whose background process goes on in its restores, and the
front end's close deleting the snapshots it took."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import docker
import pytest

from sandboxd.backends.base import GVISOR
from sandboxd.client import AsyncClient
from sandboxd.e2b import E2bSettings, make_app
from sandboxd.e2b.templates import Template
from tests.integration.conftest import NO_GVISOR, gvisor_registered, poll
from tests.integration.e2b_server import point_sdk
from tests.served import served

pytest.importorskip("e2b")

pytestmark = [pytest.mark.docker, pytest.mark.timeout(240)]

KEY = "e2b_" + "5e" * 20
OTHER_KEY = "e2b_" + "6f" * 20


def _app(client: AsyncClient, pool: str) -> Any:
    templates = {"base": Template(pool)}
    return make_app(client, E2bSettings(templates=templates, api_keys=frozenset({KEY, OTHER_KEY})))


async def _nothing_left(client: AsyncClient) -> None:
    """No snapshot and no leased sandbox of the server's left behind."""
    assert await client.list_snapshots() == []

    async def released() -> bool:
        return not any(s.lease_id for s in await client.list_sandboxes())

    await poll(released, timeout=60, what="every sandbox released")


@pytest.fixture
async def e2b_url(client: AsyncClient, pool: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[str]:
    async with served(_app(client, pool), handler_cancellation=True) as url:
        point_sdk(monkeypatch, url, KEY)
        yield url
    await _nothing_left(client)


async def _post_snapshot(url: str, sandbox_id: str, given: dict[str, Any]) -> tuple[int, str, Any]:
    """(status, X-Sandboxd-Snapshot, JSON answer) of a raw create_snapshot."""
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{url}/sandboxes/{sandbox_id}/snapshots", json=given, headers={"X-API-Key": KEY}) as r,
    ):
        return r.status, r.headers.get("X-Sandboxd-Snapshot", ""), await r.json()


async def _leased(client: AsyncClient, pool: str) -> list[str]:
    return [s.id for s in await client.list_sandboxes(pool) if s.lease_id]


async def test_a_snapshot_outlives_its_sandbox_and_restores_into_four_at_once(
    e2b_url: str, client: AsyncClient
) -> None:
    from e2b import AsyncSandbox, SandboxException

    sbx = await AsyncSandbox.create(timeout=120)
    source = sbx.sandbox_id
    await sbx.files.write("/workspace/seed.txt", "from the source")
    snap = await sbx.create_snapshot()
    assert snap.snapshot_id.endswith(":default") and snap.names == []
    assert await sbx.is_running(), "the source keeps running"
    await sbx.files.write("/workspace/seed.txt", "after the snapshot")
    await sbx.kill()

    boxes = await asyncio.gather(
        *(
            AsyncSandbox.create(snap.snapshot_id, timeout=60, envs={"N": str(i)}, metadata={"i": str(i)})
            for i in range(4)
        )
    )
    try:
        assert len({b.sandbox_id for b in boxes} | {source}) == 5
        assert len(await _leased(client, "it")) == 4, "four sandboxes of the source's pool"
        for i, b in enumerate(boxes):
            assert await b.files.read("/workspace/seed.txt") == "from the source"
            assert (await b.commands.run("echo $N")).stdout == f"{i}\n"
            assert (await b.get_info()).metadata == {"i": str(i)}
        await boxes[0].files.write("/workspace/seed.txt", "changed")
        assert await boxes[1].files.read("/workspace/seed.txt") == "from the source"
    finally:
        await asyncio.gather(*(b.kill() for b in boxes))

    listed = await AsyncSandbox.list_snapshots(sandbox_id=source).next_items()
    assert [s.snapshot_id for s in listed] == [snap.snapshot_id]
    assert len(await client.list_snapshots()) == 1
    assert await AsyncSandbox.delete_snapshot(snap.snapshot_id) is True
    assert await AsyncSandbox.delete_snapshot(snap.snapshot_id) is False
    assert await client.list_snapshots() == [], "sandboxd's snapshot deleted with it"
    with pytest.raises(SandboxException) as gone:
        await AsyncSandbox.create(snap.snapshot_id, timeout=30)
    assert gone.value.status_code == 404 and "not found" in str(gone.value)
    assert await AsyncSandbox.list_snapshots(sandbox_id=source).next_items() == []


async def test_names_filters_pages_modes_and_keys(e2b_url: str, client: AsyncClient) -> None:
    from e2b import AsyncSandbox, SandboxException, SandboxNotFoundException

    sbx = await AsyncSandbox.create(timeout=120)
    other = await AsyncSandbox.create(timeout=120)
    try:
        await sbx.files.write("/workspace/kept.txt", "one")
        first = await sbx.create_snapshot(name="ckpt")
        assert (first.snapshot_id, first.names) == ("ckpt:default", ["ckpt:default"])
        await sbx.files.write("/workspace/kept.txt", "two")
        second = await sbx.create_snapshot(name="ckpt:v2", mode="filesystem")
        assert (second.snapshot_id, second.names) == ("ckpt:v2", ["ckpt:v2"])
        # runc sandboxes cannot be checkpointed: the default is a filesystem snapshot, and says so.
        status, kind, third = await _post_snapshot(e2b_url, sbx.sandbox_id, {})
        assert (status, kind) == (201, "filesystem") and third["names"] == []
        status, kind, _ = await _post_snapshot(e2b_url, sbx.sandbox_id, {"memory": False, "name": "fs"})
        assert (status, kind) == (201, "filesystem")
        elsewhere = await other.create_snapshot(name="elsewhere")

        def ids(infos: list[Any]) -> list[str]:
            return [s.snapshot_id for s in infos]

        mine = [first.snapshot_id, second.snapshot_id, third["snapshotID"], "fs:default"]
        assert ids(await AsyncSandbox.list_snapshots(sandbox_id=sbx.sandbox_id).next_items()) == mine
        assert ids(await sbx.list_snapshots().next_items()) == mine  # type: ignore[misc]
        assert ids(await AsyncSandbox.list_snapshots(name="ckpt").next_items()) == mine[:2]
        assert ids(await AsyncSandbox.list_snapshots(name="ckpt:v2").next_items()) == mine[1:2]
        assert ids(await AsyncSandbox.list_snapshots(name=third["snapshotID"]).next_items()) == mine[2:3]
        assert await AsyncSandbox.list_snapshots(name="none").next_items() == []

        pages = AsyncSandbox.list_snapshots(limit=2)
        seen: list[str] = []
        while pages.has_next:
            seen.extend(ids(await pages.next_items()))
        assert seen == [*mine, elsewhere.snapshot_id]

        # A bare name is its default tag; name:tag that tag.
        for ref, text in [("ckpt", "one"), ("ckpt:v2", "two")]:
            restored = await AsyncSandbox.create(ref, timeout=60)
            try:
                assert await restored.files.read("/workspace/kept.txt") == text
            finally:
                await restored.kill()

        # Its pool has no network: no internet access changes nothing, and an
        # allowed host outside the pool's (no) rules is refused naming it.
        offline = await AsyncSandbox.create("ckpt", timeout=60, allow_internet_access=False)
        try:
            assert await offline.files.read("/workspace/kept.txt") == "one"
        finally:
            await offline.kill()
        with pytest.raises(SandboxException) as narrowed:
            await AsyncSandbox.create(
                "ckpt", timeout=30, network={"allow_out": ["pypi.org"], "deny_out": ["0.0.0.0/0"]}
            )
        assert narrowed.value.status_code == 400 and "pypi.org" in str(narrowed.value)

        # Another key sees, restores and deletes none of them.
        assert await AsyncSandbox.list_snapshots(api_key=OTHER_KEY).next_items() == []
        assert await AsyncSandbox.delete_snapshot(first.snapshot_id, api_key=OTHER_KEY) is False
        with pytest.raises(SandboxException) as theirs:
            await AsyncSandbox.create(first.snapshot_id, timeout=30, api_key=OTHER_KEY)
        assert theirs.value.status_code == 404
        assert ids(await AsyncSandbox.list_snapshots(name="ckpt").next_items()) == mine[:2]

        with pytest.raises(SandboxNotFoundException):
            await AsyncSandbox.create_snapshot("inope")
        with pytest.raises(SandboxException) as taken:
            await sbx.create_snapshot(name="base")
        assert taken.value.status_code == 409
        status, _, refusal = await _post_snapshot(e2b_url, sbx.sandbox_id, {"memory": "yes"})
        assert status == 400 and "memory must be a boolean" in refusal["message"]
        assert await sbx.pause() is True
        with pytest.raises(SandboxException) as paused:
            await sbx.create_snapshot()
        assert paused.value.status_code == 409

        # A bare name deletes every tag of it.
        assert await AsyncSandbox.delete_snapshot("ckpt") is True
        assert ids(await AsyncSandbox.list_snapshots().next_items()) == [*mine[2:], elsewhere.snapshot_id]
    finally:
        await sbx.kill()
        await other.kill()
    assert len(await client.list_snapshots()) == 3, "kills keep the snapshots"


async def test_the_front_end_close_deletes_its_snapshots(
    client: AsyncClient, pool: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from e2b import AsyncSandbox

    async with served(_app(client, pool), handler_cancellation=True) as url:
        point_sdk(monkeypatch, url, KEY)
        sbx = await AsyncSandbox.create(timeout=120)
        await sbx.create_snapshot(name="left")
        await sbx.create_snapshot()
        restored = await AsyncSandbox.create("left", timeout=60)
        assert await restored.is_running()
        assert len(await client.list_snapshots()) == 2
    await _nothing_left(client)


# Holds a random token in its shell's memory only and ticks: each line it
# writes is the token and a count.
TICKER = (
    'setsid sh -c \'t=$(od -An -N8 -tx8 /dev/urandom | tr -d " "); i=0; '
    'while :; do i=$((i+1)); echo "$t $i" > /tmp/tick.tmp; mv /tmp/tick.tmp /tmp/tick; sleep 0.1; done\''
    " >/dev/null 2>&1 &"
)


async def test_a_live_snapshot_under_gvisor_carries_a_background_process(
    e2b_url: str, client: AsyncClient, engine: docker.DockerClient
) -> None:
    from e2b import AsyncSandbox

    if not gvisor_registered(engine):
        pytest.skip(NO_GVISOR)
    image = (await client.get_pool("it")).spec.image
    await client.create_pool("itg", image, min_ready=1, max_size=4, runtime=GVISOR)
    try:
        sbx = await AsyncSandbox.create(template="itg", timeout=120)
        boxes: list[AsyncSandbox] = []
        try:
            await sbx.commands.run(TICKER)

            async def tick(box: AsyncSandbox) -> tuple[str, int]:
                out = (await box.commands.run("cat /tmp/tick 2>/dev/null || true")).stdout.split()
                return (out[0], int(out[1])) if len(out) == 2 else ("", 0)

            async def ticking() -> bool:
                return (await tick(sbx))[1] > 0

            await poll(ticking, timeout=60, what="the ticker to start")
            status, kind, snap = await _post_snapshot(e2b_url, sbx.sandbox_id, {"name": "warm"})
            assert (status, kind) == (201, "live"), snap
            token, at = await tick(sbx)
            assert await sbx.is_running()
            await sbx.kill()

            boxes = list(await asyncio.gather(*(AsyncSandbox.create("warm", timeout=60) for _ in range(2))))
            for box in boxes:

                async def went_on(box: AsyncSandbox = box) -> bool:
                    now_token, count = await tick(box)
                    return now_token == token and count > at + 3

                await poll(went_on, timeout=60, what=f"the ticker to go on in {box.sandbox_id}")

            status, kind, _ = await _post_snapshot(e2b_url, boxes[0].sandbox_id, {"memory": False})
            assert (status, kind) == (201, "filesystem")
        finally:
            await asyncio.gather(*(b.kill() for b in [sbx, *boxes]))
        assert await AsyncSandbox.delete_snapshot("warm") is True
    finally:
        await client.delete_pool("itg", force=True)
