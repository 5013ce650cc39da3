"""SandboxFusion's languages: the source file each writes, and its compile
and run commands, following SandboxFusion's runners (major.py, minor.py) with
Debian's toolchains where SandboxFusion uses others (see
sandboxd.images.codejudge)."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, replace

from sandboxd.adapters import sandboxfusion_csharp as csharp

# SandboxFusion's CPU languages the code-judge image cannot have, and why:
# /run_code answers their requests SandboxError, naming the missing tool and this.
# (No other registry the image is built from has them either: PyPI's julia
# installers and Debian's elan download their toolchains from elsewhere, and
# SandboxFusion's Lean tests need Mathlib besides.)
UNPACKAGED: dict[str, str] = {
    "julia": "Debian dropped Julia after bullseye",
    "lean": "Debian does not package Lean 4 (its elan only downloads toolchains)",
    "swift": "Debian packages swiftlang only after bookworm",
}

__all__ = ["LANGUAGES", "LANGUAGE_NAMES", "Runner", "prepare_source", "runner_for"]

# SandboxFusion's ``Language`` type, in its order: anything else is a 422.
LANGUAGE_NAMES: tuple[str, ...] = (
    "python", "cpp", "nodejs", "go", "go_test", "java", "php", "csharp", "bash", "typescript", "sql",
    "rust", "cuda", "lua", "R", "perl", "D_ut", "ruby", "scala", "julia", "pytest", "junit",
    "kotlin_script", "jest", "verilog", "python_gpu", "lean", "swift", "racket",
)  # fmt: skip


@dataclass(frozen=True)
class Runner:
    """How one language runs: ``source`` holds the code; ``compile`` (if any) fills compile_result."""

    source: str
    run: str
    compile: str | None = None
    tool: str = ""
    """A binary whose absence means the image lacks the toolchain."""
    extra: tuple[tuple[str, str], ...] = ()
    """Support files written next to the source (name, content)."""


_TS_RUNNER = "/usr/local/lib/sandboxd/tsrun.js"
_JUNIT_JAR = "/usr/share/java/junit-platform-console-standalone.jar"
# SandboxFusion copies javatuples-1.2.jar next to every Java program and puts
# it on the class path.
_JAVATUPLES_JAR = "/usr/share/java/javatuples.jar"
# SandboxFusion's jest reports through jest-json-reporter to jest-report.json
# (its package.json), with at most two workers and no colours.
# go_test's build cache (under the request's HOME) starts as the image's copy,
# with testing and testify built (sandboxd.images.codejudge); a plain go build
# needs neither, and has the standard library prebuilt.
_GO_CACHE = (
    "[ ! -d /usr/local/lib/sandboxd/go-build ] || { mkdir -p \"$HOME/.cache\""
    " && cp -r /usr/local/lib/sandboxd/go-build \"$HOME/.cache/go-build\"; } &&"
)
_JEST_CONFIG = '{"testResultsProcessor": "/usr/local/lib/sandboxd/jest-report.js", "maxWorkers": 2}'
# Jest on TypeScript needs babel's TypeScript preset, as SandboxFusion's
# runtime/node configures it.
_JEST_BABEL = (
    "module.exports = {presets: [['@babel/preset-env', {targets: {node: 'current'}}],"
    " '@babel/preset-typescript']};\n"
)

LANGUAGES: dict[str, Runner] = {
    "python": Runner("main.py", "python main.py", tool="python"),
    "pytest": Runner("test_main.py", "pytest test_main.py", tool="pytest"),
    "cpp": Runner(
        "main.cpp", "./test", "g++ -std=c++17 main.cpp -o test -lcrypto -lssl -lpthread", tool="g++"
    ),
    "go": Runner("main.go", "./out", "go build -o out main.go", tool="go"),
    "go_test": Runner("main_test.go", f"{_GO_CACHE} go test main_test.go", tool="go"),
    "java": Runner("Main.java", "java -cp {cp} -ea Main", "javac -cp {cp} Main.java", tool="javac"),
    "junit": Runner(
        "Main.java",
        f"java -jar {_JUNIT_JAR} --class-path {{cp}} --scan-class-path",
        "javac -cp {cp} *.java",
        tool="javac",
    ),
    "nodejs": Runner("main.js", "node main.js", tool="node"),
    "typescript": Runner("main.ts", f"node {_TS_RUNNER} main.ts", tool="node"),
    "jest": Runner(
        "main.test.ts",
        f"FORCE_COLOR=0 jest --ci --config '{_JEST_CONFIG}' main.test.ts",
        tool="jest",
        extra=(("babel.config.js", _JEST_BABEL),),
    ),
    "php": Runner("main.php", "php -f main.php", tool="php"),
    "rust": Runner("main.rs", "./test", "rustc main.rs -o test", tool="rustc"),
    "bash": Runner("main.sh", "/bin/bash main.sh", tool="bash"),
    # SandboxFusion's `dotnet run` builds and runs in one step, so a C# compile
    # error is a failed run there too.
    "csharp": Runner("Program.cs", csharp.COMMAND, tool="mcs", extra=((csharp.ENTRY_FILE, csharp.ENTRY),)),
    "lua": Runner("main.lua", "lua main.lua", tool="lua"),
    "R": Runner("main.R", "Rscript main.R", tool="Rscript"),
    "perl": Runner("main.pl", "perl main.pl", tool="perl"),
    "D_ut": Runner("main.d", "./test", "ldmd2 main.d -unittest -of=test", tool="ldmd2"),
    "ruby": Runner("main.rb", "ruby main.rb", tool="ruby"),
    "scala": Runner("main.scala", "scala {classname}", "scalac main.scala", tool="scalac"),
    "julia": Runner("main.jl", "julia main.jl", tool="julia"),
    "kotlin_script": Runner("main.kts", "kotlinc -script main.kts", tool="kotlinc"),
    "sql": Runner("main.sql", "sqlite3 -bail < main.sql", tool="sqlite3"),
    "verilog": Runner(
        "main.sv",
        "vvp -n test.vvp",
        "iverilog -Wall -Winfloop -Wno-timescale -g2012 -s tb -o test.vvp main.sv",
        tool="iverilog",
    ),
    "racket": Runner("main.rkt", "racket main.rkt", tool="racket"),
    "lean": Runner("Main.lean", "lake build", tool="lake"),
    "swift": Runner("main.swift", "./test.out", "swiftc main.swift -o test.out", tool="swiftc"),
}

_JAVA_PUBLIC_CLASS = re.compile(r"public\s+(?:final\s+|abstract\s+)*class\s+(\w+)")
_SCALA_OBJECT = re.compile(r"object\s+(\w+)")


def _class_path(language: str, files: Iterable[str]) -> str:
    """SandboxFusion's Java class path: the directory, its own jars, then the request's."""
    jars = [".", _JUNIT_JAR if language == "junit" else _JAVATUPLES_JAR]
    jars += [name for name in files if name.endswith(".jar")]
    return shlex.quote(":".join(jars))


def runner_for(language: str, code: str, files: Iterable[str] = ()) -> Runner | str:
    """The runner for ``language`` and ``code`` (with the request's ``files``), or why
    SandboxFusion would refuse to run it."""
    runner = LANGUAGES.get(language)
    if runner is None:
        return f"language {language!r} needs a GPU, which this server does not offer"
    if language in ("java", "junit"):
        cp = _class_path(language, files)
        compile_command = runner.compile.format(cp=cp) if runner.compile else None
        runner = replace(runner, run=runner.run.format(cp=cp), compile=compile_command)
    if language == "junit":
        match = _JAVA_PUBLIC_CLASS.search(code)
        return replace(runner, source=f"{match.group(1) if match else 'Main'}.java")
    if language == "scala":
        obj = _SCALA_OBJECT.search(code)
        if obj is None:
            # SandboxFusion answers this with a compile_result of status Error.
            return "Object name not found."
        return Runner(runner.source, runner.run.format(classname=obj.group(1)), runner.compile, runner.tool)
    return runner


def prepare_source(language: str, code: str) -> str:
    """The code as written to disk (SandboxFusion adds a missing ``<?php`` tag; its
    dotnet projects have implicit usings)."""
    if language == "php" and "<?php" not in code:
        return "<?php\n" + code
    if language == "csharp":
        return csharp.with_implicit_usings(code)
    return code
