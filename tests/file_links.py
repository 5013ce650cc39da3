"""Symbolic links planted inside a sandbox against the file API, shared by
the Docker and Kubernetes tiers: a link out of /workspace (to /, to /tmp,
through a chain, with ``..`` in its target) or out of /tmp is never followed
by ReadFiles, WriteFiles, UploadDirectory or DownloadDirectory. Each refusal
is INVALID_ARGUMENT naming the link; a marker outside stays as it was, and
a download holds the links as links and nothing from outside."""

from __future__ import annotations

import io
import tarfile

import pytest

from sandboxd import errors
from sandboxd.client import AsyncClient, Sandbox

MARKER = "/tmp/outside/marker"
"""Outside /workspace: reached from it only through the planted links."""

PLANT = f"""
set -e
mkdir -p /tmp/outside && printf orig > {MARKER}
cd /workspace
ln -s / r
ln -s /tmp t
ln -s r chain1 && ln -s chain1 chain
mkdir -p sub real && ln -s ../.. sub/up && ln -s sub/../.. dots
printf inside > real/f && ln -s real inroot && ln -s real/f fl
ln -s / /tmp/tr
"""
# Each a way to the container's / (or /tmp) from a file root, and the link
# the refusal names.
ESCAPES = {
    "r": "/workspace/r",
    "chain": "/workspace/chain",
    "sub/up": "/workspace/sub/up",
    "dots": "/workspace/dots",
    "/tmp/tr": "/tmp/tr",
}
# Links that stay inside /workspace: not followed either (documented).
INSIDE = {"inroot": "/workspace/inroot"}


async def plant(sb: Sandbox) -> None:
    """The links and the marker, created by the sandbox's own user."""
    r = await sb.exec(PLANT)
    assert r.ok, r


async def assert_outside_untouched(sb: Sandbox) -> None:
    """The marker is as planted, nothing new is beside it, no staging
    directory of an upload is left in either root."""
    r = await sb.exec(
        f"cat {MARKER}; echo; ls -A /tmp/outside; ls -A /workspace /tmp | grep -c sandboxd-put || true"
    )
    assert r.ok, r
    assert r.text.splitlines() == ["orig", "marker", "0"], r.text


def tar_of(members: dict[str, bytes | None]) -> bytes:
    """A tar of files (bytes) and directories (None), in the order given."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, content in members.items():
            info = tarfile.TarInfo(name)
            if content is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            else:
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
    return buf.getvalue()


async def reads_are_refused(client: AsyncClient, sb: Sandbox, user: str = "") -> None:
    """ReadFiles through each link out, and through /workspace's link to /tmp."""
    for way, link in ESCAPES.items():
        for target in ("etc/hostname", "tmp/outside/marker"):
            with pytest.raises(errors.InvalidArgument, match=f"{link} is a symbolic link") as info:
                await client.read_files(sb.id, [f"{way}/{target}"], user=user)
            assert "leads out of" in info.value.message, info.value.message
    with pytest.raises(errors.InvalidArgument, match="/workspace/t is a symbolic link to '/tmp'"):
        await client.read_files(sb.id, ["t/outside/marker"], user=user)
    # A good path beside a bad one: the call is refused whole.
    with pytest.raises(errors.InvalidArgument, match="/workspace/r is a symbolic link"):
        await client.read_files(sb.id, ["real/f", "r/etc/hostname"], user=user)


async def writes_are_refused(client: AsyncClient, sb: Sandbox, user: str = "") -> None:
    """WriteFiles through each link out; nothing outside changes."""
    for way, link in {**ESCAPES, "t": "/workspace/t"}.items():
        target = "outside/new" if way == "t" else "tmp/outside/new"
        with pytest.raises(errors.InvalidArgument, match=f"{link} is a symbolic link"):
            await client.write_files(sb.id, {f"{way}/{target}": b"x"}, user=user)
        with pytest.raises(errors.InvalidArgument, match=f"{link} is a symbolic link"):
            await client.write_files(sb.id, {f"{way}/{target.replace('new', 'marker')}": b"x"}, user=user)
    await assert_outside_untouched(sb)


async def uploads_are_refused(client: AsyncClient, sb: Sandbox) -> None:
    """UploadDirectory into a linked directory, and over one, with and
    without directory members; nothing outside changes."""
    one = tar_of({"new": b"x"})
    for way, link in ESCAPES.items():
        with pytest.raises(errors.InvalidArgument, match=f"{link} is a symbolic link"):
            await client.upload_dir(sb.id, one, dest=f"{way}/tmp/outside")
    over: list[dict[str, bytes | None]] = [
        {"t/outside/marker": b"x", "t/outside/new": b"x"},
        {"t/": None, "t/outside/": None, "t/outside/marker": b"x"},
        {"r/tmp/outside/new": b"x"},
        {"chain/": None, "chain/tmp/": None, "chain/tmp/outside/new": b"x"},
    ]
    for members in over:
        with pytest.raises(errors.InvalidArgument, match="is a symbolic link"):
            await client.upload_dir(sb.id, tar_of(members), dest=".")
    # A refusal leaves the workspace as it was: the good member beside the
    # bad one is not extracted either.
    with pytest.raises(errors.InvalidArgument, match="/workspace/t is a symbolic link"):
        await client.upload_dir(sb.id, tar_of({"fresh": b"x", "t/outside/new": b"x"}), dest=".")
    r = await sb.exec("test -e /workspace/fresh || echo absent")
    assert r.stdout == b"absent\n", r
    await assert_outside_untouched(sb)


async def downloads_hold_no_outside_file(client: AsyncClient, sb: Sandbox) -> None:
    """DownloadDirectory of a link out is refused; of a root, it stores the
    links as links and holds nothing from beyond them."""
    for way, link in {**ESCAPES, **INSIDE, "t": "/workspace/t"}.items():
        with pytest.raises(errors.InvalidArgument, match=f"{link} is a symbolic link"):
            await client.download_dir(sb.id, way)
    with pytest.raises(errors.InvalidArgument, match="/workspace/r is a symbolic link"):
        await client.download_dir(sb.id, "r/etc")
    for root, links in (
        ("/workspace", ("r", "t", "chain", "sub/up", "dots", "inroot", "fl")),
        ("/tmp", ("tr",)),
    ):
        data = await client.download_dir(sb.id, root)
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            members = {m.name.removeprefix("./"): m for m in tar.getmembers()}
        for name in links:
            assert members[name].issym(), (root, name)
        # Nothing below a link: no /etc, no second copy of /tmp.
        below = [n for n in members for link in links if n.startswith(link + "/")]
        assert below == [], below
        assert not any(n.startswith(("etc/", "proc/")) or n.endswith("hostname") for n in members)


async def inside_links_behave_as_documented(client: AsyncClient, sb: Sandbox) -> None:
    """Within the workspace: a link is not followed as a path component, a
    link read is not a regular file, a write over a link replaces the link
    (its target keeps its content), an upload's own in-root links land as
    links, and a download keeps them."""
    with pytest.raises(errors.InvalidArgument, match="/workspace/inroot is a symbolic link to 'real'"):
        await client.read_files(sb.id, ["inroot/f"])
    with pytest.raises(errors.InvalidArgument, match="within /workspace"):
        await client.write_files(sb.id, {"inroot/g": b"g"})
    with pytest.raises(errors.InvalidArgument, match="is a symbolic link, not a regular file"):
        await client.read_files(sb.id, ["fl"])
    assert (await client.read_files(sb.id, ["real/f"])) == {"real/f": b"inside"}
    await client.write_files(sb.id, {"fl": b"replaced"})
    got = await client.read_files(sb.id, ["fl", "real/f"])
    assert got == {"fl": b"replaced", "real/f": b"inside"}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("up/l")
        info.type, info.linkname = tarfile.SYMTYPE, "../real/f"
        tar.addfile(info)
    await client.upload_dir(sb.id, buf.getvalue(), dest=".")
    r = await sb.exec("readlink up/l; cat up/l")
    assert r.text.splitlines() == ["../real/f", "inside"], r
    # Uploads merge into existing directories without disturbing them.
    await client.upload_dir(sb.id, tar_of({"real/": None, "real/g": b"g"}), dest=".")
    assert (await client.read_files(sb.id, ["real/f", "real/g"])) == {"real/f": b"inside", "real/g": b"g"}
