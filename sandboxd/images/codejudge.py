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

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from sandboxd.adapters.sandboxfusion_langs import UNPACKAGED
from sandboxd.images import build as base

__all__ = ["CODE_JUDGE_REPO", "TOOLCHAINS", "UNPACKAGED", "code_judge_tag", "ensure_code_judge_image", "main"]

CODE_JUDGE_REPO = "sandboxd/code-judge"
RECIPE_VERSION = "1"

# Debian package -> why it is there. Installed without recommends: the
# recommends of the JDK, R and Racket alone roughly double the image.
TOOLCHAINS: dict[str, str] = {
    "python-is-python3": "python: SandboxFusion runs `python`",
    "python3-numpy": "python: common package",
    "python3-pandas": "python: common package",
    "python3-pytest": "pytest",
    "python3-requests": "python: in SandboxFusion's python runtime (its isolation tests import it)",
    "g++": "cpp",
    "libssl-dev": "cpp: SandboxFusion links -lcrypto -lssl when available",
    "golang-go": "go, go_test",
    "default-jdk-headless": "java, junit, scala, kotlin_script",
    "junit5": "junit: the JUnit platform console launcher",
    "libjavatuples-java": "java: SandboxFusion puts javatuples-1.2.jar on every Java class path",
    "golang-github-stretchr-testify-dev": "go, go_test: testify, in SandboxFusion's go.mod (GOPATH below)",
    "nodejs": "nodejs",
    "node-typescript": "typescript (transpiled, not type-checked, like tsx)",
    "jest": "jest",
    "node-babel7": "jest: babel-jest and the TypeScript preset",
    "php-cli": "php",
    "mono-mcs": "csharp",
    "libmono-system-net-http4.0-cil": "csharp: System.Net.Http, one of dotnet's implicit usings",
    "lua5.4": "lua",
    "lua-unit": "lua: luaunit, in SandboxFusion's lua runtime",
    "r-base-core": "R",
    "perl": "perl",
    "libtest-deep-perl": "perl: Test::Deep, in SandboxFusion's perl runtime",
    "libdata-compare-perl": "perl: Data::Compare, in SandboxFusion's perl runtime",
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

# SandboxFusion's jest runs with jest-json-reporter as its testResultsProcessor,
# which writes jest's own results object to jest-report.json in the working
# directory (what its datasets fetch and parse). This is that reporter.
JEST_REPORTER = """\
const fs = require('fs');
module.exports = function (results) {
  fs.writeFileSync('jest-report.json', JSON.stringify(results, null, 2));
  return results;
};
"""
JEST_REPORTER_PATH = "/usr/local/lib/sandboxd/jest-report.js"

# Go's build cache is per request (under its HOME), so every go_test request
# would compile testify and its dependencies anew: seconds that SandboxFusion's
# image, whose module cache is built, does not spend. The image holds a cache
# with them built; a Go request starts from a copy of it (Go 1.19 cannot read a
# cache it may not write).
GO_CACHE_SEED = "/usr/local/lib/sandboxd/go-build"
GO_SEED_TEST = """\
package main

import (
\t"testing"

\t"github.com/stretchr/testify/assert"
\t"github.com/stretchr/testify/require"
)

func TestSeed(t *testing.T) {
\tassert.Equal(t, 1, 1)
\trequire.True(t, true)
}
"""

# The toolchains write caches under HOME (the run-code adapter points it at
# each request's directory). Sandboxes have no network: Go must not try its
# module proxy, and builds a lone file in GOPATH mode, finding the modules of
# SandboxFusion's go.mod that Debian packages (testify) where Debian puts them.
IMAGE_CHANGES: tuple[str, ...] = (
    *base.IMAGE_CHANGES,
    "ENV GOPROXY=off",
    "ENV GO111MODULE=auto",
    "ENV GOPATH=/usr/share/gocode",
    "ENV NODE_PATH=/usr/share/nodejs:/usr/lib/nodejs",
)


def _recipe() -> dict[str, object]:
    return {
        "recipe_version": RECIPE_VERSION,
        "base": base._recipe(),
        "toolchains": sorted(TOOLCHAINS),
        "ts_runner": TS_RUNNER,
        "jest_reporter": JEST_REPORTER,
        "go_seed": [GO_CACHE_SEED, GO_SEED_TEST],
        "mnt": "1777",
        "changes": list(IMAGE_CHANGES),
    }


def _recipe_hash() -> str:
    return base.recipe_hash(_recipe())


def code_judge_tag() -> str:
    """Return the tag of the code-judge image for the current recipe."""
    return f"{CODE_JUDGE_REPO}:{_recipe_hash()}"


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
        base.run_logged(
            ["chroot", str(rootfs), "apt-get", "update", "-q"], log_path, chroot_env, "apt-get update"
        )
        base.run_logged(
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
        base.run_logged(["chroot", str(rootfs), "apt-get", "clean"], log_path, chroot_env, "apt-get clean")
        _seed_go_cache(rootfs, log_path, chroot_env)
    finally:
        subprocess.run(["umount", "--lazy", str(proc_dir)], check=False, capture_output=True)
        policy.unlink(missing_ok=True)


def _seed_go_cache(rootfs: Path, log_path: Path, env: dict[str, str]) -> None:
    seed_dir = rootfs / "root/go-seed"
    seed_dir.mkdir(parents=True, exist_ok=True)
    (seed_dir / "main_test.go").write_text(GO_SEED_TEST, encoding="utf-8")
    go_env = {
        **env,
        "GOCACHE": GO_CACHE_SEED,
        "GOPATH": "/usr/share/gocode",
        "GO111MODULE": "auto",
        "GOPROXY": "off",
    }
    base.run_logged(
        ["chroot", str(rootfs), "go", "test", "/root/go-seed/main_test.go"],
        log_path,
        go_env,
        "go test of the Go cache seed",
    )
    shutil.rmtree(seed_dir)
    cache = rootfs / GO_CACHE_SEED.lstrip("/")
    for path in (cache, *cache.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o644)


def _add_toolchains(rootfs: Path, build_log: Path, env: dict[str, str]) -> None:
    """The build step after debootstrap: every toolchain, then the TypeScript runner
    and jest's JSON reporter."""
    _apt_in_chroot(rootfs, build_log, env)
    # /mnt is a scratch tmpfs in a sandbox, and Docker gives such a mount the
    # mode of the image's directory: writable for the sandbox's user there.
    (rootfs / "mnt").chmod(0o1777)
    for path, text in ((TS_RUNNER_PATH, TS_RUNNER), (JEST_REPORTER_PATH, JEST_REPORTER)):
        target = rootfs / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")


def ensure_code_judge_image(*, force: bool = False, log: Callable[[str], None] = print) -> str:
    """Make sure the code-judge image exists in docker; return its tag (slow on a cold cache)."""
    h = _recipe_hash()
    return base.ensure_image(
        f"{CODE_JUDGE_REPO}:{h}",
        h,
        f"code-judge-{h}.tar",
        changes=IMAGE_CHANGES,
        what="code-judge image",
        customise=_add_toolchains,
        force=force,
        log=log,
    )


def main(argv: list[str] | None = None) -> int:
    """Builds (or reuses) the code-judge image and prints its tag on stdout, progress on stderr."""
    return base.recipe_main(
        argv,
        prog="python -m sandboxd.images.codejudge",
        description="Build (or reuse) the code-judge image for sandboxd run-code.",
        tag=code_judge_tag,
        ensure=ensure_code_judge_image,
    )


if __name__ == "__main__":
    sys.exit(main())
