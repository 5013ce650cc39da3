# ruff: noqa: E501  (the programs under test are data, kept one per line)
"""C# through ``sandboxd run-code`` grades as SandboxFusion's ``dotnet run``
does, on the real engine and the code-judge image (Mono): a failed
``Debug.Assert`` fails the program with the message on stderr (MultiPL-E's C#
tests are Debug.Assert calls: a wrong answer must never pass), implicit usings
let code without ``using System;`` compile, and the compiler adds nothing to
the program's stdout."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import docker
import pytest
import pytest_asyncio

from tests.integration.runcode_endpoint import judge_endpoint

pytestmark = [pytest.mark.docker, pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(180)]

# MultiPL-E's HumanEval/0 in C# (as SandboxFusion's samples hold it): the
# prompt, a body, then its tests.
PROMPT = """using System;
using System.Numerics;
using System.Diagnostics;
using System.Collections.Generic;
using System.Linq;
using System.Text;
using System.Security.Cryptography;
class Problem {
    public static bool HasCloseElements(List<float> numbers, float threshold) {
"""
TESTS = """    }
    public static void Main(string[] args) {
    Debug.Assert(HasCloseElements((new List<float>(new float[]{(float)1.0f, (float)2.0f, (float)3.9f, (float)4.0f, (float)5.0f, (float)2.2f})), (0.3f)) == (true));
    Debug.Assert(HasCloseElements((new List<float>(new float[]{(float)1.0f, (float)2.0f, (float)3.9f, (float)4.0f, (float)5.0f, (float)2.2f})), (0.05f)) == (false));
    Debug.Assert(HasCloseElements((new List<float>(new float[]{(float)1.0f, (float)2.0f, (float)5.9f, (float)4.0f, (float)5.0f})), (0.95f)) == (true));
    Debug.Assert(HasCloseElements((new List<float>(new float[]{(float)1.0f, (float)2.0f, (float)5.9f, (float)4.0f, (float)5.0f})), (0.8f)) == (false));
    Debug.Assert(HasCloseElements((new List<float>(new float[]{(float)1.0f, (float)2.0f, (float)3.0f, (float)4.0f, (float)5.0f, (float)2.0f})), (0.1f)) == (true));
    Debug.Assert(HasCloseElements((new List<float>(new float[]{(float)1.1f, (float)2.2f, (float)3.1f, (float)4.1f, (float)5.1f})), (1.0f)) == (true));
    Debug.Assert(HasCloseElements((new List<float>(new float[]{(float)1.1f, (float)2.2f, (float)3.1f, (float)4.1f, (float)5.1f})), (0.5f)) == (false));
    }

}
"""
RIGHT = """        for (int i = 0; i < numbers.Count; i++)
            for (int j = i + 1; j < numbers.Count; j++)
                if (Math.Abs(numbers[i] - numbers[j]) < threshold) return true;
        return false;
"""
WRONG = "        return false;\n"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def endpoint(
    tmp_path_factory: pytest.TempPathFactory, engine: docker.DockerClient
) -> AsyncIterator[str]:
    async with judge_endpoint(
        tmp_path_factory.mktemp("csharp"), engine, "csharp", reserve=1, max_size=4
    ) as url:
        yield url


async def _run(url: str, code: str, **extra: Any) -> dict[str, Any]:
    body = {"code": code, "language": "csharp", "run_timeout": 20, **extra}
    async with aiohttp.ClientSession() as http, http.post(f"{url}/run_code", json=body) as r:
        assert r.status == 200, await r.text()
        answer: dict[str, Any] = await r.json()
    return answer


async def test_multiple_wrong_answer_fails_right_one_passes(endpoint: str) -> None:
    wrong = await _run(endpoint, PROMPT + WRONG + TESTS)
    assert wrong["status"] == "Failed", wrong
    assert wrong["run_result"]["return_code"] == 134, wrong
    assert "Assertion failed." in wrong["run_result"]["stderr"], wrong
    right = await _run(endpoint, PROMPT + RIGHT + TESTS)
    assert right["status"] == "Success", right
    assert right["run_result"]["stdout"] == "", right


async def test_failed_assert_ends_the_program(endpoint: str) -> None:
    code = """using System.Diagnostics;
class P { static void Main() { System.Console.WriteLine("before"); Debug.Assert(1 == 2, "one is not two", "details"); System.Console.WriteLine("after"); } }"""
    r = await _run(endpoint, code)
    assert r["status"] == "Failed", r
    run = r["run_result"]
    assert run["stdout"] == "before\n", r
    assert "one is not two" in run["stderr"] and "details" in run["stderr"], r


async def test_trace_assert_fails_too_and_true_asserts_pass(endpoint: str) -> None:
    failed = await _run(
        endpoint, 'class P { static void Main() { System.Diagnostics.Trace.Assert(false, "traced"); } }'
    )
    assert failed["status"] == "Failed" and "traced" in failed["run_result"]["stderr"], failed
    passed = await _run(
        endpoint,
        'class P { static void Main() { System.Diagnostics.Debug.Assert(2 > 1); System.Console.Write("ok"); } }',
    )
    assert passed["status"] == "Success" and passed["run_result"]["stdout"] == "ok", passed


async def test_exit_code_exception_and_args_main(endpoint: str) -> None:
    code = await _run(endpoint, "class P { static int Main(string[] a) { return a.Length + 3; } }")
    assert code["status"] == "Failed" and code["run_result"]["return_code"] == 3, code
    thrown = await _run(
        endpoint, 'class P { static void Main() { throw new System.InvalidOperationException("boom"); } }'
    )
    assert thrown["status"] == "Failed", thrown
    assert "InvalidOperationException: boom" in thrown["run_result"]["stderr"], thrown
    assert "TargetInvocationException" not in thrown["run_result"]["stderr"], thrown


async def test_implicit_usings_and_clean_stdout(endpoint: str) -> None:
    # No using at all, a warning-worthy unused variable, and the code's own
    # usings meeting the implicit ones: stdout is the program's alone.
    code = """using System.Linq;
public class Program {
    public static void Main(string[] args) {
        int unused;
        var xs = new List<int> { 1, 2, 3 };
        Console.WriteLine(xs.Sum() + Convert.ToInt32(Console.ReadLine()));
        File.WriteAllText("o.txt", "x");
    }
}"""
    r = await _run(endpoint, code, stdin="10")
    assert r["status"] == "Success", r
    assert r["run_result"]["stdout"] == "16\n", r


async def test_define_at_top_and_line_numbers_kept(endpoint: str) -> None:
    defined = await _run(
        endpoint,
        '#define FAST\n// first\nclass P { static void Main() {\n#if FAST\nConsole.Write("fast");\n#endif\n} }',
    )
    assert defined["status"] == "Success" and defined["run_result"]["stdout"] == "fast", defined
    broken = await _run(endpoint, 'class P {\n  static void Main() {\n    int x = "s";\n  }\n}')
    assert broken["status"] == "Failed", broken
    assert "Program.cs(3," in broken["run_result"]["stderr"], broken
