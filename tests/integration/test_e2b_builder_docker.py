"""The unchanged ``e2b`` SDK's template builder (``Template``/``AsyncTemplate``)
against sandboxd's E2B API on the real engine: builds from an image and from
a Dockerfile with uploaded files, in the foreground and in the background,
tags, start and ready commands, and build failures as the SDK's
BuildException naming the failing step."""

from __future__ import annotations

import asyncio
import inspect
import types
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sandboxd.app import App
from sandboxd.cli_e2b import cache_image_builder
from sandboxd.client import AsyncClient
from sandboxd.e2b import E2bSettings, make_app
from tests.integration.conftest import poll
from tests.integration.e2b_server import point_sdk
from tests.served import served

e2b = pytest.importorskip("e2b")

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

KEY = "e2b_" + "3b" * 20
BUILD_POOL = "anyimage"


@pytest.fixture
async def builder_url(
    app: App, client: AsyncClient, image: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[str]:
    await client.create_pool(BUILD_POOL, image, min_ready=0, max_size=4, images=["*"])
    assert app.control.images is not None
    settings = E2bSettings(
        api_keys=frozenset({KEY}),
        acquire_timeout=120.0,
        build_image=cache_image_builder(app.control.images),
        build_pool=BUILD_POOL,
    )
    async with served(make_app(client, settings), handler_cancellation=True) as url:
        point_sdk(monkeypatch, url, KEY)
        yield url


def _context(tmp_path: Path) -> Path:
    ctx = tmp_path / "ctx"
    (ctx / "data").mkdir(parents=True)
    (ctx / "data" / "a.txt").write_text("alpha\n")
    (ctx / "run.sh").write_text("#!/bin/sh\necho ran\n")
    return ctx


def _sync_build(image: str, ctx: Path) -> dict[str, object]:
    from e2b import Sandbox, Template

    logs: list[str] = []
    template = (
        Template(file_context_path=str(ctx))
        .from_image(image)
        .copy("data/", "/opt/data/")
        .copy("run.sh", "/opt/run.sh", mode=0o755)
        .set_envs({"GREETING": "hi $HOME"})
        .run_cmd(["echo built > /etc/e2b-marker", "install -d -o 1000 /srv/u"], user="root")
        .set_workdir("/opt")
        .set_user("user")
        .run_cmd("id -u > /srv/u/uid")
        .set_start_cmd("echo started > /tmp/started; exec sleep 600", "test -f /tmp/started")
    )
    info = Template.build(template, "tpl-sync:v1", on_build_logs=lambda e: logs.append(e.message))
    seen: dict[str, object] = {"info": (info.name, info.tags), "logged": any("ready" in m for m in logs)}
    sbx = Sandbox.create("tpl-sync:v1", timeout=120)
    try:
        r = sbx.commands.run(
            'cat /etc/e2b-marker /opt/data/a.txt /srv/u/uid /tmp/started; echo "$GREETING"; /opt/run.sh'
        )
        seen["out"] = r.stdout
        seen["listed"] = [p.cmd for p in sbx.commands.list()]
    finally:
        sbx.kill()
    seen["exists"] = (Template.exists("tpl-sync"), Template.alias_exists("no-such-build"))
    seen["tags"] = sorted(t.tag for t in Template.get_tags("tpl-sync"))
    Template.assign_tags("tpl-sync:v1", "stable")
    seen["tagged"] = sorted(t.tag for t in Template.get_tags("tpl-sync"))
    by_tag = Sandbox.create("tpl-sync:stable", timeout=60)
    try:
        seen["by_tag"] = by_tag.commands.run("cat /etc/e2b-marker").stdout
    finally:
        by_tag.kill()
    Template.remove_tags("tpl-sync", "stable")
    seen["untagged"] = sorted(t.tag for t in Template.get_tags("tpl-sync"))
    return seen


async def test_sync_builder_from_image_with_files_envs_users_tags_and_start_cmd(
    builder_url: str, image: str, tmp_path: Path
) -> None:
    seen = await asyncio.to_thread(_sync_build, image, _context(tmp_path))
    assert seen["info"] == ("tpl-sync:v1", ["v1"])
    assert seen["logged"] is True
    # set_user("user") runs later steps as uid 1000, the sandbox user's uid in images.
    assert seen["out"] == "built\nalpha\n1000\nstarted\nhi $HOME\nran\n"
    assert "/bin/sh" in seen["listed"]  # type: ignore[operator]
    assert seen["exists"] == (True, False)
    assert seen["tags"] == ["v1"]
    assert seen["tagged"] == ["stable", "v1"]
    assert seen["by_tag"] == "built\n"
    assert seen["untagged"] == ["v1"]


async def test_async_builder_dockerfile_in_background_and_failures(
    builder_url: str, image: str, tmp_path: Path
) -> None:
    from e2b import AsyncSandbox, AsyncTemplate, BuildException, SandboxException, Template
    from e2b.template.types import TemplateBuildStatus

    ctx = _context(tmp_path)
    (ctx / "Dockerfile").write_text(
        f"FROM {image}\nUSER root\nCOPY data/a.txt /srv/a.txt\nENV MODE=docker\n"
        "RUN cat /srv/a.txt > /srv/b.txt\n"
    )
    template = Template(file_context_path=str(ctx)).from_dockerfile(str(ctx / "Dockerfile"))
    info = await AsyncTemplate.build_in_background(template, "tpl-async")
    # Polled as Harbor polls it: logs from an offset until the build ends.
    status = await AsyncTemplate.get_build_status(info)
    offset = len(status.log_entries)

    async def ended() -> bool:
        nonlocal status, offset
        if status.status not in (TemplateBuildStatus.BUILDING, TemplateBuildStatus.WAITING):
            return True
        status = await AsyncTemplate.get_build_status(info, logs_offset=offset)
        offset += len(status.log_entries)
        return False

    await poll(ended, 120, "the background build to end")
    assert status.status == TemplateBuildStatus.READY, status.reason
    sbx = await AsyncSandbox.create("tpl-async", timeout=60)
    try:
        r = await sbx.commands.run('cat /srv/b.txt; echo "$MODE"')
        assert r.stdout == "alpha\ndocker\n"
    finally:
        await sbx.kill()

    failing = Template().from_image(image)
    failing = failing.run_cmd("echo fine")
    failing_line = inspect.currentframe().f_lineno + 1  # type: ignore[union-attr]
    failing = failing.run_cmd("echo broken >&2; exit 3")
    with pytest.raises(BuildException) as failed:
        await AsyncTemplate.build(failing, "tpl-fails")
    assert "exit code: 3" in str(failed.value)
    # The failure names the second run_cmd: the SDK points its traceback at that call.
    assert _lines(failed.value)[-1] == failing_line
    with pytest.raises(SandboxException) as not_ready:
        await AsyncSandbox.create("tpl-fails", timeout=60)
    assert "does not exist for template 'tpl-fails'" in str(not_ready.value)

    # No network in RUN steps: the engine builds without one.
    connect = "import socket; socket.create_connection(('192.0.2.1', 80), 3)"
    offline = Template().from_image(image).run_cmd(f'python3 -c "{connect}"')
    logged: list[str] = []
    with pytest.raises(BuildException):
        await AsyncTemplate.build(offline, "tpl-offline", on_build_logs=lambda e: logged.append(e.message))
    assert any("Network is unreachable" in line for line in logged), logged[-5:]

    with pytest.raises(BuildException) as unknown_base:
        await AsyncTemplate.build(Template().from_template("no-such-template"), "tpl-base")
    assert "from_template" in str(unknown_base.value)
    assert await AsyncTemplate.alias_exists("tpl-async") is True


def _lines(error: BaseException) -> list[int]:
    """The line numbers in this file of the error's traceback, innermost last."""
    out: list[int] = []
    tb: types.TracebackType | None = error.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == __file__:
            out.append(tb.tb_lineno)
        tb = tb.tb_next
    return out
