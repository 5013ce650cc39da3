"""The steps of an image build that do not depend on the recipe, shared by
every recipe (sandboxd.images.build, sandboxd.images.codejudge): the docker
CLI's checks and ``docker import``, the build steps' environment, log and
build directory, the cache's lock, and the recipe hash that names an image."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

__all__ = [
    "ImageBuildError",
    "docker_cli",
    "exclusive",
    "host_path_env",
    "image_exists",
    "import_tarball",
    "recipe_hash",
    "remove_build_dir",
    "run_logged",
]

_SBIN_DIRS = ("/usr/local/sbin", "/usr/sbin", "/sbin")

_LABEL_RECIPE = "org.sandboxd.recipe"


class ImageBuildError(RuntimeError):
    """An image could not be found, imported or built."""


def recipe_hash(recipe: dict[str, object]) -> str:
    """The 12 hex digits that name an image built to ``recipe`` (its tag and
    its cached tarball): a hash of the recipe's canonical JSON."""
    blob = json.dumps(recipe, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def docker_cli() -> str:
    """The docker CLI's path (ImageBuildError if there is none)."""
    docker = shutil.which("docker")
    if docker is None:
        raise ImageBuildError("docker CLI not found; run scripts/start-docker.sh")
    return docker


def image_exists(docker: str, tag: str) -> bool:
    """Whether the engine holds ``tag`` (ImageBuildError if it does not answer)."""
    # `docker images -q` separates "no such image" (empty output) from "daemon
    # unreachable" (non-zero exit), which `docker image inspect` does not.
    try:
        proc = subprocess.run(
            [docker, "images", "--quiet", "--no-trunc", tag],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise ImageBuildError("docker did not answer within 60s") from exc
    if proc.returncode != 0:
        raise ImageBuildError(
            f"cannot query docker ({proc.stderr.strip()}); is the daemon running? see scripts/start-docker.sh"
        )
    return bool(proc.stdout.strip())


def import_tarball(
    docker: str, tarball: Path, tag: str, h: str, *, changes: Sequence[str], what: str
) -> None:
    """``docker import`` of a cached rootfs tarball as ``tag``, with the image
    config ``changes`` and the recipe label ``h``."""
    cmd = [docker, "import"]
    for change in (*changes, f"LABEL {_LABEL_RECIPE}={h}"):
        cmd += ["--change", change]
    cmd += ["--message", f"sandboxd {what}, recipe {h}", "-", tag]
    with tarball.open("rb") as stdin:
        proc = subprocess.run(cmd, stdin=stdin, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ImageBuildError(
            f"docker import of {tarball} failed: {proc.stderr.strip()}; "
            "rerun with --force to rebuild the tarball"
        )


def host_path_env() -> dict[str, str]:
    """This process's environment for the build steps, with the sbin
    directories on PATH and the C locale."""
    # debootstrap shells out to chroot/mknod/mount, which live in sbin dirs
    # that a non-login root shell may not have on PATH.
    env = dict(os.environ)
    path = env.get("PATH", "").split(os.pathsep)
    env["PATH"] = os.pathsep.join([*path, *(d for d in _SBIN_DIRS if d not in path)])
    env["LC_ALL"] = "C"
    return env


def _mounts_under(root: Path) -> list[str]:
    prefix = str(root.resolve())
    mounts: list[str] = []
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            # Field 5 is the mount point, with spaces etc. octal-escaped.
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[4])
            if point == prefix or point.startswith(prefix + "/"):
                mounts.append(point)
    return mounts


def remove_build_dir(path: Path) -> None:
    """Removes a build directory, unmounting first what is mounted in it."""
    # A debootstrap killed mid-run can leave /proc, /sys or a bind-mounted
    # host /dev mounted inside the target; rmtree would recurse into them.
    for point in sorted(_mounts_under(path), key=len, reverse=True):
        subprocess.run(["umount", "--lazy", point], check=False, capture_output=True)
    leftover = _mounts_under(path)
    if leftover:
        raise ImageBuildError(f"refusing to delete {path}: still mounted: {leftover}")
    shutil.rmtree(path, ignore_errors=True)


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def run_logged(cmd: list[str], log_path: Path, env: dict[str, str], what: str) -> None:
    """Runs a build step with its output appended to ``log_path``."""
    with log_path.open("ab") as out:
        proc = subprocess.run(
            cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env, check=False
        )
    if proc.returncode != 0:
        raise ImageBuildError(
            f"{what} failed (exit {proc.returncode}), full log in {log_path}:\n{_tail(log_path)}"
        )


@contextlib.contextmanager
def exclusive(lock_path: Path) -> Iterator[None]:
    """Holds an exclusive lock on ``lock_path`` for the block."""
    with lock_path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
