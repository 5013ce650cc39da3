"""The unchanged PyPI ``e2b`` SDK, pointed at sandboxd's E2B API
(sandboxd.e2b) by E2B_API_URL and E2B_SANDBOX_URL, against the real engine:
its sync client (in a thread, the server sharing the test's loop) and its
async client."""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator

import docker
import pytest

from sandboxd.backends.base import GVISOR, LABEL_SANDBOX
from sandboxd.client import AsyncClient
from sandboxd.e2b import E2bSettings, make_app
from sandboxd.e2b.templates import Template
from tests.integration.conftest import NO_GVISOR, gvisor_registered, poll
from tests.integration.e2b_server import point_sdk
from tests.served import served

e2b = pytest.importorskip("e2b")

pytestmark = [pytest.mark.docker, pytest.mark.timeout(180)]

KEY = "e2b_" + "5d" * 20


@pytest.fixture
async def e2b_url(client: AsyncClient, pool: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[str]:
    app = make_app(client, E2bSettings(templates={"base": Template(pool)}, api_keys=frozenset({KEY})))
    async with served(app, handler_cancellation=True) as url:
        point_sdk(monkeypatch, url, KEY)
        yield url


def _sync_session() -> dict[str, object]:
    """Create, commands, files, list, kill through the sync client."""
    from e2b import CommandExitException, Sandbox

    seen: dict[str, object] = {}
    sbx = Sandbox.create(timeout=120, metadata={"run": "r1"}, envs={"TASK": "t1"})
    try:
        r = sbx.commands.run('echo "$TASK $EXTRA"; echo err >&2', envs={"EXTRA": "x"}, cwd="/tmp")
        seen["run"] = (r.stdout, r.stderr, r.exit_code)
        seen["pwd"] = sbx.commands.run("pwd", cwd="/tmp").stdout
        with pytest.raises(CommandExitException) as exc:
            sbx.commands.run("echo out; exit 3")
        seen["exit"] = (exc.value.exit_code, exc.value.stdout)
        seen["root"] = sbx.commands.run("id -u", user="root").stdout
        info = sbx.files.write("/tmp/e2b/hello.txt", "héllo")
        seen["written"] = (info.name, info.path)
        seen["text"] = sbx.files.read("/tmp/e2b/hello.txt")
        sbx.files.write("/tmp/e2b/blob.bin", b"\x00\x01\xff")
        seen["bytes"] = bytes(sbx.files.read("/tmp/e2b/blob.bin", format="bytes"))
        seen["listed"] = [
            s.sandbox_id for s in Sandbox.list(query=e2b.SandboxQuery(metadata={"run": "r1"})).next_items()
        ]
        seen["unlisted"] = Sandbox.list(query=e2b.SandboxQuery(metadata={"run": "other"})).next_items()
        seen["info"] = sbx.get_info()
        seen["running"] = sbx.is_running()
    finally:
        sbx.kill()
    seen["id"] = sbx.sandbox_id
    seen["after_kill"] = sbx.is_running()
    return seen


async def test_sync_sdk_create_commands_files_list_kill(e2b_url: str) -> None:
    seen = await asyncio.to_thread(_sync_session)
    assert seen["run"] == ("t1 x\n", "err\n", 0)
    assert seen["pwd"] == "/tmp\n"
    assert seen["exit"] == (3, "out\n")
    assert seen["root"] == "0\n"
    assert seen["written"] == ("hello.txt", "/tmp/e2b/hello.txt")
    assert seen["text"] == "héllo"
    assert seen["bytes"] == b"\x00\x01\xff"
    assert seen["listed"] == [seen["id"]]
    assert seen["unlisted"] == []
    info = seen["info"]
    assert info.sandbox_id == seen["id"] and info.metadata == {"run": "r1"}  # type: ignore[attr-defined]
    assert info.state.value == "running"  # type: ignore[attr-defined]
    assert seen["running"] is True and seen["after_kill"] is False


async def test_async_sdk_commands_background_stdin_timeout_and_errors(e2b_url: str) -> None:
    from e2b import AsyncSandbox, CommandExitException, NotFoundException, SandboxException, TimeoutException

    sbx = await AsyncSandbox.create(timeout=120)
    try:
        r = await sbx.commands.run("echo hi")
        assert (r.stdout, r.exit_code) == ("hi\n", 0)

        out: list[str] = []
        got_two = asyncio.Event()

        def on_stdout(chunk: str) -> None:
            out.append(chunk)
            if "two" in "".join(out):
                got_two.set()

        handle = await sbx.commands.run(
            "echo one; sleep 0.2; echo two; sleep 600", background=True, on_stdout=on_stdout, timeout=0
        )
        await asyncio.wait_for(got_two.wait(), 60)
        listed = [p.pid for p in await sbx.commands.list()]
        assert handle.pid in listed
        assert await sbx.commands.kill(handle.pid) is True
        with pytest.raises(CommandExitException):
            await handle.wait()
        assert handle.pid not in [p.pid for p in await sbx.commands.list()]
        assert await sbx.commands.kill(handle.pid) is False

        cat = await sbx.commands.run("cat", background=True, stdin=True)
        await sbx.commands.send_stdin(cat.pid, "fed through stdin\n")
        await sbx.commands.close_stdin(cat.pid)
        assert (await cat.wait()).stdout == "fed through stdin\n"

        with pytest.raises(TimeoutException):
            await sbx.commands.run("sleep 30", timeout=1)

        await sbx.files.write("/tmp/d/a.txt", "a")
        await sbx.files.write_files(
            [{"path": "/tmp/d/sub/b.txt", "data": "bb"}, {"path": "/tmp/d/c.txt", "data": b"c"}]
        )
        names = sorted(e.name for e in await sbx.files.list("/tmp/d"))
        assert names == ["a.txt", "c.txt", "sub"]
        deep = sorted(e.path for e in await sbx.files.list("/tmp/d", depth=2))
        assert "/tmp/d/sub/b.txt" in deep
        assert await sbx.files.exists("/tmp/d/a.txt") and not await sbx.files.exists("/tmp/d/none")
        info = await sbx.files.get_info("/tmp/d/sub/b.txt")
        assert (info.name, info.size, info.type) == ("b.txt", 2, e2b.FileType.FILE)
        assert await sbx.files.make_dir("/tmp/d/new") is True
        assert await sbx.files.make_dir("/tmp/d/new") is False
        moved = await sbx.files.rename("/tmp/d/a.txt", "/tmp/d/new/a2.txt")
        assert moved.path == "/tmp/d/new/a2.txt"
        assert await sbx.files.read("/tmp/d/new/a2.txt") == "a"
        await sbx.files.remove("/tmp/d/new")
        assert not await sbx.files.exists("/tmp/d/new")
        with pytest.raises(NotFoundException):
            await sbx.files.read("/tmp/d/none")

        first = await sbx.get_info()
        await sbx.set_timeout(600)
        later = await sbx.get_info()
        assert later.end_at > first.end_at and (later.end_at - later.started_at).total_seconds() >= 600

        second = await AsyncSandbox.connect(sbx.sandbox_id)
        assert (await second.commands.run("cat /tmp/d/c.txt")).stdout == "c"
    finally:
        await sbx.kill()

    with pytest.raises(NotFoundException):
        await AsyncSandbox.get_info(sbx.sandbox_id)
    with pytest.raises(SandboxException, match="not found"):
        await AsyncSandbox.create(template="no-such-template")
    assert await e2b.AsyncTemplate.alias_exists("base") is True
    assert await e2b.AsyncTemplate.alias_exists("no-such-template") is False


async def test_expiry_ends_the_sandbox(e2b_url: str, client: AsyncClient) -> None:
    from e2b import AsyncSandbox, NotFoundException

    sbx = await AsyncSandbox.create(timeout=2)
    assert await sbx.is_running()
    behind = await _leased_sandbox_id(client)

    async def gone() -> bool:
        return not await sbx.is_running()

    await poll(gone, timeout=60, what="the sandbox to end at its timeout")
    with pytest.raises(NotFoundException):
        await sbx.get_info()

    async def destroyed() -> bool:
        return behind not in [s.id for s in await client.list_sandboxes("it")]

    # The server ends it as its lease expires.
    await poll(destroyed, timeout=60, what="sandboxd to destroy the expired sandbox")


async def _leased_sandbox_id(client: AsyncClient) -> str:
    (leased,) = [s for s in await client.list_sandboxes("it") if s.lease_id]
    return leased.id


async def test_pause_keeps_the_filesystem_and_resume_brings_it_back(
    e2b_url: str, client: AsyncClient
) -> None:
    from e2b import AsyncSandbox

    sbx = await AsyncSandbox.create(timeout=120)
    try:
        await sbx.files.write("/workspace/kept.txt", "state")
        before = await _leased_sandbox_id(client)
        assert await sbx.pause() is True
        assert await sbx.pause() is False, "already paused"
        assert (await sbx.get_info()).state.value == "paused"
        paused = await AsyncSandbox.list(query=e2b.SandboxQuery(state=[e2b.SandboxState.PAUSED])).next_items()
        assert [s.sandbox_id for s in paused] == [sbx.sandbox_id]
        # runc sandboxes cannot be frozen: the pause kept the workspace and let the sandbox go.
        assert [s for s in await client.list_sandboxes("it") if s.lease_id] == []

        resumed = await AsyncSandbox.connect(sbx.sandbox_id)
        assert (await resumed.get_info()).state.value == "running"
        assert await resumed.files.read("/workspace/kept.txt") == "state"
        assert await _leased_sandbox_id(client) != before
    finally:
        await sbx.kill()


async def test_a_sandbox_lost_under_a_command_is_a_sandbox_error(
    e2b_url: str, client: AsyncClient, engine: docker.DockerClient
) -> None:
    from e2b import AsyncSandbox, CommandExitException, SandboxException

    sbx = await AsyncSandbox.create(timeout=120)
    try:
        started = asyncio.Event()
        handle = await sbx.commands.run(
            "echo up; sleep 600", background=True, on_stdout=lambda _: started.set(), timeout=0
        )
        await asyncio.wait_for(started.wait(), 60)
        sandbox_id = await _leased_sandbox_id(client)
        (container,) = await asyncio.to_thread(
            engine.containers.list, all=True, filters={"label": f"{LABEL_SANDBOX}={sandbox_id}"}
        )
        await asyncio.to_thread(container.remove, force=True)
        with pytest.raises(SandboxException) as exc:
            await handle.wait()
        assert not isinstance(exc.value, CommandExitException)
    finally:
        await sbx.kill()


def _sync_watch() -> list[tuple[str, str]]:
    """A sync watcher's events (CreateWatcher / GetWatcherEvents) for a
    create, a write and a remove, polled until all three have come."""
    import time

    from e2b import Sandbox

    sbx = Sandbox.create(timeout=120)
    try:
        sbx.files.make_dir("/tmp/w")
        handle = sbx.files.watch_dir("/tmp/w")
        sbx.files.write("/tmp/w/f.txt", "1")
        seen: list[tuple[str, str]] = []
        deadline = time.monotonic() + 60
        wrote = removed = False
        while time.monotonic() < deadline:
            seen += [(e.name, e.type.value) for e in handle.get_new_events()]
            if ("f.txt", "create") in seen and not wrote:
                sbx.files.write("/tmp/w/f.txt", "22")
                wrote = True
            if ("f.txt", "write") in seen and not removed:
                sbx.files.remove("/tmp/w/f.txt")
                removed = True
            if ("f.txt", "remove") in seen:
                break
            time.sleep(0.1)  # the poll interval of this deadline-bounded loop
        handle.stop()
        return seen
    finally:
        sbx.kill()


async def test_watch_dir_sync_and_async(e2b_url: str) -> None:
    from e2b import AsyncSandbox, FilesystemEvent

    seen = await asyncio.to_thread(_sync_watch)
    assert [e for e in seen if e[0] == "f.txt"] == [
        ("f.txt", "create"),
        ("f.txt", "write"),
        ("f.txt", "remove"),
    ]

    sbx = await AsyncSandbox.create(timeout=120)
    try:
        await sbx.files.make_dir("/tmp/w/sub")
        events: list[FilesystemEvent] = []
        created = asyncio.Event()

        def on_event(e: FilesystemEvent) -> None:
            events.append(e)
            if e.name == "sub/deep.txt":
                created.set()

        handle = await sbx.files.watch_dir("/tmp/w", on_event, recursive=True, timeout=0)
        await sbx.files.write("/tmp/w/sub/deep.txt", "x")
        await asyncio.wait_for(created.wait(), 60)
        await handle.stop()  # type: ignore[no-untyped-call]
        first = next(e for e in events if e.name == "sub/deep.txt")
        assert first.type == e2b.FilesystemEventType.CREATE
        with pytest.raises(e2b.NotFoundException):
            await sbx.files.watch_dir("/tmp/none", on_event)
    finally:
        await sbx.kill()


async def test_fork_copies_the_workspace_into_independent_sandboxes(e2b_url: str) -> None:
    from e2b import AsyncSandbox

    sbx = await AsyncSandbox.create(timeout=120)
    forks: list[AsyncSandbox] = []
    try:
        await sbx.files.write("/workspace/seed.txt", "from the parent")
        results = await sbx.fork(count=2, timeout=60)
        forks = [f for f in results if isinstance(f, AsyncSandbox)]
        assert len(forks) == 2 and len({f.sandbox_id for f in forks} | {sbx.sandbox_id}) == 3
        for f in forks:
            assert await f.files.read("/workspace/seed.txt") == "from the parent"
        await forks[0].files.write("/workspace/seed.txt", "changed")
        assert await forks[1].files.read("/workspace/seed.txt") == "from the parent"
        await forks[0].kill()
        assert await forks[1].is_running() and await sbx.is_running()
    finally:
        for f in forks:
            await f.kill()
        await sbx.kill()


async def test_connect_to_a_running_command_and_to_unknown_things(e2b_url: str) -> None:
    from e2b import AsyncSandbox, NotFoundException, SandboxException

    sbx = await AsyncSandbox.create(timeout=120)
    try:
        cat = await sbx.commands.run("cat; echo done", background=True, stdin=True)
        await cat.disconnect()
        other = await AsyncSandbox.connect(sbx.sandbox_id)
        follower = await other.commands.connect(cat.pid)
        await other.commands.send_stdin(cat.pid, "late line\n")
        await other.commands.close_stdin(cat.pid)
        result = await follower.wait()
        assert "late line\ndone\n" in result.stdout and result.exit_code == 0
        with pytest.raises(SandboxException):
            await sbx.commands.connect(999999)
        # A file-like body goes up as one octet-stream request.
        await sbx.files.write("/tmp/io/streamed.bin", io.BytesIO(b"\x00streamed"))
        assert await sbx.files.read("/tmp/io/streamed.bin", format="bytes") == b"\x00streamed"
        stream = await sbx.files.read("/etc/hostname", format="stream")
        assert b"".join([chunk async for chunk in stream])
    finally:
        await sbx.kill()
    with pytest.raises(NotFoundException):
        await AsyncSandbox.connect(sbx.sandbox_id)


async def test_pause_under_gvisor_is_live(
    e2b_url: str, client: AsyncClient, engine: docker.DockerClient
) -> None:
    from e2b import AsyncSandbox

    if not gvisor_registered(engine):
        pytest.skip(NO_GVISOR)
    await client.create_pool("itg", await _image_of(client), min_ready=1, max_size=2, runtime=GVISOR)
    try:
        sbx = await AsyncSandbox.create(template="itg", timeout=120)
        try:
            await sbx.files.write("/tmp/outside-workspace.txt", "in memory")
            sleeper = await sbx.commands.run("sleep 600", background=True, timeout=0)
            (before,) = [s for s in await client.list_sandboxes("itg") if s.lease_id]
            assert await sbx.pause() is True
            (frozen,) = [s for s in await client.list_sandboxes("itg") if s.lease_id]
            assert frozen.id == before.id and frozen.paused, "the same sandbox, frozen in place"
            assert (await sbx.get_info()).state.value == "paused"

            resumed = await AsyncSandbox.connect(sbx.sandbox_id)
            assert await resumed.files.read("/tmp/outside-workspace.txt") == "in memory"
            assert sleeper.pid in [p.pid for p in await resumed.commands.list()]
        finally:
            await sbx.kill()
    finally:
        await client.delete_pool("itg", force=True)


async def _image_of(client: AsyncClient) -> str:
    return (await client.get_pool("it")).spec.image
