"""The unchanged ``e2b`` SDK against sandboxd on the real engine: templates
mapped to a pool's per-task images and to recipes built through the image
cache, PTY sessions (``sandbox.pty``), and the E2B API served inside
``sandboxd serve --e2b-port``."""

from __future__ import annotations

import argparse
import asyncio
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import docker
import pytest

from sandboxd.app import App
from sandboxd.cli_e2b import cache_builder
from sandboxd.client import AsyncClient
from sandboxd.e2b import make_app
from sandboxd.e2b.cli import settings_from
from tests.integration.conftest import poll
from tests.integration.e2b_server import point_sdk, serve_process
from tests.served import served

e2b = pytest.importorskip("e2b")

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

KEY = "e2b_" + "7c" * 20


def _templates_file(tmp_path: Path, image: str) -> Path:
    context = tmp_path / "ctx"
    context.mkdir()
    (context / "Dockerfile").write_text(
        f'FROM {image}\nARG MARK\nUSER root\nRUN echo "built $MARK" > /etc/e2b-template\n'
    )
    path = tmp_path / "templates.toml"
    path.write_text(
        '[templates.plain]\npool = "itm"\n\n'
        '[templates.built]\npool = "itm"\ncontext = "ctx"\nbuild_args = { MARK = "m1" }\n\n'
        '[templates.own]\npool = "it"\n'
        # The pool "it" serves only its own image.
        f'\n[templates.refused]\npool = "it"\nimage = "{image}-not-served"\n'
    )
    return path


@pytest.fixture
async def templated(
    app: App, client: AsyncClient, image: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[str]:
    """An E2B API whose templates come from a templates file, one of them built."""
    await client.create_pool("it", image, min_ready=1, max_size=4)
    await client.create_pool("itm", image, min_ready=1, max_size=6, images=["*"])
    assert app.control.images is not None
    args = argparse.Namespace(
        e2b_templates=_templates_file(tmp_path, image),
        e2b_template=["flagged=itm"],
        e2b_api_key=[KEY],
        e2b_tenant=[],
        e2b_acquire_timeout=120.0,
    )
    settings = await settings_from(args, cache_builder(app.control.images))
    async with served(make_app(client, settings), handler_cancellation=True) as url:
        point_sdk(monkeypatch, url, KEY)
        yield settings.templates["built"].image


def _sync_templates() -> dict[str, object]:
    from e2b import CommandExitException, Sandbox, SandboxException

    seen: dict[str, object] = {}
    built = Sandbox.create(template="built", timeout=120)
    try:
        seen["built"] = built.commands.run("cat /etc/e2b-template").stdout
        seen["template_id"] = built.get_info().template_id
    finally:
        built.kill()
    plain = Sandbox.create(template="plain", timeout=120)
    try:
        with pytest.raises(CommandExitException):
            plain.commands.run("cat /etc/e2b-template")
    finally:
        plain.kill()
    with pytest.raises(SandboxException) as unknown:
        Sandbox.create(template="no-such-template")
    seen["unknown"] = str(unknown.value)
    with pytest.raises(SandboxException) as refused:
        Sandbox.create(template="refused")
    seen["refused"] = str(refused.value)
    return seen


async def test_templates_are_pool_images_and_builds_sync_and_async(
    templated: str, client: AsyncClient
) -> None:
    from e2b import AsyncSandbox, AsyncTemplate

    assert templated.startswith("sandboxd-build:")
    seen = await asyncio.to_thread(_sync_templates)
    assert seen["built"] == "built m1\n" and seen["template_id"] == "built"
    assert str(seen["unknown"]).startswith("404") and "template 'no-such-template' not found" in str(
        seen["unknown"]
    )
    assert "not-served" in str(seen["refused"]) and "spec.images" in str(seen["refused"])

    sbx = await AsyncSandbox.create(template="built", timeout=120)
    try:
        (leased,) = [s for s in await client.list_sandboxes("itm") if s.lease_id]
        assert leased.image == templated
        await sbx.files.write("/workspace/kept.txt", "state")
        # A filesystem pause and its resume keep the template's image.
        assert await sbx.pause(keep_memory=False) is True
        resumed = await AsyncSandbox.connect(sbx.sandbox_id)
        assert (await resumed.commands.run("cat /etc/e2b-template /workspace/kept.txt")).stdout == (
            "built m1\nstate"
        )
        (forked,) = await resumed.fork(count=1, timeout=60)
        assert isinstance(forked, AsyncSandbox)
        try:
            assert (await forked.commands.run("cat /etc/e2b-template")).stdout == "built m1\n"
        finally:
            await forked.kill()
    finally:
        await sbx.kill()
    assert await AsyncTemplate.alias_exists("built") is True
    assert await AsyncTemplate.alias_exists("flagged") is True
    assert await AsyncTemplate.alias_exists("no-such-template") is False


def _sync_pty() -> tuple[str, int, str]:
    from e2b import CommandExitException, PtySize, Sandbox

    sbx = Sandbox.create(template="own", timeout=120)
    try:
        term = sbx.pty.create(PtySize(rows=24, cols=80), timeout=60)
        sbx.pty.send_stdin(term.pid, b"stty size; tty; exit 7\n")
        out: list[bytes] = []
        with pytest.raises(CommandExitException) as exc:
            term.wait(on_pty=out.append)
        first = b"".join(out).decode(errors="replace")

        resized = sbx.pty.create(PtySize(rows=24, cols=80), timeout=60)
        sbx.pty.resize(resized.pid, PtySize(rows=33, cols=101))
        sbx.pty.send_stdin(resized.pid, b"stty size; exit\n")
        again: list[bytes] = []
        assert resized.wait(on_pty=again.append).exit_code == 0
        return first, exc.value.exit_code, b"".join(again).decode(errors="replace")
    finally:
        sbx.kill()


async def test_pty_sessions_sync_and_async(templated: str) -> None:
    from e2b import AsyncSandbox, PtySize

    first, code, resized = await asyncio.to_thread(_sync_pty)
    assert "24 80" in first and "/dev/pts/" in first and code == 7
    assert "33 101" in resized

    sbx = await AsyncSandbox.create(template="own", timeout=120)
    try:
        out = bytearray()
        seen = asyncio.Event()
        wanted = [b"40 120"]

        def on_data(data: bytes) -> None:
            out.extend(data)
            if wanted[0] in out:
                seen.set()

        term = await sbx.pty.create(PtySize(rows=40, cols=120), on_data, cwd="/tmp", timeout=0)
        await sbx.pty.send_stdin(term.pid, b"stty size\n")
        await asyncio.wait_for(seen.wait(), 60)
        # SIGWINCH reaches the program in the foreground of the terminal.
        seen.clear()
        wanted[0] = b"winched 50 132"
        # The terminal echoes the line typed: the marker is spelled so that only its output matches.
        await sbx.pty.send_stdin(term.pid, b"trap 'echo winched $(stty size)' WINCH; echo ar''med\n")
        await poll(lambda: b"armed\r\n" in out, 60, "the trap to be set")
        await sbx.pty.resize(term.pid, PtySize(rows=50, cols=132))
        await asyncio.wait_for(seen.wait(), 60)
        assert term.pid in [p.pid for p in await sbx.commands.list()]
        assert await sbx.pty.kill(term.pid) is True
        assert await sbx.pty.kill(term.pid) is False
        # envd's not_found for an unknown process, which the SDK raises as NotFoundException.
        with pytest.raises(e2b.NotFoundException):
            await sbx.pty.resize(999999, PtySize(rows=1, cols=1))
    finally:
        await sbx.kill()


def _serve_session(pool: str) -> tuple[str, str]:
    from e2b import Sandbox

    sbx = Sandbox.create(template="base", timeout=60)
    try:
        out = sbx.commands.run("echo served in serve").stdout
        return out, sbx.sandbox_id
    finally:
        sbx.kill()


async def test_serve_e2b_port_serves_the_sdk(
    image: str, engine: docker.DockerClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    instance = "it-e2b-" + secrets.token_hex(3)
    args = ["--e2b-template", "base=srv", "--e2b-api-key", KEY]
    async with serve_process(engine, tmp_path, instance, args) as (client, url):
        await client.create_pool("srv", image, min_ready=1, max_size=2)
        point_sdk(monkeypatch, url, KEY)
        out, _ = await asyncio.to_thread(_serve_session, "srv")
        assert out == "served in serve\n"
        await client.delete_pool("srv", force=True)
    assert "E2B API on http://127.0.0.1:" in (tmp_path / "serve.log").read_text()


async def test_code_interpreter_run_code_sync_and_async(templated: str) -> None:
    ci = pytest.importorskip("e2b_code_interpreter")

    def sync_cells() -> tuple[object, ...]:
        with ci.Sandbox.create(template="own", timeout=120) as sbx:
            first = sbx.run_code("x = 41\nprint('side', flush=True)\nx + 1")
            second = sbx.run_code("x * 2")
            failed = sbx.run_code("1 / 0")
            envs = sbx.run_code("import os; os.environ['ONLY_HERE']", envs={"ONLY_HERE": "yes"})
            return first, second, failed, envs

    first, second, failed, envs = await asyncio.to_thread(sync_cells)
    assert first.text == "42" and first.logs.stdout == ["side\n"]  # type: ignore[attr-defined]
    assert second.text == "82" and second.execution_count == 2  # type: ignore[attr-defined]
    assert failed.error.name == "ZeroDivisionError"  # type: ignore[attr-defined]
    assert "ZeroDivisionError" in failed.error.traceback  # type: ignore[attr-defined]
    assert envs.text == "'yes'"  # type: ignore[attr-defined]

    sbx = await ci.AsyncSandbox.create(template="own", timeout=120)
    try:
        lines: list[str] = []
        done = await sbx.run_code(
            "import subprocess, sys\n"
            "print('a'); print('b', file=sys.stderr)\n"
            "subprocess.run(['echo', 'child'])",
            on_stdout=lambda m: lines.append(m.line),
        )
        assert "a\n" in lines and "child\n" in lines and done.logs.stderr == ["b\n"]
        ctx = await sbx.create_code_context(cwd="/tmp")
        assert ctx.cwd == "/tmp"
        await sbx.run_code("y = 'in ctx'", context=ctx)
        assert (await sbx.run_code("y", context=ctx)).text == "'in ctx'"
        assert (await sbx.run_code("'y' in dir()")).text == "False", "contexts do not share names"
        assert ctx.id in [c.id for c in await sbx.list_code_contexts()]
        # A cell past its timeout is interrupted and the context goes on.
        with pytest.raises(e2b.TimeoutException):
            await sbx.run_code("import time\nwhile True: time.sleep(0.1)", context=ctx, timeout=2)
        assert (await sbx.run_code("y", context=ctx)).text == "'in ctx'"
        await sbx.restart_code_context(ctx)
        assert (await sbx.run_code("'y' in dir()", context=ctx)).error is None
        assert (await sbx.run_code("'y' in dir()", context=ctx)).text == "False"
        await sbx.remove_code_context(ctx)
        with pytest.raises(e2b.SandboxException):
            await sbx.run_code("1", language="javascript")
    finally:
        await sbx.kill()


async def test_files_the_user_may_not_make_are_made_as_envd_makes_them(
    templated: str, client: AsyncClient, image: str
) -> None:
    from e2b import AsyncSandbox, AuthenticationException, SandboxException

    # An unmapped template is the pool of its name.
    await client.create_pool("rw", image, min_ready=0, max_size=2, root="writable")
    sbx = await AsyncSandbox.create(template="rw", timeout=120)
    try:
        # As E2B's default user, in a root-owned / (envd writes as root): made by root.
        await sbx.files.write("/solution/solve.sh", "echo solved\n")
        assert await sbx.files.make_dir("/logs/verifier") is True
        owners = await sbx.commands.run("stat -c %U /solution /solution/solve.sh /logs/verifier")
        assert owners.stdout.split() == ["root", "root", "root"]
        # Where the user may write, it stays the user's own.
        await sbx.files.write("/workspace/mine.txt", "x")
        assert (await sbx.commands.run("stat -c %u /workspace/mine.txt")).stdout.strip() != "0"
        assert await sbx.files.read("/solution/solve.sh") == "echo solved\n"
    finally:
        await sbx.kill()

    ro = await AsyncSandbox.create(template="own", timeout=120)
    try:
        # A read-only root refuses root too: envd's 500 (SandboxException), not a key error.
        with pytest.raises(SandboxException) as refused:
            await ro.files.write("/solution/solve.sh", "x")
        assert not isinstance(refused.value, AuthenticationException)
        assert str(refused.value).startswith("500") and "Read-only file system" in str(refused.value)
    finally:
        await ro.kill()
    await client.delete_pool("rw", force=True)
