"""Every validation failure is an InvalidArgument naming the offending field."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from sandboxd.backends.base import Limits
from sandboxd.core.control import ExecRequest
from sandboxd.core.files import FileData
from sandboxd.core.pools import PoolConfig
from sandboxd.errors import InvalidArgument
from tests.unit.conftest import IMAGE, Harness, MakeControl

pytestmark = pytest.mark.timeout(30)


def config(**kw: Any) -> PoolConfig:
    base: dict[str, Any] = dict(name="p", image=IMAGE, min_ready=0, max_size=4, limits=Limits())
    base.update(kw)
    return PoolConfig(**base)


@pytest.mark.parametrize(
    "name", ["", "Upper", "under_score", "-lead", "trail-", "a" * 64, "has space", "dot.ted", "ünï"]
)
async def test_bad_pool_names(h: Harness, name: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        await h.control.create_pool(config(name=name))
    assert info.value.field == "spec.name"
    assert not h.control.pools


@pytest.mark.parametrize("name", ["a", "p-1", "0abc", "a" * 63])
async def test_good_pool_names(h: Harness, name: str) -> None:
    await h.control.create_pool(config(name=name))
    assert name in h.control.pools


async def test_bad_image(h: Harness) -> None:
    with pytest.raises(InvalidArgument) as info:
        await h.control.create_pool(config(image="bad image!"))
    assert info.value.field == "spec.image"


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        (dict(min_ready=-1), "spec.min_ready"),
        (dict(max_size=0), "spec.max_size"),
        (dict(min_ready=5, max_size=4), "spec.min_ready"),
        (dict(max_size=10_001), "spec.max_size"),
        (dict(limits=Limits(memory_bytes=1)), "spec.limits.memory_bytes"),
        (dict(limits=Limits(output_bytes=1 << 40)), "spec.limits.output_bytes"),
    ],
)
async def test_bad_sizes_and_limits(h: Harness, kw: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        await h.control.create_pool(config(**kw))
    assert info.value.field == field


@pytest.mark.parametrize("key", ["", "has space", "-lead", "x" * 200, "bad!char"])
async def test_bad_pool_label_keys(h: Harness, key: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        await h.control.create_pool(config(labels={key: "v"}))
    assert info.value.field.startswith("spec.labels[")
    assert key[:40] in info.value.field


async def test_bad_pool_label_value(h: Harness) -> None:
    with pytest.raises(InvalidArgument) as info:
        await h.control.create_pool(config(labels={"k": "v" * 257}))
    assert info.value.field == "spec.labels[k]"


async def test_bad_acquire_label(h: Harness) -> None:
    await h.pool()
    with pytest.raises(InvalidArgument) as info:
        await h.acquire(labels={"no spaces": "x"})
    assert info.value.field.startswith("labels[")
    assert not h.control.leases.all()


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"1LEADING_DIGIT": "x"}, "1LEADING_DIGIT"),
        ({"HAS-DASH": "x"}, "HAS-DASH"),
        ({"": "x"}, "spec.env["),
        ({"SANDBOXD_EXEC": "x"}, "SANDBOXD_EXEC"),
        ({"SANDBOXD_ANYTHING": "x"}, "SANDBOXD_ANYTHING"),
        ({"OK": "nul\x00"}, "OK"),
    ],
)
async def test_bad_pool_env(h: Harness, env: dict[str, str], needle: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        await h.control.create_pool(config(env=env))
    assert info.value.field.startswith("spec.env[")
    assert needle in info.value.field


async def test_reserved_env_prefix_says_so(h: Harness) -> None:
    with pytest.raises(InvalidArgument, match="reserved"):
        await h.control.create_pool(config(env={"SANDBOXD_X": "1"}))


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        (dict(n=-1), "n"),
        (dict(n=2, min_n=3), "min_n"),
        (dict(min_n=-1), "min_n"),
        (dict(ttl=-1.0), "lease_ttl_seconds"),
        (dict(ttl=float("nan")), "lease_ttl_seconds"),
        (dict(ttl=1e9), "lease_ttl_seconds"),
        (dict(timeout=-0.5), "timeout_seconds"),
        (dict(timeout=float("nan")), "timeout_seconds"),
        (dict(timeout=float("inf")), "timeout_seconds"),
    ],
)
async def test_bad_acquire_arguments(h: Harness, kw: dict[str, Any], field: str) -> None:
    pool = await h.pool()
    with pytest.raises(InvalidArgument) as info:
        await h.acquire(**kw)
    assert info.value.field == field
    assert pool.waiting == 0


async def test_release_of_malformed_sandbox_ids(h: Harness) -> None:
    await h.pool()
    lease, records = await h.acquire()
    for bad in ("sb-\x00", "", "../sb-000000000000", "x" * 5000):
        with pytest.raises(InvalidArgument) as info:
            await h.control.release(lease.lease_id, [records[0].sandbox_id, bad])
        assert info.value.field == "sandbox_ids[1]"
    assert h.control.leases.find(lease.lease_id) is not None  # nothing was released
    assert await h.control.release(lease.lease_id, [records[0].sandbox_id]) == [records[0].sandbox_id]


async def test_bad_heartbeat_ttl(h: Harness) -> None:
    await h.pool()
    lease, _ = await h.acquire()
    with pytest.raises(InvalidArgument) as info:
        await h.control.heartbeat(lease.lease_id, -1.0)
    assert info.value.field == "ttl_seconds"


async def test_bad_update_pool_sizes(h: Harness) -> None:
    await h.pool(min_ready=1, max_size=4)
    with pytest.raises(InvalidArgument) as info:
        await h.control.update_pool("p", min_ready=None, max_size=0)
    assert info.value.field == "spec.max_size"
    with pytest.raises(InvalidArgument) as info:
        await h.control.update_pool("p", min_ready=5, max_size=None)
    assert info.value.field == "spec.min_ready"
    assert h.control.get_pool("p").config.max_size == 4


# -- exec ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        (dict(argv=[]), "argv"),
        (dict(argv=["", "x"]), "argv[0]"),
        (dict(argv=["echo", "nul\x00"]), "argv[1]"),
        (dict(shell="   "), "shell"),
        (dict(), "command"),
        (dict(shell="true", timeout=-1.0), "timeout_seconds"),
        (dict(shell="true", timeout=1e9), "timeout_seconds"),
        (dict(shell="true", output_limit=-1), "output_limit_bytes"),
        (dict(shell="true", session="bad session"), "session"),
        (dict(shell="true", env={"BAD-NAME": "x"}), "env['BAD-NAME']"),
        (dict(shell="true", env={"SANDBOXD_EXEC": "x"}), "env[SANDBOXD_EXEC]"),
        (dict(shell="true", cwd="nul\x00"), "cwd"),
        (dict(shell="true", cwd="../../etc"), "cwd"),
        (dict(shell="true", cwd="x/../.."), "cwd"),
        (dict(shell="true", cwd=".."), "cwd"),
        (dict(shell="true", cwd="w" * 5000), "cwd"),
        (dict(shell="true", session="s", cwd="../.."), "cwd"),
        (dict(shell="true", timeout=float("inf")), "timeout_seconds"),
    ],
)
async def test_bad_exec_requests(h: Harness, kw: dict[str, Any], field: str) -> None:
    _, rec = await h.leased()
    with pytest.raises(InvalidArgument) as info:
        h.control.prepare_exec(ExecRequest(sandbox_id=rec.sandbox_id, **kw))
    assert info.value.field == field


@pytest.mark.parametrize(
    ("cwd", "where"),
    [
        ("", "/workspace"),
        ("d", "/workspace/d"),
        ("./d/", "/workspace/d"),
        ("d/../e", "/workspace/e"),
        ("/workspace", "/workspace"),
        ("/workspace/x/y", "/workspace/x/y"),
        ("/tmp", "/tmp"),
        ("/tmp/job", "/tmp/job"),
        ("/tmp/../workspace/z", "/workspace/z"),
        # Absolute paths confine nothing (a command can cd there itself): kept, normalised.
        ("/workspace/../etc", "/etc"),
        ("/etc", "/etc"),
        ("/", "/"),
        ("//workspace", "/workspace"),
    ],
)
async def test_exec_cwds_inside_the_roots_run_there(h: Harness, cwd: str, where: str) -> None:
    _, rec = await h.leased()
    _, spec = h.control.prepare_exec(ExecRequest(sandbox_id=rec.sandbox_id, shell="pwd", cwd=cwd))
    assert spec.cwd == where
    result, out, _ = await h.exec(rec.sandbox_id, "pwd", cwd=cwd)
    assert result.exit_code == 0 and out == f"{where}\n".encode()


async def test_list_sandboxes_refuses_bad_label_filters(h: Harness) -> None:
    await h.pool()
    for labels, field in [({"a\x00": "b"}, "labels['a\\x00']"), ({"a": "b\x00"}, "labels[a]")]:
        with pytest.raises(InvalidArgument) as info:
            h.control.list_sandboxes("", None, labels)
        assert info.value.field == field
    assert h.control.list_sandboxes("", None, {"a": "b"}) == []


async def test_oversize_stdin(make_control: MakeControl) -> None:
    h = await make_control(exec__max_stdin_bytes=16)
    _, rec = await h.leased()
    h.control.prepare_exec(ExecRequest(sandbox_id=rec.sandbox_id, shell="cat", stdin=b"x" * 16))
    with pytest.raises(InvalidArgument) as info:
        h.control.prepare_exec(ExecRequest(sandbox_id=rec.sandbox_id, shell="cat", stdin=b"x" * 17))
    assert info.value.field == "stdin"


async def test_exec_on_a_malformed_sandbox_id(h: Harness) -> None:
    with pytest.raises(InvalidArgument) as info:
        h.control.prepare_exec(ExecRequest(sandbox_id="nope", shell="true"))
    assert info.value.field == "sandbox_id"


# -- files --------------------------------------------------------------------

ESCAPES = ["../etc/passwd", "/etc/passwd", "a/../../x", "/workspace/../etc", "..", "/"]


@pytest.mark.parametrize("path", ESCAPES)
async def test_write_paths_escaping_the_workspace(h: Harness, path: str) -> None:
    _, rec = await h.leased()
    with pytest.raises(InvalidArgument, match="escapes the workspace") as info:
        await h.control.write_files(rec.sandbox_id, [FileData("ok.txt", b"1"), FileData(path, b"x")])
    assert info.value.field == "files[1].path"
    assert not h.backend.sandboxes[rec.handle].files  # nothing written at all


@pytest.mark.parametrize("path", ESCAPES)
async def test_read_paths_escaping_the_workspace(h: Harness, path: str) -> None:
    _, rec = await h.leased()
    with pytest.raises(InvalidArgument) as info:
        await h.control.read_files(rec.sandbox_id, [path], 0)
    assert info.value.field == "paths[0]"


@pytest.mark.parametrize("path", ESCAPES)
async def test_download_paths_escaping_the_workspace(h: Harness, path: str) -> None:
    _, rec = await h.leased()
    with pytest.raises(InvalidArgument) as info:
        h.control.download_directory(rec.sandbox_id, path)
    assert info.value.field == "path"


@pytest.mark.parametrize("path", ESCAPES)
async def test_upload_paths_escaping_the_workspace(h: Harness, path: str) -> None:
    _, rec = await h.leased()

    async def chunks() -> AsyncIterator[bytes]:
        yield b"unused"

    with pytest.raises(InvalidArgument) as info:
        await h.control.upload_directory(rec.sandbox_id, path, chunks())
    assert info.value.field == "header.path"


async def test_duplicate_write_paths(h: Harness) -> None:
    _, rec = await h.leased()
    with pytest.raises(InvalidArgument, match="twice") as info:
        await h.control.write_files(
            rec.sandbox_id, [FileData("a/b.txt", b"1"), FileData("/workspace/a/./b.txt", b"2")]
        )
    assert info.value.field == "files[1].path"


@pytest.mark.parametrize("mode", [0o1000, 0o4755, 0o7777, 0o10000])
async def test_modes_above_0o777(h: Harness, mode: int) -> None:
    _, rec = await h.leased()
    with pytest.raises(InvalidArgument) as info:
        await h.control.write_files(rec.sandbox_id, [FileData("x", b"", mode)])
    assert info.value.field == "files[0].mode"


async def test_empty_file_lists(h: Harness) -> None:
    _, rec = await h.leased()
    with pytest.raises(InvalidArgument) as info:
        await h.control.write_files(rec.sandbox_id, [])
    assert info.value.field == "files"
    with pytest.raises(InvalidArgument) as info:
        await h.control.read_files(rec.sandbox_id, [], 0)
    assert info.value.field == "paths"


async def test_workspace_itself_is_not_a_file(h: Harness) -> None:
    _, rec = await h.leased()
    with pytest.raises(InvalidArgument) as info:
        await h.control.write_files(rec.sandbox_id, [FileData("/workspace", b"")])
    assert info.value.field == "files[0].path"
