"""The image cache's builds around the engine: the Dockerfile frontend
setting joins the recipe unless the Dockerfile names its own, bases behind
credentials are pulled before the build (the engine's BuildKit would send
none), the FROM lines that name them, and a late joiner's bounded replay of
a long build's log."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from sandboxd.backends.base import RegistryAuth
from sandboxd.backends.fake import FakeBackend
from sandboxd.clock import SystemClock
from sandboxd.core.images import ImageCache
from sandboxd.core.images.builds import REPLAY_LINES, SYNTAX_ARG, _Build, bases_of, names_frontend
from tests.image_settings import image_settings

REG = "registry.test:5000"
MB = 1 << 20


def recipe(directory: Path, dockerfile: str) -> Path:
    directory.mkdir(parents=True)
    (directory / "Dockerfile").write_text(dockerfile)
    return directory


def test_the_bases_a_dockerfile_names() -> None:
    dockerfile = (
        "# syntax=sandboxd/dockerfile:x\n"
        "ARG BASE=debian:12\n"
        "ARG TAG\n"
        "FROM $BASE AS build\n"
        "RUN make\n"
        f"FROM --platform=linux/amd64 {REG}/tools:${{TAG}} AS tools\n"
        "FROM build\n"
        "COPY --from=tools / /\n"
        "FROM scratch\n"
        "FROM ${UNSET}\n"
        "from debian:12\n"
    )
    assert bases_of(dockerfile, {"TAG": "v2"}) == ["debian:12", f"{REG}/tools:v2"]
    assert bases_of(dockerfile, {"BASE": "alpine:3", "TAG": "v2"})[0] == "alpine:3"


def test_a_dockerfile_names_its_frontend_only_in_its_leading_directives() -> None:
    assert names_frontend("# syntax=docker/dockerfile:1.4\nFROM x\n")
    assert names_frontend("\n#  SYNTAX = x\n# escape=`\nFROM x\n")
    assert not names_frontend("# a comment\nFROM x\n# syntax=y\n")
    assert not names_frontend("FROM x\n")


async def test_the_frontend_setting_is_part_of_the_recipe(tmp_path: Path) -> None:
    backend = FakeBackend(images=set())
    plain = recipe(tmp_path / "plain", "FROM base\nRUN true\n")
    own = recipe(tmp_path / "own", "# syntax=their/frontend:1\nFROM base\nRUN true\n")
    tags: dict[str, tuple[str, str]] = {}
    for frontend in ("", "sandboxd/dockerfile:abc"):
        cache = ImageCache(backend, SystemClock(), image_settings(dockerfile_frontend=frontend))
        await cache.start()
        try:
            tags[frontend] = (await cache.build(plain), await cache.build(own))
        finally:
            await cache.stop()
    # The frontend reads the Dockerfile: another frontend, another image;
    # one that names its own keeps it, and its recipe.
    assert tags[""][0] != tags["sandboxd/dockerfile:abc"][0]
    assert tags[""][1] == tags["sandboxd/dockerfile:abc"][1]
    # Given explicitly, the build argument wins over the setting.
    cache = ImageCache(backend, SystemClock(), image_settings(dockerfile_frontend="sandboxd/dockerfile:abc"))
    await cache.start()
    try:
        assert await cache.build(plain, build_args={SYNTAX_ARG: ""}) != tags["sandboxd/dockerfile:abc"][0]
    finally:
        await cache.stop()


async def test_bases_behind_credentials_are_pulled_before_the_build(tmp_path: Path) -> None:
    backend = FakeBackend(images=set())
    private, public = f"{REG}/base:v1", "public.test/base:v1"
    backend.registry.add(private, MB)
    backend.registry.add(public, MB)
    backend.registry.credentials = RegistryAuth(REG, "alice", "s3cret")
    token = base64.b64encode(b"alice:s3cret").decode()
    (tmp_path / "config.json").write_text(json.dumps({"auths": {REG: {"auth": token}}}))
    context = recipe(tmp_path / "ctx", f"FROM {private} AS a\nFROM {public}\nCOPY --from=a / /\n")
    cache = ImageCache(backend, SystemClock(), image_settings(docker_config=str(tmp_path)))
    await cache.start()
    try:
        lines: list[str] = []
        await cache.build(context, on_log=lines.append)
    finally:
        await cache.stop()
    assert backend.registry.pulls[private] == 1
    # A registry without credentials is left to the build itself.
    assert backend.registry.pulls[public] == 0
    assert lines[0] == f"pulling base {private} with the Docker config's credentials"


def test_a_late_joiner_gets_the_first_line_and_a_bounded_tail() -> None:
    build = _Build("t:1", 0.0)
    build.emit("builder: BuildKit")
    for n in range(REPLAY_LINES + 500):
        build.emit(f"#2 line {n}")
    replay = build.replay()
    assert len(replay) == REPLAY_LINES + 2
    assert replay[0] == "builder: BuildKit"
    assert replay[1] == "(500 lines of this build's log skipped)"
    assert replay[2] == "#2 line 500" and replay[-1] == f"#2 line {REPLAY_LINES + 499}"
    assert build.latest() == replay[-1]
