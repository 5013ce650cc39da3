"""The SandboxFusion adapter's request parsing and status rules, as SandboxFusion's
``RunCodeRequest`` and ``parse_run_status`` define them (no I/O)."""

from __future__ import annotations

from typing import Any

import pytest

from sandboxd.adapters.sandboxfusion import RunCodeArgs, command_result, parse_request, run_status
from sandboxd.adapters.sandboxfusion_langs import LANGUAGE_NAMES, LANGUAGES, prepare_source, runner_for
from sandboxd.client import ExecResult

pytestmark = pytest.mark.timeout(10)


def _result(outcome: str, exit_code: int = 0, detail: str = "") -> ExecResult:
    return ExecResult(
        outcome=outcome, exit_code=exit_code, stdout=b"o", stderr=b"e", duration=0.5, detail=detail
    )


def test_defaults_and_null_files() -> None:
    parsed = parse_request(
        {"code": "x", "language": "python", "files": {"a": "YQ==", "b": None}, "stdin": None}
    )
    assert isinstance(parsed, RunCodeArgs)
    assert (parsed.compile_timeout, parsed.run_timeout, parsed.memory_limit_MB) == (10.0, 10.0, -1)
    assert parsed.files == {"a": "YQ=="} and parsed.stdin is None and parsed.fetch_files == []


@pytest.mark.parametrize(
    "body",
    [
        [],
        {"language": "python"},
        {"code": "x"},
        {"code": "x", "language": "cobol"},
        {"code": 1, "language": "python"},
        {"code": "x", "language": "python", "run_timeout": "soon"},
        {"code": "x", "language": "python", "run_timeout": True},
        {"code": "x", "language": "python", "memory_limit_MB": 1.5},
        {"code": "x", "language": "python", "files": None},
        {"code": "x", "language": "python", "fetch_files": "out.txt"},
        {"code": "x", "language": "python", "stdin": 3},
    ],
)
def test_malformed_bodies_are_422(body: Any) -> None:
    problems = parse_request(body)
    assert isinstance(problems, list) and problems and all("loc" in p for p in problems)


def test_lax_numbers_like_pydantic() -> None:
    parsed = parse_request({"code": "x", "language": "cpp", "run_timeout": "2.5", "memory_limit_MB": 1024.0})
    assert isinstance(parsed, RunCodeArgs) and parsed.run_timeout == 2.5 and parsed.memory_limit_MB == 1024


def test_outcomes_map_to_sandboxfusion_statuses() -> None:
    assert command_result(_result("EXITED", 3))["status"] == "Finished"
    timed = command_result(_result("TIMED_OUT", -1))
    assert timed["status"] == "TimeLimitExceeded" and timed["return_code"] is None
    lost = command_result(_result("SANDBOX_LOST", 137, "the sandbox stopped"))
    assert (
        lost["status"] == "Error" and lost["return_code"] is None and lost["stderr"] == "the sandbox stopped"
    )
    oom = command_result(_result("OOM_KILLED", 0))
    assert oom["status"] == "Finished" and oom["return_code"] == 137


def test_parse_run_status() -> None:
    ok = command_result(_result("EXITED", 0))
    bad = command_result(_result("EXITED", 1))
    tle = command_result(_result("TIMED_OUT"))
    lost = command_result(_result("SANDBOX_LOST", detail="gone"))
    assert run_status(None, ok) == ("Success", "")
    assert run_status(bad, None) == ("Failed", "")
    assert run_status(ok, tle) == ("Failed", "")
    assert run_status(ok, lost) == ("SandboxError", "gone")


def test_every_sandboxfusion_language_is_known() -> None:
    gpu = {"cuda", "python_gpu"}
    assert set(LANGUAGES) == set(LANGUAGE_NAMES) - gpu
    assert isinstance(runner_for("cuda", ""), str)
    assert runner_for("scala", "println(1)") == "Object name not found."
    scala = runner_for("scala", "object Hello { }")
    assert not isinstance(scala, str) and scala.run == "scala Hello"
    junit = runner_for("junit", "public class FooTest {}")
    assert not isinstance(junit, str) and junit.source == "FooTest.java"
    assert (
        prepare_source("php", "echo 1;") == "<?php\necho 1;"
        and prepare_source("php", "<?php 1;") == "<?php 1;"
    )


def test_java_class_path_has_javatuples_and_the_request_jars() -> None:
    java = runner_for("java", "public class Main {}", {"lib/x y.jar": "", "notes.txt": ""})
    assert not isinstance(java, str) and java.compile is not None
    cp = "'.:/usr/share/java/javatuples.jar:lib/x y.jar'"
    assert java.compile == f"javac -cp {cp} Main.java" and java.run == f"java -cp {cp} -ea Main"
    junit = runner_for("junit", "public class T {}", {"a.jar": ""})
    assert not isinstance(junit, str) and junit.compile is not None
    assert "--class-path .:/usr/share/java/junit-platform-console-standalone.jar:a.jar" in junit.run
    assert "javatuples" not in junit.compile


def test_csharp_gets_dotnets_implicit_usings_on_its_own_line_numbers() -> None:
    from sandboxd.adapters.sandboxfusion_csharp import IMPLICIT_USINGS

    code = "class P { static void Main() { Console.Write(1); } }"
    source = prepare_source("csharp", code).splitlines()
    assert source[: len(IMPLICIT_USINGS)] == [f"using {u};" for u in IMPLICIT_USINGS]
    assert source[len(IMPLICIT_USINGS) :] == ["#line 1", code]
    # #define and #undef must stay before any token: the usings go after them.
    defined = prepare_source("csharp", "// c\n#define A\n\n#undef B\nclass P {}").splitlines()
    assert defined[:4] == ["// c", "#define A", "", "#undef B"]
    assert defined[4] == "using System;" and defined[-2:] == ["#line 5", "class P {}"]
    # A file of nothing but a #define still compiles as one.
    assert prepare_source("csharp", "#define A").splitlines()[0] == "#define A"


def test_csharp_compiles_with_debug_and_the_assert_entry() -> None:
    from sandboxd.adapters.sandboxfusion_csharp import ENTRY_FILE

    csharp = LANGUAGES["csharp"]
    assert dict(csharp.extra).keys() == {ENTRY_FILE}
    for flag in ("-d:DEBUG", "-d:TRACE", "-main:SandboxdEntry", ENTRY_FILE):
        assert flag in csharp.run
    assert "Environment.Exit(134)" in dict(csharp.extra)[ENTRY_FILE]


def test_go_test_starts_from_the_image_build_cache_and_jest_reports_json() -> None:
    from sandboxd.images.codejudge import GO_CACHE_SEED, JEST_REPORTER_PATH

    go_test = LANGUAGES["go_test"].run
    # The cache is copied to where Go looks under the request's HOME, never shared.
    assert f'cp -r {GO_CACHE_SEED} "$HOME/.cache/go-build"' in go_test and "GOCACHE" not in go_test
    assert go_test.endswith("go test main_test.go")
    jest = LANGUAGES["jest"].run
    assert f'"testResultsProcessor": "{JEST_REPORTER_PATH}"' in jest and jest.startswith("FORCE_COLOR=0 ")
