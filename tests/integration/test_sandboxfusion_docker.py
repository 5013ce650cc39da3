# ruff: noqa: E501  (the programs under test are data, kept one per line)
"""``sandboxd run-code`` against SandboxFusion's own PyPI client, on the real
engine and the code-judge image: every language's compile error, runtime
error, time-out, stdin and files; 422s, ping, SandboxError on a lost sandbox,
504 on a queue wait past the budget, and the isolation of reused sandboxes."""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import docker
import pytest
import sandbox_fusion
from aiohttp import web
from sandbox_fusion import RunCodeRequest, run_code_async

from sandboxd.adapters.sandboxfusion import CAPTURE_BYTES, POOL_MEMORY_MB, WARM, ensure_pool, make_app
from sandboxd.adapters.sandboxfusion_langs import LANGUAGES
from sandboxd.app import App
from sandboxd.backends.base import LABEL_SANDBOX
from sandboxd.client import AsyncClient
from sandboxd.images.codejudge import UNPACKAGED
from tests.integration.conftest import poll

pytestmark = [pytest.mark.docker, pytest.mark.timeout(240)]


@pytest.fixture(scope="session")
def judge_image(image: str) -> str:
    from sandboxd.images.build import ImageBuildError
    from sandboxd.images.codejudge import ensure_code_judge_image

    try:
        return ensure_code_judge_image(log=lambda _: None)
    except ImageBuildError as e:
        # Never a fallback: the language tests would then prove nothing.
        pytest.fail(f"the code-judge image does not build (scripts/setup.sh test builds it): {e}")


@pytest.fixture(scope="session")
def tools(engine: docker.DockerClient, judge_image: str) -> set[str]:
    wanted = " ".join(sorted({r.tool for r in LANGUAGES.values()}))
    script = f"for t in {wanted}; do command -v $t >/dev/null && echo $t; done; true"
    out = engine.containers.run(judge_image, ["bash", "-c", script], remove=True, network_mode="none")
    return set(out.decode().split())


@contextlib.asynccontextmanager
async def serving(
    client: AsyncClient, pool: str, **kwargs: Any
) -> AsyncIterator[tuple[str, web.Application]]:
    """The run-code app on a free port; SandboxFusion's client pointed at it."""
    wapp = make_app(client, pool, **kwargs)
    runner = web.AppRunner(wapp)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    url = f"http://127.0.0.1:{port}"
    sandbox_fusion.set_endpoint(url)
    try:
        yield url, wapp
    finally:
        await runner.cleanup()


@pytest.fixture
async def judge_pool(client: AsyncClient, judge_image: str) -> str:
    # As `sandboxd run-code --image` makes it: memory for verl's default memory_limit_MB.
    await ensure_pool(client, "judge", judge_image, min_ready=2, max_size=8)
    return "judge"


@pytest.fixture
async def endpoint(client: AsyncClient, judge_pool: str) -> AsyncIterator[tuple[str, web.Application]]:
    # A test sends a language's four programs at once, with 60 s limits: past the host's
    # CPUs they queue for a run slot, within this deadline (never a 504 here).
    async with serving(client, judge_pool, acquire_timeout=180.0) as served:
        yield served


@dataclass(frozen=True)
class Case:
    """One language's programs: ``io`` reads stdin "S" and in.txt "D", prints, writes out.txt."""

    io: str
    io_expect: str
    error: str
    bad: str
    loop: str


_B64 = base64.b64encode
CASES: dict[str, Case] = {
    "python": Case(
        "import sys\nprint(sys.stdin.read().strip() + open('in.txt').read().strip())\nopen('out.txt','w').write('ok')",
        "SD",
        "raise SystemExit(3)",
        "def f(:\n",
        "while True: pass",
    ),
    "pytest": Case(
        "def test_io():\n    assert open('in.txt').read().strip() == 'D'\n    open('out.txt','w').write('ok')\n",
        "1 passed",
        "def test_x():\n    assert 1 == 2\n",
        "def test_x(:\n",
        "def test_x():\n    while True: pass\n",
    ),
    "cpp": Case(
        "#include <iostream>\n#include <fstream>\n#include <string>\nint main(){std::string s,d;"
        'std::getline(std::cin,s);std::ifstream f("in.txt");std::getline(f,d);std::cout<<s<<d<<std::endl;'
        'std::ofstream o("out.txt");o<<"ok";return 0;}',
        "SD",
        "int main(){return 3;}",
        "int main(){return x;}",
        "int main(){volatile int x=0;while(1){x++;}}",
    ),
    "go": Case(
        'package main\nimport ("bufio";"fmt";"os";"strings")\nfunc main(){r:=bufio.NewReader(os.Stdin);'
        "s,_:=r.ReadString('\\n');d,_:=os.ReadFile(\"in.txt\");"
        'fmt.Println(strings.TrimSpace(s)+strings.TrimSpace(string(d)));os.WriteFile("out.txt",[]byte("ok"),0644)}',
        "SD",
        'package main\nimport "os"\nfunc main(){os.Exit(3)}',
        "package main\nfunc main(){ x }",
        "package main\nfunc main(){for{}}",
    ),
    "go_test": Case(
        'package main\nimport ("os";"testing")\nfunc TestIO(t *testing.T){d,_:=os.ReadFile("in.txt");'
        'if string(d)!="D"{t.Fatal("bad")};os.WriteFile("out.txt",[]byte("ok"),0644)}',
        "ok",
        'package main\nimport "testing"\nfunc TestX(t *testing.T){t.Fatal("boom")}',
        "package main\nfunc TestX( {",
        'package main\nimport "testing"\nfunc TestX(t *testing.T){for{}}',
    ),
    "java": Case(
        "import java.util.*;import java.nio.file.*;\npublic class Main{public static void main(String[] a)"
        ' throws Exception{String s=new Scanner(System.in).nextLine();String d=Files.readString(Path.of("in.txt"))'
        '.trim();System.out.println(s+d);Files.writeString(Path.of("out.txt"),"ok");}}',
        "SD",
        "public class Main{public static void main(String[] a){System.exit(3);}}",
        "public class Main{ void f( }",
        "public class Main{public static void main(String[] a){while(true){}}}",
    ),
    "junit": Case(
        "import org.junit.jupiter.api.Test;\nimport static org.junit.jupiter.api.Assertions.*;\n"
        "import java.nio.file.*;\npublic class MainTest{ @Test void io() throws Exception {"
        ' assertEquals("D", Files.readString(Path.of("in.txt")).trim());'
        ' Files.writeString(Path.of("out.txt"),"ok"); } }',
        "1 tests successful",
        "import org.junit.jupiter.api.Test;\nimport static org.junit.jupiter.api.Assertions.*;\n"
        "public class MainTest{ @Test void x() { assertEquals(1, 2); } }",
        "public class MainTest{ void f( }",
        "import org.junit.jupiter.api.Test;\npublic class MainTest{ @Test void x() { while(true){} } }",
    ),
    "nodejs": Case(
        "const fs=require('fs');const s=fs.readFileSync(0,'utf8').trim();"
        "console.log(s+fs.readFileSync('in.txt','utf8').trim());fs.writeFileSync('out.txt','ok');",
        "SD",
        "process.exit(3)",
        "function (",
        "while(true){}",
    ),
    "typescript": Case(
        "import * as fs from 'fs';\nconst s: string = fs.readFileSync(0,'utf8').trim();\n"
        "console.log(s + fs.readFileSync('in.txt','utf8').trim());\nfs.writeFileSync('out.txt','ok');",
        "SD",
        "process.exit(3);",
        "let x: = ;",
        "while (true) {}",
    ),
    "jest": Case(
        "import * as fs from 'fs';\ntest('io', () => { expect(fs.readFileSync('in.txt','utf8').trim()).toBe('D');"
        " fs.writeFileSync('out.txt','ok'); });",
        "1 passed",
        "test('x', () => { expect(1).toBe(2); });",
        "test('x', () => {",
        "test('x', () => { while (true) {} });",
    ),
    "php": Case(
        "<?php $s=trim(fgets(STDIN)); echo $s.trim(file_get_contents('in.txt')).\"\\n\";"
        " file_put_contents('out.txt','ok');",
        "SD",
        "<?php exit(3);",
        "<?php function ( ",
        "<?php while(true){}",
    ),
    "rust": Case(
        "use std::io::Read;\nfn main(){let mut s=String::new();std::io::stdin().read_to_string(&mut s).unwrap();"
        'let d=std::fs::read_to_string("in.txt").unwrap();println!("{}{}",s.trim(),d.trim());'
        'std::fs::write("out.txt","ok").unwrap();}',
        "SD",
        "fn main(){std::process::exit(3);}",
        'fn main(){ let x: i32 = "a"; }',
        "fn main(){loop{}}",
    ),
    "bash": Case(
        'read s; d=$(cat in.txt); echo "$s$d"; echo -n ok > out.txt',
        "SD",
        "exit 3",
        "if then fi (",
        "while true; do :; done",
    ),
    "csharp": Case(
        "using System; using System.IO;\nclass Program{static void Main(){var s=Console.ReadLine().Trim();"
        'Console.WriteLine(s+File.ReadAllText("in.txt").Trim());File.WriteAllText("out.txt","ok");}}',
        "SD",
        "class Program{static int Main(){return 3;}}",
        "class Program{ void f( }",
        "class Program{static void Main(){while(true){}}}",
    ),
    "lua": Case(
        'local s=io.read("l"); local f=io.open("in.txt"); local d=f:read("a"):gsub("%s+$",""); f:close();'
        ' print(s..d); local o=io.open("out.txt","w"); o:write("ok"); o:close()',
        "SD",
        "os.exit(3)",
        "function (",
        "while true do end",
    ),
    "R": Case(
        's <- readLines(file("stdin"), n=1); d <- trimws(readLines("in.txt", warn=FALSE));'
        ' cat(paste0(s, d), "\\n", sep=""); cat("ok", file="out.txt")',
        "SD",
        "quit(status=3)",
        "f <- function( {",
        "repeat {}",
    ),
    "perl": Case(
        "my $s=<STDIN>; chomp $s; open(my $f,'<','in.txt'); my $d=<$f>; chomp $d; print \"$s$d\\n\";"
        " open(my $o,'>','out.txt'); print $o 'ok'; close $o;",
        "SD",
        "exit 3;",
        "sub {",
        "while(1){}",
    ),
    "D_ut": Case(
        'import std.file; import std.string;\nunittest { assert(readText("in.txt").strip == "D");'
        ' std.file.write("out.txt", "ok"); }\nvoid main(){}',
        "passed",
        "unittest { assert(1 == 2); }\nvoid main(){}",
        'void main(){ int x = "a"; }',
        "unittest { while(true){} }\nvoid main(){}",
    ),
    "ruby": Case(
        "s=STDIN.gets.strip; puts s+File.read('in.txt').strip; File.write('out.txt','ok')",
        "SD",
        "exit 3",
        "def f(",
        "loop do end",
    ),
    "scala": Case(
        "import scala.io.Source\nobject Main { def main(args: Array[String]): Unit = {"
        ' val s = scala.io.StdIn.readLine().trim; println(s + Source.fromFile("in.txt").mkString.trim);'
        ' val o = new java.io.PrintWriter("out.txt"); o.write("ok"); o.close() } }',
        "SD",
        "object Main { def main(args: Array[String]): Unit = { sys.exit(3) } }",
        "object Main { def f( }",
        "object Main { def main(args: Array[String]): Unit = { while(true){} } }",
    ),
    "kotlin_script": Case(
        'val s = readLine()!!.trim()\nprintln(s + java.io.File("in.txt").readText().trim())\n'
        'java.io.File("out.txt").writeText("ok")',
        "SD",
        "kotlin.system.exitProcess(3)",
        "fun f( {",
        "while (true) {}",
    ),
    "sql": Case(
        "SELECT 'S' || trim(readfile('in.txt')); SELECT writefile('out.txt', 'ok');",
        "SD",
        "SELECT * FROM missing_table;",
        "SELEC 1;",
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT count(*) FROM c;",
    ),
    "verilog": Case(
        'module tb; integer fd; reg [7:0] c; initial begin fd = $fopen("in.txt","r"); c = $fgetc(fd);'
        ' $display("S%c", c); fd = $fopen("out.txt","w"); $fwrite(fd, "ok"); $fclose(fd); $finish; end endmodule',
        "SD",
        'module tb; initial begin $fatal(1, "boom"); end endmodule',
        "module tb; initial begin x = ; end endmodule",
        "module tb; initial begin forever #1; end endmodule",
    ),
    "racket": Case(
        '#lang racket\n(define s (string-trim (read-line)))\n(displayln (string-append s (string-trim (file->string "in.txt"))))\n'
        '(with-output-to-file "out.txt" (lambda () (display "ok")) #:exists \'replace)',
        "SD",
        "#lang racket\n(exit 3)",
        "#lang racket\n(define (f",
        "#lang racket\n(let loop () (loop))",
    ),
    "julia": Case(
        's = strip(readline()); println(s * strip(read("in.txt", String))); write("out.txt", "ok")',
        "SD",
        "exit(3)",
        "function f(",
        "while true end",
    ),
    "lean": Case(
        'def main : IO Unit := do\n  let s ← (← IO.getStdin).getLine\n  let d ← IO.FS.readFile "in.txt"\n'
        '  IO.println (s.trim ++ d.trim)\n  IO.FS.writeFile "out.txt" "ok"',
        "SD",
        "def main : IO UInt32 := pure 3",
        "def main : IO Unit := (",
        "partial def loop : Nat → Nat := fun n => loop (n + 1)\ndef main : IO Unit := IO.println (loop 0)",
    ),
    "swift": Case(
        'import Foundation\nlet s = readLine()!\nlet d = try! String(contentsOfFile: "in.txt")'
        '\nprint(s + d.trimmingCharacters(in: .whitespacesAndNewlines))\ntry! "ok".write(toFile: "out.txt",'
        " atomically: true, encoding: .utf8)",
        "SD",
        "import Foundation\nexit(3)",
        "let x: Int = ",
        "while true {}",
    ),
}
# SandboxFusion runs these through a compile step that fills compile_result.
COMPILED = {lang for lang, runner in LANGUAGES.items() if runner.compile is not None}


async def _run(language: str, code: str, **kwargs: Any) -> Any:
    request = RunCodeRequest(code=code, language=language, compile_timeout=60, **kwargs)
    return await run_code_async(request, max_attempts=1, client_timeout=180)


@pytest.mark.parametrize("language", sorted(CASES))
async def test_language(language: str, endpoint: tuple[str, web.Application], tools: set[str]) -> None:
    tool = LANGUAGES[language].tool
    if language in UNPACKAGED:
        # Documented as unavailable: every request says so, naming the tool, and runs nothing.
        assert tool not in tools, f"{language} is documented as unavailable, but the image has {tool}"
        # (SandboxFusion's client raises on SandboxError: the body is read here.)
        body = {"code": CASES[language].io, "language": language}
        async with aiohttp.ClientSession() as http, http.post(f"{endpoint[0]}/run_code", json=body) as r:
            assert r.status == 200
            answer = await r.json()
        assert answer["status"] == "SandboxError" and repr(tool) in answer["message"], answer
        assert answer["run_result"] is None and answer["compile_result"] is None, answer
        return
    assert tool in tools, f"the code-judge image lacks {tool} for {language}"
    case = CASES[language]
    io, error, bad, loop = await asyncio.gather(
        _run(
            language,
            case.io,
            stdin="S\n",
            run_timeout=60,
            files={"in.txt": _B64(b"D").decode(), "ignored.txt": None},
            fetch_files=["out.txt", "missing.txt"],
        ),
        _run(language, case.error, run_timeout=60),
        _run(language, case.bad, run_timeout=60),
        _run(language, case.loop, run_timeout=2),
    )
    output = (io.run_result.stdout or "") + (io.run_result.stderr or "")
    assert io.status == "Success", io
    assert case.io_expect in output, io
    assert io.run_result.status == "Finished" and io.run_result.return_code == 0
    assert base64.b64decode(io.files["out.txt"]).strip() == b"ok" and "missing.txt" not in io.files
    assert (io.compile_result is not None) == (language in COMPILED)

    assert error.status == "Failed" and error.run_result.status == "Finished", error
    assert error.run_result.return_code != 0

    assert bad.status == "Failed", bad
    if language in COMPILED:
        assert bad.compile_result.status == "Finished" and bad.compile_result.return_code != 0, bad
        assert bad.run_result is None
    else:
        assert bad.compile_result is None and bad.run_result.return_code != 0, bad

    assert loop.status == "Failed", loop
    assert loop.run_result.status == "TimeLimitExceeded" and loop.run_result.return_code is None, loop


async def test_request_fields_as_sandboxfusion(endpoint: tuple[str, web.Application]) -> None:
    url, _ = endpoint
    async with aiohttp.ClientSession() as http:

        async def post(body: Any) -> tuple[int, Any]:
            async with http.post(f"{url}/run_code", json=body) as r:
                return r.status, await r.json()

        async with http.get(f"{url}/v1/ping") as r:
            assert r.status == 200 and await r.json() == "pong"
        for body in ({"language": "python"}, {"code": "1", "language": "cobol"}, {"code": "1"}, [1],
                     {"code": "1", "language": "python", "run_timeout": "soon"},
                     {"code": "1", "language": "python", "files": {"a": 3}}):  # fmt: skip
            status, answer = await post(body)
            assert status == 422 and answer["detail"], (body, answer)
        async with http.post(f"{url}/run_code", data=b"{not json") as r:
            assert r.status == 422

        hog = "x = bytearray(256 << 20)\nprint(len(x))"
        status, small = await post({"code": hog, "language": "python", "memory_limit_MB": 64})
        assert status == 200 and small["status"] == "Failed", small
        _, unlimited = await post({"code": hog, "language": "python", "memory_limit_MB": -1})
        assert unlimited["status"] == "Success", unlimited
        # verl's default is the pool's own limit; above it is refused, never clamped.
        big = "x = bytearray(768 << 20)\nprint(len(x))"
        _, verl = await post({"code": big, "language": "python", "memory_limit_MB": POOL_MEMORY_MB})
        assert verl["status"] == "Success", verl
        _, above = await post({"code": "print(1)", "language": "python", "memory_limit_MB": 4096})
        assert above["status"] == "SandboxError" and "4096" in above["message"], above
        assert above["run_result"] is None

        _, slow = await post({"code": "int main(){}", "language": "cpp", "compile_timeout": 0.001})
        assert slow["status"] == "Failed" and slow["run_result"] is None, slow
        assert slow["compile_result"]["status"] == "TimeLimitExceeded"

        _, absolute = await post(
            {
                "code": "open('/tmp/abs.txt','w').write('a')",
                "language": "python",
                "fetch_files": ["/tmp/abs.txt"],
            }
        )
        assert absolute["files"] == {"/tmp/abs.txt": _B64(b"a").decode()}, absolute
        assert set(absolute) == {
            "status",
            "message",
            "compile_result",
            "run_result",
            "executor_pod_name",
            "files",
        }


async def test_reused_sandboxes_share_nothing(endpoint: tuple[str, web.Application]) -> None:
    _, wapp = endpoint
    warm = wapp[WARM]
    first = await _run("bash", "echo secret > mine.txt; (setsid sleep 300 >/dev/null 2>&1 &); echo started")
    assert first.status == "Success", first
    # Sequential clean requests are served by the same warm sandbox, once its clean-up is done...
    # The reserve may hold fresh ones too: this waits for the one that served.
    await poll(lambda: warm.idle_used() >= 1, what="the sandbox to be cleaned and kept")
    second = await _run("bash", "ls -A; ps -eo args | grep -c '^sleep 300' || true")
    assert second.run_result.stdout == "main.sh\n0\n", second
    assert warm.reused >= 1
    # ...but one that leaves a file outside its directory destroys its sandbox.
    destroyed = warm.destroyed
    await _run("bash", "echo LEAKED > /tmp/leak; echo LEAKED > /workspace/leak 2>/dev/null; true")
    # The clean-up runs after the answer.
    await poll(lambda: warm.destroyed == destroyed + 1, what="the dirtied sandbox to be destroyed")
    third = await _run("bash", "cat /tmp/leak /workspace/leak 2>&1; ls /tmp")
    assert "LEAKED" not in third.run_result.stdout, third


# Tries to ptrace, open the memory of and signal every process it did not
# start: the sandbox's own shells and main process, and whatever ran before.
_REACH_OUT = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
mine = {os.getpid(), os.getppid()}
seen, reached = 0, []
for p in os.listdir("/proc"):
    if not p.isdigit() or int(p) in mine:
        continue
    seen += 1
    if libc.ptrace(16, int(p), 0, 0) == 0:
        libc.ptrace(17, int(p), 0, 0)
        reached.append(("ptrace", p))
    try:
        open(f"/proc/{p}/mem", "rb").close()
        reached.append(("mem", p))
    except OSError:
        pass
    try:
        os.kill(int(p), 0)
        reached.append(("signal", p))
    except OSError:
        pass
print(seen >= 2, reached)
"""


async def test_reused_sandbox_confines_each_request(endpoint: tuple[str, web.Application]) -> None:
    _, wapp = endpoint
    warm = wapp[WARM]
    reach = await _run("python", _REACH_OUT)
    # Nothing outside the request's own commands can be traced, read or signalled.
    assert reach.status == "Success" and reach.run_result.stdout == "True []\n", reach
    first = await _run("bash", "export LEAKED_ENV=1; echo s > mine.txt; (setsid sleep 300 >/dev/null 2>&1 &)")
    assert first.status == "Success", first
    reused = warm.reused
    # The reserve may hold fresh ones too: this waits for the one that served.
    await poll(lambda: warm.idle_used() >= 1, what="the sandbox to be cleaned and kept")
    second = await _run(
        "bash", "ls -A; ps -eo args | grep -c '^sleep 300' || true; echo ${LEAKED_ENV:-unset}"
    )
    assert second.run_result.stdout == "main.sh\n0\nunset\n", second
    assert warm.reused == reused + 1


async def test_burst_is_served_from_the_reserve(client: AsyncClient, judge_pool: str) -> None:
    async with serving(client, judge_pool, reserve=4) as (_, wapp):
        warm = wapp[WARM]
        await poll(lambda: warm.idle() >= 4, timeout=120, what="the reserve to be prepared")
        pool = await client.get_pool(judge_pool)
        # verl's memory_limit_MB, at or above the pool's limit: served by the pool's own.
        mb = max(pool.spec.limits.memory_bytes >> 20, 1)
        leased, waited = warm.stats.leased, warm.stats.waited
        burst = [_run("python", "print(1)", memory_limit_MB=mb) for _ in range(4)]
        for answer in await asyncio.gather(*burst):
            assert answer.status == "Success" and answer.run_result.stdout == "1\n", answer
        # No request waited for a lease, an inspection or a container start.
        assert (warm.stats.waited, warm.stats.leased) == (waited, leased)
        assert warm.stats.from_reserve == 4
        await poll(lambda: warm.idle() >= 4, timeout=120, what="the sandboxes to be cleaned and kept")
        again = [_run("python", "print(2)", memory_limit_MB=mb) for _ in range(4)]
        for answer in await asyncio.gather(*again):
            assert answer.status == "Success", answer
        assert (warm.stats.waited, warm.stats.leased) == (waited, leased)
        assert warm.stats.reused >= 4


async def test_output_past_the_cap_is_kept_in_part_and_the_program_finishes(
    endpoint: tuple[str, web.Application],
) -> None:
    # More than the cap on both streams, then work after it and its own status.
    code = (
        "import sys\nsys.stdout.write('a' * (3 << 20)); sys.stdout.flush()\n"
        "sys.stderr.write('b' * (2 << 20)); sys.stderr.flush()\n"
        "open('after.txt', 'w').write('ran on')\nsys.exit({})"
    )
    ok, failed = await asyncio.gather(
        _run("python", code.format(0), run_timeout=60, fetch_files=["after.txt"]),
        _run("python", code.format(3), run_timeout=60),
    )
    assert ok.status == "Success" and ok.run_result.status == "Finished", ok.status
    assert ok.run_result.return_code == 0
    assert ok.run_result.stdout == "a" * CAPTURE_BYTES and ok.run_result.stderr == "b" * CAPTURE_BYTES
    assert base64.b64decode(ok.files["after.txt"]) == b"ran on"
    assert failed.status == "Failed" and failed.run_result.status == "Finished", failed.status
    assert failed.run_result.return_code == 3


@pytest.mark.parametrize("how", ["kill", "remove"])
async def test_lost_sandbox_is_sandbox_error(
    app: App, endpoint: tuple[str, web.Application], engine: docker.DockerClient, how: str
) -> None:
    url, wapp = endpoint
    async with aiohttp.ClientSession() as http:
        call = asyncio.ensure_future(
            http.post(f"{url}/run_code", json={"code": "sleep 60", "language": "bash", "run_timeout": 90})
        )
        await poll(lambda: bool(wapp[WARM].in_use()), what="the request to lease a sandbox")
        sandbox_id = wapp[WARM].in_use()[0]
        container = (
            await asyncio.to_thread(
                engine.containers.list, filters={"label": f"{LABEL_SANDBOX}={sandbox_id}"}
            )
        )[0]

        def running() -> bool:
            return any("sleep 60" in " ".join(p) for p in container.top()["Processes"])

        await poll(lambda: asyncio.to_thread(running), what="the program to start")
        if how == "kill":
            await asyncio.to_thread(container.kill)
        else:
            await asyncio.to_thread(container.remove, force=True)
        async with await call as r:
            assert r.status == 200
            answer = await r.json()
    # The service's failure, never the program's: no Failed, no 137.
    assert answer["status"] == "SandboxError", answer
    assert answer["run_result"] is None or answer["run_result"]["status"] == "Error"
    assert "sleep" not in answer["message"].split("sandbox", 1)[0]


async def test_queue_past_budget_answers_504(client: AsyncClient, judge_image: str) -> None:
    await client.create_pool("one", judge_image, min_ready=1, max_size=1)
    async with client.acquire("one", timeout=60), serving(client, "one", acquire_timeout=0.5) as (url, _):
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{url}/run_code", json={"code": "print(1)", "language": "python"}) as r,
        ):
            assert r.status == 504
        with pytest.raises(Exception, match="504"):
            await _run("python", "print(1)")
