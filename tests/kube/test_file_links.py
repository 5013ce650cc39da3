"""Symbolic links planted in a Pod against the file API, on the real
kubelet node (``kube_node``; tests/file_links.py has the battery, which the
Docker tier runs too): ReadFiles, WriteFiles, UploadDirectory and
DownloadDirectory go through the same tar scripts over the exec stream and
refuse to follow a link out of /workspace or /tmp, touching nothing outside.
A bystander Pod keeps answering throughout."""

from __future__ import annotations

from collections.abc import Awaitable
from pathlib import Path

import pytest

from sandboxd.client import AsyncClient, ExecResult, Sandbox
from tests import file_links as fl
from tests.kube.conftest import real_node_app
from tests.kube.test_exec import _real_image
from tests.probing import while_probing

pytestmark = [pytest.mark.kube, pytest.mark.kube_node, pytest.mark.timeout(300)]


async def probed(bystander: Sandbox, work: Awaitable[None]) -> None:
    """Runs ``work``; fails unless the bystander was answered meanwhile."""

    async def attack() -> ExecResult:
        await work
        return await bystander.exec("true")

    result, latencies = await while_probing(bystander, attack())
    assert result.ok and latencies


async def test_file_api_never_follows_a_planted_link_out(
    tmp_path: Path, kubeconfig: str, namespace: str
) -> None:
    limits = {"limits.memory_bytes": 256 << 20, "limits.cpu_millis": 500}
    async with (
        real_node_app(tmp_path, kubeconfig, namespace, **limits) as app,
        AsyncClient(app.address) as client,
    ):
        await client.create_pool("links", _real_image(), min_ready=2, max_size=3)
        async with client.acquire_group("links", n=2, timeout=120) as group:
            sb, bystander = group
            assert (await bystander.exec("true", session="probe")).ok
            await fl.plant(sb)
            await probed(bystander, fl.reads_are_refused(client, sb))
            await probed(bystander, fl.writes_are_refused(client, sb))
            await probed(bystander, fl.uploads_are_refused(client, sb))
            await probed(bystander, fl.downloads_hold_no_outside_file(client, sb))
            await probed(bystander, fl.inside_links_behave_as_documented(client, sb))
            await fl.assert_outside_untouched(sb)
        await client.delete_pool("links", force=True)
