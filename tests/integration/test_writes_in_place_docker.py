"""Small uploads into runc sandboxes are written from the host
(sandboxd.backends.hostwrite), with the result the in-sandbox extraction
gives, and everything that is not the plain case goes through the sandbox
as before: links on the way refused; a directory in a file's place refused
by both the same way (FAILED_PRECONDITION); a full workspace
RESOURCE_EXHAUSTED."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from sandboxd import errors
from sandboxd.backends.docker import backend as docker_backend
from sandboxd.backends.hostwrite import write_files
from sandboxd.client import AsyncClient
from tests.integration.conftest import make_settings, running_app

pytestmark = [pytest.mark.docker, pytest.mark.timeout(180)]


@pytest.fixture
def in_place(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bool | str]]:
    """What each host-side write answered (True: written from the host;
    False: left to the sandbox) or raised (the error's class name)."""
    answers: list[bool | str] = []

    def counted(*args: object) -> bool:
        try:
            answers.append(write_files(*args))  # type: ignore[arg-type]
        except Exception as e:
            answers.append(type(e).__name__)
            raise
        return answers[-1] is True

    monkeypatch.setattr(docker_backend, "write_files", counted)
    yield answers


async def test_plain_uploads_are_written_from_the_host_as_the_sandbox_would(
    client: AsyncClient, pool: str, in_place: list[bool | str]
) -> None:
    async with client.acquire(pool) as sb:
        await sb.write_files({"a.txt": b"one", "deep/er/b.bin": bytes(range(256))})
        await sb.write_file("run.sh", "#!/bin/sh\necho ran\n", mode=0o777)
        assert in_place == [True, True]
        r = await sb.exec("stat -c '%n %U:%G %a %F' a.txt deep deep/er deep/er/b.bin run.sh; ./run.sh")
        assert r.ok, r
        assert (
            r.text.splitlines()
            == [
                "a.txt sandbox:sandbox 644 regular file",
                "deep sandbox:sandbox 755 directory",
                "deep/er sandbox:sandbox 755 directory",
                "deep/er/b.bin sandbox:sandbox 644 regular file",
                "run.sh sandbox:sandbox 755 regular file",  # a non-root tar's umask, as before
                "ran",
            ]
            or r.text
        )
        assert await sb.read_files(["a.txt", "deep/er/b.bin"]) == {
            "a.txt": b"one",
            "deep/er/b.bin": bytes(range(256)),
        }
        # Replacing: a file, and a link in a file's place (replaced, never written through).
        assert (await sb.exec("echo secret > /tmp/target; ln -s /tmp/target link.txt")).ok
        await sb.write_files({"a.txt": b"two", "link.txt": b"new"})
        r = await sb.exec(
            "cat a.txt; echo; cat /tmp/target; test -L link.txt && echo still-a-link; cat link.txt"
        )
        assert r.text == "two\nsecret\nnew", r.text
        assert (await sb.exec("ls -A | grep -c sandboxd-put || true")).text.strip() == "0", (
            "no temporary left"
        )


async def test_what_is_not_plain_goes_through_the_sandbox_and_is_refused_the_same(
    client: AsyncClient, pool: str, in_place: list[bool | str]
) -> None:
    async with client.acquire(pool) as sb:
        assert (await sb.exec("mkdir -p real d/sub && ln -s /etc linked && ln -s real alias")).ok
        for files, match in (
            ({"linked/passwd": b"x"}, "link"),
            ({"alias/f": b"x"}, "link"),
        ):
            with pytest.raises(errors.InvalidArgument, match=match):
                await sb.write_files(files)
        assert in_place == [False, False], "checked first, nothing written from the host"
        # A directory where a file goes is refused by either path, the same way.
        for size in (1, 5 << 20):
            with pytest.raises(errors.FailedPrecondition, match="/workspace/d is a directory"):
                await sb.write_files({"d": b"x" * size})
        assert in_place == [False, False, "FailedPrecondition"], "the large one went through the sandbox"
        assert (await sb.exec("test ! -e real/f && test -d d/sub && ls /etc/passwd")).ok


async def test_a_full_workspace_is_resource_exhausted(
    tmp_path: Path, engine: docker.DockerClient, image: str, in_place: list[bool | str]
) -> None:
    async with running_app(make_settings(tmp_path), engine) as app, AsyncClient(app.address) as client:
        await client.create_pool(
            "small", image, min_ready=1, max_size=2, limits={"disk_bytes": 1 << 20, "max_files": 64}
        )
        async with client.acquire("small") as sb:
            with pytest.raises(errors.ResourceExhausted, match="full"):
                await sb.write_files({"big.bin": b"\0" * (2 << 20)})
            with pytest.raises(errors.ResourceExhausted, match="full"):
                await sb.write_files({f"f{i}": b"x" for i in range(100)})
            # Nothing half-written stays behind, and the sandbox still takes what fits.
            assert (await sb.exec("ls -A | grep -c sandboxd-put || true")).text.strip() == "0"
            await sb.write_files({"ok.txt": b"fits"})
            assert (await sb.read_files(["ok.txt"])) == {"ok.txt": b"fits"}
            assert in_place == ["ResourceExhausted", "ResourceExhausted", True], "all three from the host"
        await client.delete_pool("small", force=True)
