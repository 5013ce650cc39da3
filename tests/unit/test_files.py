"""Files in and out of leased sandboxes through the core."""

from __future__ import annotations

import io
import tarfile
from collections.abc import AsyncIterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sandboxd.core.files import FileData, check_upload
from sandboxd.errors import InvalidArgument, NotFound, ResourceExhausted
from tests.unit.conftest import Harness

pytestmark = pytest.mark.timeout(30)


def tar_of(*members: tuple[tarfile.TarInfo, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, content in members:
            info.size = len(content) if info.isfile() else 0
            tar.addfile(info, io.BytesIO(content) if info.isfile() else None)
    return buf.getvalue()


def file_member(name: str, content: bytes, mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.mode = mode
    return info, content


def special(name: str, kind: bytes, linkname: str = "") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    return info, b""


async def stream(data: bytes, size: int = 700) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


async def test_write_read_round_trip_with_modes(h: Harness) -> None:
    _, rec = await h.leased()
    files = [
        FileData("run.sh", b"#!/bin/sh\necho hi\n", 0o755),
        FileData("/workspace/data/in.bin", bytes(range(256)), 0o600),
        FileData("plain.txt", b"", 0),  # 0 means the default, 0644
    ]
    written = await h.control.write_files(rec.sandbox_id, files)
    assert written == sum(len(f.content) for f in files)
    got = await h.control.read_files(rec.sandbox_id, ["plain.txt", "data/in.bin", "/workspace/run.sh"], 0)
    # Answered in the order asked and with the caller's spelling of each path.
    assert [f.path for f in got] == ["plain.txt", "data/in.bin", "/workspace/run.sh"]
    assert [f.content for f in got] == [b"", bytes(range(256)), b"#!/bin/sh\necho hi\n"]
    assert [f.mode for f in got] == [0o644, 0o600, 0o755]


async def test_read_of_a_missing_path_names_it(h: Harness) -> None:
    _, rec = await h.leased()
    await h.control.write_files(rec.sandbox_id, [FileData("here.txt", b"1")])
    with pytest.raises(NotFound, match=r"dir/missing\.txt"):
        await h.control.read_files(rec.sandbox_id, ["here.txt", "dir/missing.txt"], 0)


async def test_read_of_a_directory_is_invalid(h: Harness) -> None:
    _, rec = await h.leased()
    await h.control.write_files(rec.sandbox_id, [FileData("d/f", b"1")])
    with pytest.raises(InvalidArgument, match="/workspace/d is a directory") as info:
        await h.control.read_files(rec.sandbox_id, ["d"], 0)
    assert info.value.field == "paths"


async def test_read_respects_max_bytes(h: Harness) -> None:
    _, rec = await h.leased()
    await h.control.write_files(rec.sandbox_id, [FileData("big", b"x" * 5000)])
    assert (await h.control.read_files(rec.sandbox_id, ["big"], 5000))[0].content == b"x" * 5000
    with pytest.raises(ResourceExhausted, match="max_bytes"):
        await h.control.read_files(rec.sandbox_id, ["big"], 4999)


@pytest.mark.parametrize(
    "member",
    [
        file_member("../evil", b"x"),
        file_member("ok/../../evil", b"x"),
        file_member("/etc/evil", b"x"),
        special("link", tarfile.SYMTYPE, "/etc/passwd"),
        special("d/link", tarfile.SYMTYPE, "../../outside"),
        special("hard", tarfile.LNKTYPE, "../outside"),
        special("dev", tarfile.CHRTYPE),
        special("blk", tarfile.BLKTYPE),
        special("fifo", tarfile.FIFOTYPE),
    ],
    ids=lambda m: f"{m[0].name}:{m[0].type.decode()}",
)
async def test_upload_refuses_dangerous_members(h: Harness, member: tuple[tarfile.TarInfo, bytes]) -> None:
    _, rec = await h.leased()
    data = tar_of(file_member("fine.txt", b"fine"), member)
    with pytest.raises(InvalidArgument) as info:
        await h.control.upload_directory(rec.sandbox_id, "dest", stream(data))
    assert info.value.field == "tar"
    # Checked before anything reaches the sandbox.
    assert not h.backend.sandboxes[rec.handle].files


async def test_upload_allows_links_that_stay_inside(h: Harness) -> None:
    _, rec = await h.leased()
    data = tar_of(file_member("a/x", b"1"), special("a/link", tarfile.SYMTYPE, "../a/x"))
    assert await h.control.upload_directory(rec.sandbox_id, ".", stream(data)) == len(data)


async def test_upload_refuses_garbage_and_empty_streams(h: Harness) -> None:
    _, rec = await h.leased()
    with pytest.raises(InvalidArgument) as info:
        await h.control.upload_directory(rec.sandbox_id, ".", stream(b"this is not a tar" * 100))
    assert info.value.field == "tar"
    with pytest.raises(InvalidArgument) as info:
        await h.control.upload_directory(rec.sandbox_id, ".", stream(b""))
    assert info.value.field == "data"


async def test_upload_download_round_trip(h: Harness) -> None:
    _, rec = await h.leased()
    tree = {"main.py": b"print('hi')\n", "pkg/__init__.py": b"", "pkg/mod.py": b"X = 1\n" * 1000}
    data = tar_of(*(file_member(name, content) for name, content in tree.items()))
    size = await h.control.upload_directory(rec.sandbox_id, "proj", stream(data))
    assert size == len(data)
    got = await h.control.read_files(rec.sandbox_id, ["proj/pkg/mod.py"], 0)
    assert got[0].content == tree["pkg/mod.py"]
    chunks = [c async for c in h.control.download_directory(rec.sandbox_id, "proj")]
    with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
        back = {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}  # type: ignore[union-attr]
    assert back == tree


async def test_download_of_a_missing_directory_is_not_found(h: Harness) -> None:
    _, rec = await h.leased()
    with pytest.raises(NotFound, match="nowhere"):
        [c async for c in h.control.download_directory(rec.sandbox_id, "nowhere")]


safe_names = st.lists(
    st.from_regex(r"[a-z]{1,8}(/[a-z]{1,8}){0,2}", fullmatch=True), min_size=1, max_size=5, unique=True
)


@settings(max_examples=50, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(names=safe_names, depth=st.integers(min_value=1, max_value=4))
def test_check_upload_accepts_inside_and_refuses_escapes(names: list[str], depth: int) -> None:
    # Files whose paths are prefixes of others' would be both file and
    # directory; tar does not care, and neither does the check.
    ok = tar_of(*(file_member(n, b"x") for n in names))
    assert check_upload(io.BytesIO(ok)) == len(names)
    escaping = "/".join([".."] * depth + ["x"])
    bad = tar_of(*(file_member(n, b"x") for n in names), file_member(f"{names[0]}/{escaping}", b"x"))
    escapes = depth > names[0].count("/") + 1
    if escapes:
        with pytest.raises(InvalidArgument):
            check_upload(io.BytesIO(bad))
    else:
        assert check_upload(io.BytesIO(bad)) == len(names) + 1


def test_a_link_refusal_names_the_link_and_where_it_leads() -> None:
    from sandboxd.backends.shell import link_refusal

    out = link_refusal("link:/workspace/r\ntarget:/\nresolved:/\n")
    assert out == (
        "/workspace/r is a symbolic link to '/': "
        "it leads out of /workspace, and file paths do not follow links"
    )
    # A chain that looks inside but ends outside: where it ends counts.
    assert "leads out of /workspace" in link_refusal("link:/workspace/c\ntarget:r\nresolved:/etc\n")
    assert "even within /tmp" in link_refusal("link:/tmp/a\ntarget:b\nresolved:/tmp/b\n")
    # Without the sandbox's resolution, the target is read as text ("..").
    assert "leads out of /workspace" in link_refusal("link:/workspace/s/up\ntarget:../..\n")
