"""Who runs a command or a file transfer (the sandbox's user or root), and
/tmp as the file API's second root, on the fake backend."""

from __future__ import annotations

from typing import Any

import pytest

from sandboxd.backends.base import ROOT_USER
from sandboxd.backends.fake import FakeBackend
from sandboxd.core.control import ExecRequest
from sandboxd.core.files import FileData
from sandboxd.errors import FailedPrecondition, InvalidArgument
from tests.unit.conftest import Harness, MakeControl

pytestmark = pytest.mark.timeout(30)


async def test_user_root_and_the_sandbox_user(h: Harness) -> None:
    _, rec = await h.leased()
    _, out, _ = await h.exec(rec.sandbox_id, "id -u; whoami")
    uid, _ = h.backend.sandbox_user(rec.handle)
    assert out == f"{uid}\nsandbox\n".encode() and uid != 1000
    for who in ("root", "0"):
        _, out, _ = await h.exec(rec.sandbox_id, "id -u; whoami", user=who)
        assert out == b"0\nroot\n"
    _, spec = h.control.prepare_exec(ExecRequest(sandbox_id=rec.sandbox_id, shell="true", user="0"))
    assert spec.user == ROOT_USER


@pytest.mark.parametrize("user", ["agent", "1000", "root ", "sandbox", "x" * 300])
async def test_unknown_users_are_refused(h: Harness, user: str) -> None:
    _, rec = await h.leased()
    with pytest.raises(InvalidArgument) as info:
        h.control.prepare_exec(ExecRequest(sandbox_id=rec.sandbox_id, shell="true", user=user))
    assert info.value.field == "user"
    with pytest.raises(InvalidArgument) as info:
        await h.control.write_files(rec.sandbox_id, [FileData("a", b"1")], user=user)
    assert info.value.field == "user"


async def test_root_never_runs_in_a_session(h: Harness) -> None:
    _, rec = await h.leased()
    with pytest.raises(InvalidArgument, match="one-shot") as info:
        h.control.prepare_exec(ExecRequest(sandbox_id=rec.sandbox_id, shell="true", user="root", session="s"))
    assert info.value.field == "user"


class _NoRoot:
    """The fake backend without the optional RootUser methods."""

    def __init__(self, inner: FakeBackend) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        if name in ("put_tar_as", "get_tar_as"):
            raise AttributeError(name)
        return getattr(self._inner, name)


async def test_root_on_a_backend_without_it_is_a_failed_precondition(make_control: MakeControl) -> None:
    h = await make_control(backend=_NoRoot(FakeBackend()))  # type: ignore[arg-type]
    _, rec = await h.leased()
    with pytest.raises(FailedPrecondition, match="not available on this backend"):
        h.control.prepare_exec(ExecRequest(sandbox_id=rec.sandbox_id, shell="true", user="root"))
    with pytest.raises(FailedPrecondition):
        await h.control.read_files(rec.sandbox_id, ["/tmp/x"], 0, user="root")
    # The sandbox's own user still works there.
    await h.control.write_files(rec.sandbox_id, [FileData("/tmp/x", b"1")])


async def test_tmp_is_a_second_file_root(h: Harness) -> None:
    _, rec = await h.leased()
    files = [
        FileData("/tmp/.run.sh", b"echo hi\n", 0o755),
        FileData("w.txt", b"w"),
        FileData("/tmp/d/x", b"x"),
    ]
    assert await h.control.write_files(rec.sandbox_id, files, user="root") == 10
    box = h.backend.sandboxes[rec.handle]
    assert box.files["/tmp/.run.sh"] == (b"echo hi\n", 0o755)
    assert box.files["/workspace/w.txt"] == (b"w", 0o644)
    got = await h.control.read_files(rec.sandbox_id, ["/tmp/d/x", "w.txt", "/tmp/.run.sh"], 0)
    assert [(f.path, f.content) for f in got] == [
        ("/tmp/d/x", b"x"),
        ("w.txt", b"w"),
        ("/tmp/.run.sh", b"echo hi\n"),
    ]


@pytest.mark.parametrize(
    "path", ["/tmp", "/tmp/", "/tmp/../etc/passwd", "/tmpx/a", "/var/tmp/a", "/workspace/../tmp"]
)
async def test_tmp_paths_that_are_refused(h: Harness, path: str) -> None:
    _, rec = await h.leased()
    with pytest.raises(InvalidArgument) as info:
        await h.control.write_files(rec.sandbox_id, [FileData(path, b"x")])
    assert info.value.field == "files[0].path"
    assert not h.backend.sandboxes[rec.handle].files
