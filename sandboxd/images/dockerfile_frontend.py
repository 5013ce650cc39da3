"""An image of BuildKit's Dockerfile frontend, built on this host without a
container registry.

The Dockerfile syntax BuildKit understands is its frontend's: the engine's
built-in one (Docker 20.10: syntax 1.2) has ``RUN --mount`` and ``COPY
--chmod`` but not heredocs (``RUN <<EOF``) nor ``COPY --link``, which need
syntax 1.4. A Dockerfile names a newer frontend with ``# syntax=IMAGE``, an
image BuildKit runs; the usual one (docker/dockerfile) lives on Docker Hub,
which rollout hosts cannot reach. This recipe compiles that same frontend
from its Go module (moby/buildkit, through the Go module proxy, with the Go
toolchain) and imports it as ``sandboxd/dockerfile:<hash>``: BuildKit finds
it on the engine, so ``images.dockerfile_frontend`` (or a Dockerfile's own
``# syntax=`` line naming it) builds offline.

Usage: ``python -m sandboxd.images.dockerfile_frontend [--force] [--print-tag]``
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

from sandboxd.images.build import recipe_main
from sandboxd.images.steps import (
    ImageBuildError,
    docker_cli,
    host_path_env,
    image_exists,
    import_tarball,
    recipe_hash,
    run_logged,
)

__all__ = ["FRONTEND_REPO", "MODULE", "VERSION", "ensure_frontend_image", "frontend_tag", "main"]

FRONTEND_REPO = "sandboxd/dockerfile"
MODULE = "github.com/moby/buildkit"
VERSION = "v0.10.6"
"""The BuildKit release whose frontend is Dockerfile syntax 1.4.3."""
_PACKAGE = "./frontend/dockerfile/cmd/dockerfile-frontend"
_BINARY = "bin/dockerfile-frontend"
# BuildKit runs the frontend in a container; it needs no network.
_CHANGES = (
    f'ENTRYPOINT ["/{_BINARY}"]',
    "LABEL moby.buildkit.frontend.network.none=true",
)


def _recipe() -> dict[str, object]:
    return {"module": MODULE, "version": VERSION, "package": _PACKAGE, "changes": list(_CHANGES)}


def frontend_tag() -> str:
    """The tag the frontend image of this recipe gets."""
    return f"{FRONTEND_REPO}:{recipe_hash(_recipe())}"


def _go() -> str:
    go = shutil.which("go")
    if go is None:
        raise ImageBuildError(
            "the Dockerfile frontend is compiled from its Go module: install the Go toolchain"
        )
    return go


def _compile(go: str, work: Path, log_path: Path, log: Callable[[str], None]) -> Path:
    """The frontend binary, built under ``work`` from the module's source."""
    env = {**host_path_env(), "CGO_ENABLED": "0", "GOFLAGS": "-mod=mod"}
    log(f"fetching {MODULE}@{VERSION} through the Go module proxy")
    proc = subprocess.run(
        [go, "mod", "download", "-json", f"{MODULE}@{VERSION}"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if proc.returncode != 0:
        raise ImageBuildError(f"go mod download {MODULE}@{VERSION} failed: {proc.stdout}{proc.stderr}")
    source = work / "src"
    # The module cache is read-only, and its vendor directory is incomplete
    # (module zips leave some out): a writable copy, built from the module graph.
    shutil.copytree(json.loads(proc.stdout)["Dir"], source)
    shutil.rmtree(source / "vendor", ignore_errors=True)
    for root, dirs, files in os.walk(source):
        for name in [*dirs, *files]:
            path = Path(root) / name
            if not path.is_symlink():
                path.chmod(path.stat().st_mode | 0o200)
    binary = work / "dockerfile-frontend"
    log(f"compiling {_PACKAGE} (a few minutes)")
    cmd = [go, "build", "-C", str(source), "-trimpath", "-ldflags=-s -w", "-o", str(binary), _PACKAGE]
    run_logged(cmd, log_path, env, "go build")
    return binary


def _rootfs(binary: Path, tarball: Path) -> None:
    with tarfile.open(tarball, "w") as tar:
        directory = tarfile.TarInfo("bin")
        directory.type, directory.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(directory)
        info = tar.gettarinfo(str(binary), arcname=_BINARY)
        info.mode, info.uid, info.gid, info.uname, info.gname = 0o755, 0, 0, "root", "root"
        with binary.open("rb") as data:
            tar.addfile(info, data)


def ensure_frontend_image(force: bool = False, log: Callable[[str], None] = print) -> str:
    """Builds the frontend image unless the engine already holds it; returns its tag."""
    docker = docker_cli()
    tag = frontend_tag()
    if not force and image_exists(docker, tag):
        log(f"using existing image {tag}")
        return tag
    go = _go()
    with tempfile.TemporaryDirectory(prefix="sandboxd-frontend-") as tmp:
        work = Path(tmp)
        binary = _compile(go, work, work / "build.log", log)
        tarball = work / "rootfs.tar"
        _rootfs(binary, tarball)
        import_tarball(
            docker,
            tarball,
            tag,
            recipe_hash(_recipe()),
            changes=_CHANGES,
            what=f"Dockerfile frontend {MODULE}@{VERSION}",
        )
    log(f"built {tag}")
    return tag


def main(argv: list[str] | None = None) -> int:
    """Builds (or reuses) the frontend image and prints its tag on stdout, progress on stderr."""
    return recipe_main(
        argv,
        prog="python -m sandboxd.images.dockerfile_frontend",
        description="Build (or reuse) BuildKit's Dockerfile frontend (syntax 1.4) as a local image.",
        tag=frontend_tag,
        ensure=ensure_frontend_image,
    )


if __name__ == "__main__":
    raise SystemExit(main())
