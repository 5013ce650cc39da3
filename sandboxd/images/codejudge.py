"""Build the code-judge image (``sandboxd/code-judge:<hash>``) without a registry.

The image behind ``sandboxd run-code``: the default image's base (Debian
bookworm minbase, the ``sandbox`` user, ``/workspace``) plus the toolchains of
every CPU language of SandboxFusion's ``Language`` type that Debian packages.
Like the default image it is bootstrapped from a Debian mirror, then the
toolchains are installed with apt inside a chroot, and the result is cached as
a tarball and a docker tag keyed by a hash of the recipe.

Not packaged in bookworm, so absent: julia (dropped from Debian after
bullseye), lean (Lean 4 is not packaged), swift (``swiftlang`` only arrives
after bookworm; bookworm's ``swift`` is OpenStack Swift), and ``dmd`` (``ldmd2``
from ldc, its drop-in, serves D_ut). C# uses Mono (``mcs``/``mono``) because
Debian has no ``dotnet``.

Usage: ``python -m sandboxd.images.codejudge [--force] [--print-tag]``
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from sandboxd.images import build as base

__all__ = ["CODE_JUDGE_REPO", "TOOLCHAINS", "code_judge_tag", "ensure_code_judge_image", "main"]

CODE_JUDGE_REPO = "sandboxd/code-judge"
RECIPE_VERSION = "1"

# Debian package -> why it is there. Installed without recommends: the
# recommends of the JDK, R and Racket alone roughly double the image.
TOOLCHAINS: dict[str, str] = {
    "python-is-python3": "python: SandboxFusion runs `python`",
    "python3-numpy": "python: common package",
    "python3-pandas": "python: common package",
    "python3-pytest": "pytest",
    "g++": "cpp",
    "libssl-dev": "cpp: SandboxFusion links -lcrypto -lssl when available",
    "golang-go": "go, go_test",
    "default-jdk-headless": "java, junit, scala, kotlin_script",
    "junit5": "junit: the JUnit platform console launcher",
    "nodejs": "nodejs",
    "node-typescript": "typescript (transpiled, not type-checked, like tsx)",
    "jest": "jest",
    "node-babel7": "jest: babel-jest and the TypeScript preset",
    "php-cli": "php",
    "mono-mcs": "csharp",
    "lua5.4": "lua",
    "r-base-core": "R",
    "perl": "perl",
    "ldc": "D_ut (ldmd2 takes dmd's flags)",
    "ruby": "ruby",
    "scala": "scala",
    "kotlin": "kotlin_script",
    "sqlite3": "sql",
    "iverilog": "verilog",
    "racket": "racket",
    "rustc": "rust",
}

# Transpiles a TypeScript file with the compiler's own API and runs it, so a
# type error does not fail a program that tsx (SandboxFusion's runner) runs.
TS_RUNNER = """\
const ts = require('typescript');
const fs = require('fs');
const path = require('path');
const src = process.argv[2];
const out = ts.transpileModule(fs.readFileSync(src, 'utf8'), {
  compilerOptions: { module: ts.ModuleKind.CommonJS, target: ts.ScriptTarget.ES2020, esModuleInterop: true },
  fileName: src,
  reportDiagnostics: true,
});
// Syntax errors only: transpiling reports no type errors, as tsx does not.
if (out.diagnostics && out.diagnostics.length) {
  for (const d of out.diagnostics) {
    console.error(`${src}: error TS${d.code}: ${ts.flattenDiagnosticMessageText(d.messageText, '\\n')}`);
  }
  process.exit(1);
}
const js = path.join(path.dirname(path.resolve(src)), '.' + path.basename(src) + '.js');
fs.writeFileSync(js, out.outputText);
process.argv.splice(1, 2, js);
require(js);
"""
TS_RUNNER_PATH = "/usr/local/lib/sandboxd/tsrun.js"

# The toolchains write caches under HOME (the run-code adapter points it at
# each request's directory). Sandboxes have no network: Go must not try its
# module proxy, and builds a lone file in GOPATH mode as SandboxFusion's does.
IMAGE_CHANGES: tuple[str, ...] = (
    *base.IMAGE_CHANGES,
    "ENV GOPROXY=off",
    "ENV GO111MODULE=auto",
    "ENV NODE_PATH=/usr/share/nodejs:/usr/lib/nodejs",
)


class CodeJudgeBuildError(base.ImageBuildError):
    """The code-judge image could not be built or imported."""


def _recipe() -> dict[str, object]:
    return {
        "recipe_version": RECIPE_VERSION,
        "base": base._recipe(),
        "toolchains": sorted(TOOLCHAINS),
        "ts_runner": TS_RUNNER,
        "changes": list(IMAGE_CHANGES),
    }


def _recipe_hash() -> str:
    blob = json.dumps(_recipe(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def code_judge_tag() -> str:
    """Return the tag of the code-judge image for the current recipe."""
    return f"{CODE_JUDGE_REPO}:{_recipe_hash()}"


def _run_logged(cmd: list[str], log_path: Path, env: dict[str, str], what: str) -> None:
    with log_path.open("ab") as out:
        proc = subprocess.run(
            cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env, check=False
        )
    if proc.returncode != 0:
        raise CodeJudgeBuildError(
            f"{what} failed (exit {proc.returncode}), full log in {log_path}:\n{base._tail(log_path)}"
        )


def _apt_in_chroot(rootfs: Path, log_path: Path, env: dict[str, str]) -> None:
    # Java's and ca-certificates' maintainer scripts need /proc; nothing may
    # start a service in the chroot (policy-rc.d 101 forbids it).
    policy = rootfs / "usr/sbin/policy-rc.d"
    policy.write_text("#!/bin/sh\nexit 101\n", encoding="utf-8")
    policy.chmod(0o755)
    proc_dir = rootfs / "proc"
    proc_dir.mkdir(exist_ok=True)
    subprocess.run(["mount", "-t", "proc", "proc", str(proc_dir)], check=True, capture_output=True)
    try:
        chroot_env = {**env, "DEBIAN_FRONTEND": "noninteractive", "HOME": "/root"}
        _run_logged(
            ["chroot", str(rootfs), "apt-get", "update", "-q"], log_path, chroot_env, "apt-get update"
        )
        _run_logged(
            [
                "chroot",
                str(rootfs),
                "apt-get",
                "install",
                "-y",
                "-q",
                "--no-install-recommends",
                *sorted(TOOLCHAINS),
            ],
            log_path,
            chroot_env,
            "apt-get install of the toolchains",
        )
        _run_logged(["chroot", str(rootfs), "apt-get", "clean"], log_path, chroot_env, "apt-get clean")
    finally:
        subprocess.run(["umount", "--lazy", str(proc_dir)], check=False, capture_output=True)
        policy.unlink(missing_ok=True)


def _build_tarball(dest: Path, h: str, log: Callable[[str], None]) -> None:
    if os.geteuid() != 0:
        raise CodeJudgeBuildError("building the image needs root (debootstrap, chroot)")
    env = base._host_path_env()
    debootstrap = shutil.which("debootstrap", path=env["PATH"])
    if debootstrap is None:
        raise CodeJudgeBuildError("debootstrap not found; apt-get install debootstrap")
    mirror = base.debian_mirror()
    build_log = dest.parent / f"{h}.build.log"
    build_log.unlink(missing_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{h}.build-", dir=dest.parent))
    try:
        rootfs = work / "rootfs"
        started = time.monotonic()
        log(f"debootstrap {base.SUITE} ({base.VARIANT}) from {mirror}")
        _run_logged(
            [
                debootstrap,
                f"--variant={base.VARIANT}",
                f"--include={','.join(base.PACKAGES)}",
                base.SUITE,
                str(rootfs),
                mirror,
            ],
            build_log,
            env,
            "debootstrap",
        )
        log(f"debootstrap done in {time.monotonic() - started:.0f}s; installing {len(TOOLCHAINS)} packages")
        _apt_in_chroot(rootfs, build_log, env)
        log(f"toolchains installed after {time.monotonic() - started:.0f}s")
        runner = rootfs / TS_RUNNER_PATH.lstrip("/")
        runner.parent.mkdir(parents=True, exist_ok=True)
        runner.write_text(TS_RUNNER, encoding="utf-8")
        base._configure_rootfs(rootfs)
        base._strip_rootfs(rootfs)
        partial = work / "rootfs.tar"
        tar_cmd = ["tar", "--numeric-owner", "-C", str(rootfs), "-cf", str(partial)]
        tar_cmd += [f"--exclude={pattern}" for pattern in base._TAR_EXCLUDES]
        tar = subprocess.run([*tar_cmd, "."], capture_output=True, text=True, check=False)
        if tar.returncode != 0:
            raise CodeJudgeBuildError(f"tar of rootfs failed: {tar.stderr.strip()}")
        os.replace(partial, dest)
        size = dest.stat().st_size / 2**20
        log(f"cached rootfs {dest} ({size:.0f} MiB) in {time.monotonic() - started:.0f}s")
    finally:
        base._remove_build_dir(work)


def _import(docker: str, tarball: Path, tag: str, h: str) -> None:
    cmd = [docker, "import"]
    for change in (*IMAGE_CHANGES, f"LABEL {base._LABEL_RECIPE}={h}"):
        cmd += ["--change", change]
    cmd += ["--message", f"sandboxd code-judge image, recipe {h}", "-", tag]
    with tarball.open("rb") as stdin:
        proc = subprocess.run(cmd, stdin=stdin, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise CodeJudgeBuildError(f"docker import of {tarball} failed: {proc.stderr.strip()}")


def ensure_code_judge_image(*, force: bool = False, log: Callable[[str], None] = print) -> str:
    """Make sure the code-judge image exists in docker; return its tag (slow on a cold cache)."""
    h = _recipe_hash()
    tag = f"{CODE_JUDGE_REPO}:{h}"
    docker = base._docker_cli()
    if not force and base._image_exists(docker, tag):
        return tag
    cache = base._cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    tarball = cache / f"code-judge-{h}.tar"
    with base._exclusive(cache / f"code-judge-{h}.lock"):
        if not force and base._image_exists(docker, tag):
            return tag
        for stale in cache.glob(f".{h}.build-*"):
            log(f"removing interrupted build {stale}")
            base._remove_build_dir(stale)
        if force or not tarball.is_file():
            _build_tarball(tarball, h, log)
        log(f"importing {tarball} as {tag}")
        _import(docker, tarball, tag, h)
    return tag


def main(argv: list[str] | None = None) -> int:
    """Builds (or reuses) the code-judge image and prints its tag on stdout, progress on stderr."""
    parser = argparse.ArgumentParser(prog="python -m sandboxd.images.codejudge")
    parser.add_argument("--force", action="store_true", help="rebuild even if cached")
    parser.add_argument("--print-tag", action="store_true", help="print the tag and exit")
    args = parser.parse_args(argv)
    if args.print_tag:
        print(code_judge_tag())
        return 0

    def log(message: str) -> None:
        print(f"[sandboxd.images] {message}", file=sys.stderr, flush=True)

    try:
        tag = ensure_code_judge_image(force=args.force, log=log)
    except base.ImageBuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(tag)
    return 0


if __name__ == "__main__":
    sys.exit(main())
