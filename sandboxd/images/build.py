"""Build the default rollout sandbox image without a container registry.

Rollout hosts cannot pull from Docker Hub or any other registry, so a
``FROM debian`` Dockerfile is not an option. They can reach a Debian package
mirror, so the root filesystem is produced with ``debootstrap`` and turned into
an image with ``docker import``.

debootstrap takes minutes, so the result is cached twice, both keyed by a hash
of the recipe: as the docker tag ``sandboxd/rollout:<hash>`` (checking it takes
well under a second) and as a rootfs tarball in ``$SANDBOXD_CACHE_DIR``
(default ``~/.cache/sandboxd/images``), which survives a wiped docker store and
re-imports in seconds.

Every recipe is built on this one, through the same steps: debootstrap and
the rootfs's configuration (``build_tarball``), the cache and ``docker
import`` (``ensure_image``) and the command line (``recipe_main``), with the
recipe-independent pieces in sandboxd.images.steps; another recipe
(sandboxd.images.codejudge) adds its own step through ``customise``.

Usage: ``python -m sandboxd.images.build [--force] [--print-tag]``
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from sandboxd.images.mirror import debian_mirror as mirror_of_suite
from sandboxd.images.steps import (
    ImageBuildError,
    docker_cli,
    exclusive,
    host_path_env,
    image_exists,
    import_tarball,
    recipe_hash,
    remove_build_dir,
    run_logged,
)

__all__ = [
    "DEFAULT_IMAGE_REPO",
    "RECIPE_VERSION",
    "ImageBuildError",
    "debian_mirror",
    "default_image_tag",
    "ensure_default_image",
    "ensure_image",
    "main",
    "recipe_hash",
    "recipe_main",
    "run_logged",
]

# Bump whenever this module changes what ends up in the image in a way the
# recipe dict below does not capture, so stale caches are not reused.
RECIPE_VERSION = "1"
DEFAULT_IMAGE_REPO = "sandboxd/rollout"

SUITE = "bookworm"
VARIANT = "minbase"
PACKAGES: tuple[str, ...] = (
    "python3",
    "git",
    "bash",
    "coreutils",
    "grep",
    "procps",
    "tar",
    "ca-certificates",
)
SANDBOX_USER = "sandbox"
SANDBOX_UID = 1000
SANDBOX_GID = 1000
SANDBOX_HOME = "/home/sandbox"
WORKSPACE_DIR = "/workspace"
WORKSPACE_MODE = 0o1777

CACHE_DIR_ENV = "SANDBOXD_CACHE_DIR"

IMAGE_CHANGES: tuple[str, ...] = (
    # docker import produces an image with no config at all, not even PATH.
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    # C.UTF-8 ships with libc-bin; without it Python and git fall back to ASCII.
    "ENV LANG=C.UTF-8",
    f"WORKDIR {WORKSPACE_DIR}",
    'CMD ["/bin/bash"]',
)

# Rollouts never read docs or translations and never run apt (no network), so
# these only cost image size.
_STRIP_GLOBS: tuple[str, ...] = (
    "var/lib/apt/lists/*",
    "var/cache/apt/*.bin",
    "var/cache/apt/archives/*.deb",
    "var/cache/debconf/*-old",
    "var/lib/dpkg/*-old",
    "var/log/*.log",
    "var/log/apt/*",
    "usr/share/doc/*",
    "usr/share/man/*",
    "usr/share/info/*",
    "usr/share/locale/*",
    "usr/share/lintian/*",
)

# Docker mounts its own /dev, /proc and /sys over these, so the host's device
# nodes that debootstrap created would be dead weight.
_TAR_EXCLUDES: tuple[str, ...] = ("./dev/*", "./proc/*", "./sys/*")


def _recipe() -> dict[str, object]:
    return {
        "recipe_version": RECIPE_VERSION,
        "suite": SUITE,
        "variant": VARIANT,
        "packages": sorted(PACKAGES),
        "user": {
            "name": SANDBOX_USER,
            "uid": SANDBOX_UID,
            "gid": SANDBOX_GID,
            "home": SANDBOX_HOME,
        },
        "workspace": {"path": WORKSPACE_DIR, "mode": WORKSPACE_MODE},
        "strip": list(_STRIP_GLOBS),
        "tar_excludes": list(_TAR_EXCLUDES),
        "changes": list(IMAGE_CHANGES),
    }


def _recipe_hash() -> str:
    # The mirror is deliberately left out: any mirror serves the same suite.
    return recipe_hash(_recipe())


def default_image_tag() -> str:
    """Return the tag of the default image for the current recipe."""
    return f"{DEFAULT_IMAGE_REPO}:{_recipe_hash()}"


def _cache_dir() -> Path:
    env = os.environ.get(CACHE_DIR_ENV)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "sandboxd" / "images"


def debian_mirror() -> str:
    """The Debian mirror to bootstrap this recipe's suite from
    (sandboxd.images.mirror: ``$SANDBOXD_DEBIAN_MIRROR``, else the host's
    apt source for the suite, else deb.debian.org)."""
    return mirror_of_suite(SUITE)


# ---------------------------------------------------------------- rootfs


def _write_text(path: Path, text: str) -> None:
    # An absolute symlink inside the rootfs would resolve against the host.
    if path.is_symlink():
        path.unlink()
    path.write_text(text, encoding="utf-8")


def _append_entry(path: Path, entry: str, *, name: str, numeric_id: int | None) -> None:
    text = path.read_text(encoding="utf-8") if path.is_file() else ""
    for line in text.splitlines():
        fields = line.split(":")
        if fields[0] == name:
            return
        if numeric_id is not None and len(fields) > 2 and fields[2] == str(numeric_id):
            raise ImageBuildError(f"{path.name}: id {numeric_id} already taken by {fields[0]!r}")
    if text and not text.endswith("\n"):
        text += "\n"
    _write_text(path, text + entry + "\n")


def _configure_rootfs(rootfs: Path) -> None:
    etc = rootfs / "etc"
    # Edited by hand because useradd would have to run inside a chroot, and
    # these four lines are all it would do.
    _append_entry(
        etc / "passwd",
        f"{SANDBOX_USER}:x:{SANDBOX_UID}:{SANDBOX_GID}:{SANDBOX_USER}:{SANDBOX_HOME}:/bin/bash",
        name=SANDBOX_USER,
        numeric_id=SANDBOX_UID,
    )
    _append_entry(
        etc / "group",
        f"{SANDBOX_USER}:x:{SANDBOX_GID}:",
        name=SANDBOX_USER,
        numeric_id=SANDBOX_GID,
    )
    # Locked password; the entries only keep pwck/su from complaining.
    _append_entry(etc / "shadow", f"{SANDBOX_USER}:!:19000:0:99999:7:::", name=SANDBOX_USER, numeric_id=None)
    _append_entry(etc / "gshadow", f"{SANDBOX_USER}:!::", name=SANDBOX_USER, numeric_id=None)

    home = rootfs / SANDBOX_HOME.lstrip("/")
    home.mkdir(parents=True, exist_ok=True)
    skel = etc / "skel"
    if skel.is_dir():
        shutil.copytree(skel, home, symlinks=True, dirs_exist_ok=True)
    for dirpath, _dirnames, filenames in os.walk(home):
        os.chown(dirpath, SANDBOX_UID, SANDBOX_GID)
        for filename in filenames:
            os.lchown(os.path.join(dirpath, filename), SANDBOX_UID, SANDBOX_GID)
    home.chmod(0o755)

    workspace = rootfs / WORKSPACE_DIR.lstrip("/")
    workspace.mkdir(parents=True, exist_ok=True)
    # mkdir's mode is filtered by the umask, and the sticky bit needs chmod.
    workspace.chmod(WORKSPACE_MODE)

    # debootstrap copies these from the build host; docker supplies its own at
    # run time, and the host's values must not leak into a cached image.
    resolv = etc / "resolv.conf"
    if resolv.exists() or resolv.is_symlink():
        resolv.unlink()
    _write_text(etc / "hostname", "sandbox\n")


def _strip_rootfs(rootfs: Path) -> None:
    for pattern in _STRIP_GLOBS:
        for path in rootfs.glob(pattern):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()


Customise = Callable[[Path, Path, dict[str, str]], None]
"""A build step after debootstrap: (rootfs, build log, environment)."""


def build_tarball(dest: Path, h: str, log: Callable[[str], None], customise: Customise | None = None) -> None:
    """Bootstraps the base rootfs, lets ``customise`` add to it, configures and
    strips it, and caches it as the tarball ``dest``."""
    if os.geteuid() != 0:
        raise ImageBuildError("building the image needs root (debootstrap, chroot); rerun as root")
    env = host_path_env()
    debootstrap = shutil.which("debootstrap", path=env["PATH"])
    if debootstrap is None:
        raise ImageBuildError("debootstrap not found; apt-get install debootstrap")
    mirror = debian_mirror()
    cache = dest.parent
    build_log = cache / f"{h}.build.log"
    build_log.unlink(missing_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{h}.build-", dir=cache))
    try:
        rootfs = work / "rootfs"
        log(f"debootstrap {SUITE} ({VARIANT}) from {mirror}; takes a few minutes")
        started = time.monotonic()
        include = f"--include={','.join(PACKAGES)}"
        run_logged(
            [debootstrap, f"--variant={VARIANT}", include, SUITE, str(rootfs), mirror],
            build_log,
            env,
            "debootstrap",
        )
        log(f"debootstrap done in {time.monotonic() - started:.0f}s")
        if customise is not None:
            customise(rootfs, build_log, env)
            log(f"rootfs customised after {time.monotonic() - started:.0f}s")
        _configure_rootfs(rootfs)
        _strip_rootfs(rootfs)
        partial = work / "rootfs.tar"
        tar_cmd = ["tar", "--numeric-owner", "-C", str(rootfs), "-cf", str(partial)]
        tar_cmd += [f"--exclude={pattern}" for pattern in _TAR_EXCLUDES]
        tar = subprocess.run([*tar_cmd, "."], capture_output=True, text=True, check=False)
        if tar.returncode != 0:
            raise ImageBuildError(f"tar of rootfs failed: {tar.stderr.strip()}")
        # Same filesystem, so the cached tarball appears complete or not at all.
        os.replace(partial, dest)
        log(f"cached rootfs {dest} ({dest.stat().st_size / 2**20:.0f} MiB)")
    finally:
        remove_build_dir(work)


def ensure_image(
    tag: str,
    h: str,
    tarball_name: str,
    *,
    changes: Sequence[str],
    what: str,
    customise: Customise | None = None,
    force: bool = False,
    log: Callable[[str], None] = print,
) -> str:
    """Make sure ``tag`` exists in docker: cheap when it does; otherwise
    imports the cached tarball, building it first if it is missing or
    ``force`` is set. Blocking and slow on a cold cache."""
    docker = docker_cli()
    if not force and image_exists(docker, tag):
        return tag
    cache = _cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    tarball = cache / tarball_name
    # Concurrent callers (several workers starting at once) wait for one build.
    with exclusive(cache / f"{tarball.stem}.lock"):
        if not force and image_exists(docker, tag):
            return tag
        # Holding the lock, any build dir left over is from a dead builder.
        for stale in cache.glob(f".{h}.build-*"):
            log(f"removing interrupted build {stale}")
            remove_build_dir(stale)
        if force or not tarball.is_file():
            build_tarball(tarball, h, log, customise)
        log(f"importing {tarball} as {tag}")
        started = time.monotonic()
        import_tarball(docker, tarball, tag, h, changes=changes, what=what)
        log(f"imported {tag} in {time.monotonic() - started:.1f}s")
    return tag


def ensure_default_image(*, force: bool = False, log: Callable[[str], None] = print) -> str:
    """Make sure the default rollout image exists in docker; return its tag.

    Cheap when the tag already exists. Otherwise imports the cached rootfs
    tarball, building it first with debootstrap if it is missing or ``force``
    is set. Blocking and slow on a cold cache: not for use on an event loop.
    """
    h = _recipe_hash()
    return ensure_image(
        f"{DEFAULT_IMAGE_REPO}:{h}",
        h,
        f"{h}.tar",
        changes=IMAGE_CHANGES,
        what="rollout image",
        force=force,
        log=log,
    )


def recipe_main(
    argv: list[str] | None,
    *,
    prog: str,
    description: str,
    tag: Callable[[], str],
    ensure: Callable[..., str],
) -> int:
    """The command line of an image recipe's module: builds (or reuses) the
    image with ``ensure`` and prints its tag on stdout, progress on stderr;
    ``--print-tag`` prints ``tag()`` without building."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--force", action="store_true", help="rebuild with debootstrap even if cached")
    parser.add_argument(
        "--print-tag", action="store_true", help="print the image tag and exit without building"
    )
    args = parser.parse_args(argv)
    if args.print_tag:
        print(tag())
        return 0

    # Progress goes to stderr so `TAG=$(python -m sandboxd.images.build)` works.
    def log(message: str) -> None:
        print(f"[sandboxd.images] {message}", file=sys.stderr, flush=True)

    try:
        built = ensure(force=args.force, log=log)
    except ImageBuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(built)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Builds (or reuses) the default image and prints its tag on stdout, progress on stderr."""
    return recipe_main(
        argv,
        prog="python -m sandboxd.images.build",
        description="Build (or reuse) the default rollout sandbox image.",
        tag=default_image_tag,
        ensure=ensure_default_image,
    )


if __name__ == "__main__":
    sys.exit(main())
