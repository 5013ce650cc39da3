"""Symbolic links planted in a sandbox against the file API, on the real
engine (tests/file_links.py has the battery): ReadFiles, WriteFiles (as the
sandbox's user and as root), UploadDirectory and DownloadDirectory refuse to
follow a link out of /workspace or /tmp, by name, and touch nothing outside;
links inside the workspace behave as documented; a snapshot of the planted
workspace keeps the links as links. Each test runs with workspaces read in
place from the host and through the sandbox. A bystander sandbox keeps
answering throughout, and nothing leaks (containers, staging directories)."""

from __future__ import annotations

import io
import tarfile
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path

import docker
import pytest

from sandboxd import errors
from sandboxd.app import App
from sandboxd.client import AsyncClient, ExecResult, Sandbox
from tests import file_links as fl
from tests.integration.conftest import make_settings, running_app
from tests.probing import while_probing

pytestmark = [pytest.mark.docker, pytest.mark.timeout(240)]


@pytest.fixture(params=["in-place", "through-sandbox"])
async def app(
    request: pytest.FixtureRequest, tmp_path: Path, engine: docker.DockerClient
) -> AsyncIterator[App]:
    settings = make_settings(tmp_path, **{"backend.host_workspaces": request.param == "in-place"})
    async with running_app(settings, engine) as app:
        yield app


@pytest.fixture
async def pair(client: AsyncClient, image: str) -> AsyncIterator[tuple[Sandbox, Sandbox]]:
    """A victim with the links planted, and a bystander."""
    await client.create_pool("links", image, min_ready=2, max_size=4)
    async with client.acquire_group("links", n=2, timeout=60) as group:
        assert (await group[1].exec("true", session="probe")).ok
        await fl.plant(group[0])
        yield group[0], group[1]
    await client.delete_pool("links", force=True)


async def probed(bystander: Sandbox, work: Awaitable[None]) -> None:
    """Runs ``work``; fails unless the bystander was answered meanwhile."""

    async def attack() -> ExecResult:
        await work
        return await bystander.exec("true")

    result, latencies = await while_probing(bystander, attack())
    assert result.ok and latencies


async def test_reads_through_a_link_out_are_refused(
    client: AsyncClient, pair: tuple[Sandbox, Sandbox]
) -> None:
    sb, bystander = pair
    await probed(bystander, fl.reads_are_refused(client, sb))
    await fl.reads_are_refused(client, sb, user="root")


async def test_writes_through_a_link_out_are_refused(
    client: AsyncClient, pair: tuple[Sandbox, Sandbox]
) -> None:
    sb, bystander = pair
    await probed(bystander, fl.writes_are_refused(client, sb))
    await fl.writes_are_refused(client, sb, user="root")


async def test_uploads_into_or_over_a_link_out_are_refused(
    client: AsyncClient, pair: tuple[Sandbox, Sandbox]
) -> None:
    sb, bystander = pair
    await probed(bystander, fl.uploads_are_refused(client, sb))


async def test_downloads_keep_links_as_links_and_nothing_from_outside(
    client: AsyncClient, pair: tuple[Sandbox, Sandbox]
) -> None:
    sb, bystander = pair
    await probed(bystander, fl.downloads_hold_no_outside_file(client, sb))


async def test_links_inside_the_workspace_behave_as_documented(
    client: AsyncClient, pair: tuple[Sandbox, Sandbox]
) -> None:
    sb, bystander = pair
    await probed(bystander, fl.inside_links_behave_as_documented(client, sb))
    await fl.assert_outside_untouched(sb)


async def test_a_snapshot_refuses_links_out_and_keeps_links_inside(
    client: AsyncClient, pair: tuple[Sandbox, Sandbox]
) -> None:
    """Read in place or through the sandbox, a snapshot never follows a link:
    one leading out is refused (the snapshot's own rule), ones inside are
    restored as links."""
    sb, _ = pair
    with pytest.raises(errors.FailedPrecondition, match="leaves the workspace"):
        await sb.snapshot()
    assert (await sb.exec("rm r t chain chain1 dots sub/up")).ok
    snap = await sb.snapshot()
    lease = await client.restore(snap.id, timeout=60)
    try:
        restored = lease.sandboxes[0]
        r = await restored.exec("readlink inroot fl; cat fl; echo; ls -A /workspace | wc -l")
        assert r.text.splitlines() == ["real", "real/f", "inside", "4"], r.text
        data = await client.download_dir(restored.id, ".")
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            links = sorted(m.name.removeprefix("./") for m in tar.getmembers() if m.issym())
        assert links == ["fl", "inroot"], links
    finally:
        await client.release(lease.id)
