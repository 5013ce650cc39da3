"""slime's own sandbox helpers (slime is not on PyPI) run against
sandboxd.adapters.slime on the real engine.

``SlimeSandbox``, ``exec_and_wait`` and ``_await_done_marker`` below are
copied from THUDM/slime ``slime/agent/sandbox.py`` (Apache-2.0, commit
624b824a) with one change: the marker poll's pause is ``_POLL_SECONDS``
instead of 5 s, so a test takes a second rather than many. The call shapes
are theirs: a launcher script written under /tmp as ``user``, a guarded
``setsid`` spawn, then ``test -f && cat`` polls of a marker file.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Protocol, runtime_checkable

import pytest

from sandboxd import errors
from sandboxd.adapters.slime import ExecOutput, Sandbox
from sandboxd.client import AsyncClient
from tests.integration.conftest import poll

pytestmark = [pytest.mark.docker, pytest.mark.timeout(120)]

ExecResult = tuple[int, str, str]
FileContent = str | bytes | Path
_POLL_SECONDS = 0.2


@runtime_checkable
class SlimeSandbox(Protocol):
    """slime's ``Sandbox`` Protocol, verbatim."""

    sandbox_id: str

    async def __aenter__(self) -> SlimeSandbox: ...

    async def __aexit__(self, exc_type, exc, tb) -> None: ...  # type: ignore[no-untyped-def]

    async def exec(
        self,
        cmd: str,
        *,
        user: str = "root",
        env: dict[str, str] | None = None,
        timeout: int = 120,
        check: bool = False,
        idempotent: bool = True,
    ) -> ExecResult: ...

    async def write_file(self, sandbox_path: str, content: FileContent, *, user: str = "root") -> None: ...

    async def read_file(self, sandbox_path: str, *, user: str = "root") -> str: ...


EXIT_TIME_BUDGET_EXCEEDED = -1


async def _await_done_marker(sb: SlimeSandbox, done_file: str, *, user: str, time_budget_sec: int) -> int:
    deadline = time.time() + time_budget_sec
    while time.time() < deadline:
        await asyncio.sleep(_POLL_SECONDS)
        ec, out, _ = await sb.exec(
            f"test -f {done_file} && cat {done_file}", user=user, timeout=15, check=False
        )
        if ec == 0 and (out or "").strip():
            return int(out.strip())
    return EXIT_TIME_BUDGET_EXCEEDED


async def exec_and_wait(
    sb: SlimeSandbox,
    *,
    cmd: str,
    time_budget_sec: int,
    tag: str,
    user: str = "root",
    env: dict[str, str] | None = None,
    workdir: str | None = None,
    out_file: str | None = None,
    want_output: bool = False,
) -> tuple[int, str]:
    out_file = out_file or f"/tmp/.{tag}.out"
    done_file = f"/tmp/.{tag}.done"
    launcher = f"/tmp/.{tag}.sh"
    lock_dir = f"/tmp/.{tag}.spawned"
    prefix = f"cd {workdir}\nexport HOME=/home/{user}\n" if workdir else ""
    launcher_body = f"#!/bin/bash\n{prefix}{cmd}\necho $? > {done_file}\n"
    await sb.write_file(launcher, launcher_body, user=user)
    await sb.exec(
        f"rm -rf {lock_dir}; rm -f {out_file} {done_file}",
        user=user,
        timeout=30,
        check=True,
        idempotent=True,
    )
    await sb.exec(
        f"chmod +x {launcher}; "
        f"mkdir {lock_dir} 2>/dev/null || exit 0; "
        f"setsid bash {launcher} < /dev/null > {out_file} 2>&1 &",
        user=user,
        env=env,
        timeout=30,
        check=True,
        idempotent=True,
    )
    exit_code = await _await_done_marker(sb, done_file, user=user, time_budget_sec=time_budget_sec)
    if exit_code == 0 and not want_output:
        return exit_code, ""
    if want_output:
        return exit_code, await sb.read_file(out_file, user=user)
    _, tail, _ = await sb.exec(f"tail -c 512 {out_file} 2>/dev/null", user=user, timeout=15, check=False)
    return exit_code, tail or ""


# -- the tests ----------------------------------------------------------------


async def test_slimes_exec_and_wait_runs_unchanged(client: AsyncClient, pool: str) -> None:
    async with Sandbox(client, pool, labels={"run": "slime"}) as sb:
        assert isinstance(sb, SlimeSandbox) and sb.sandbox_id
        code, output = await exec_and_wait(
            sb, cmd="id -u; echo built; echo warn >&2", time_budget_sec=60, tag="build", want_output=True
        )
        assert (code, output) == (0, "0\nbuilt\nwarn\n"), "as root, output and marker under /tmp"
        code, tail = await exec_and_wait(sb, cmd="echo partial; (exit 7)", time_budget_sec=60, tag="fail")
        assert (code, tail) == (7, "partial\n")
        # The same tag again: the previous run's marker and lock are cleared first.
        code, _ = await exec_and_wait(sb, cmd="true", time_budget_sec=60, tag="fail")
        assert code == 0
        # As the sandbox's own user, in a working directory, with an env.
        code, output = await exec_and_wait(
            sb,
            cmd='echo "$X $(id -u) $(pwd)"',
            time_budget_sec=60,
            tag="user",
            user="",
            env={"X": "x1"},
            workdir="/workspace",
            want_output=True,
        )
        _, uid, _ = await sb.exec("id -u", user="", timeout=15)
        uid = uid.strip()
        assert (code, output) == (0, f"x1 {uid} /workspace\n") and uid != "1000"
        # A command that outlives its budget: slime's own sentinel.
        code, _ = await exec_and_wait(sb, cmd="sleep 30", time_budget_sec=1, tag="slow")
        assert code == EXIT_TIME_BUDGET_EXCEEDED


async def test_root_has_no_privilege_beyond_the_sandbox(client: AsyncClient, pool: str) -> None:
    async with Sandbox(client, pool) as sb:
        code, out, _ = await sb.exec("grep -E '^(Uid|CapEff|CapPrm|CapBnd|NoNewPrivs)' /proc/self/status")
        fields = dict(line.split(":\t", 1) for line in out.strip().splitlines())
        assert code == 0 and fields["Uid"].split()[0] == "0"
        assert fields["CapEff"] == fields["CapPrm"] == fields["CapBnd"] == "0000000000000000"
        assert fields["NoNewPrivs"] == "1"
        # Root may not change what the sandbox's user owns, nor the image.
        await sb.write_file("/workspace/users.txt", "u", user="")
        code, _, err = await sb.exec("echo x >> /workspace/users.txt")
        assert code != 0 and "Permission denied" in err
        code, _, err = await sb.exec("chmod 777 /workspace/users.txt")
        assert code != 0 and "Operation not permitted" in err
        code, _, err = await sb.exec("touch /etc/x")
        assert code != 0 and "Read-only file system" in err
        code, _, _ = await sb.exec(
            "python3 -c 'import socket; socket.create_connection((\"1.1.1.1\", 53), 2)'"
        )
        assert code != 0, "no network"
        # Root owns what it writes; the sandbox's user cannot change it.
        await sb.write_file("/tmp/root-owned", "r")
        code, out, _ = await sb.exec("stat -c %u /tmp/root-owned; id -u")
        assert out.split() == ["0", "0"]
        code, _, err = await sb.exec("echo x >> /tmp/root-owned", user="")
        assert code != 0 and "Permission denied" in err
        await sb.write_file("/tmp/mine", b"m", user="")
        assert await sb.read_file("/tmp/mine", user="") == "m"


async def test_outcomes_timeouts_and_files(client: AsyncClient, pool: str, tmp_path: Path) -> None:
    async with Sandbox(client, pool) as sb:
        out = await sb.exec("sleep 300 & sleep 301; echo never", timeout=1)
        assert isinstance(out, ExecOutput) and out.outcome == "TIMED_OUT" and out.exit_code == -1

        async def sleepers_gone() -> bool:
            _, ps, _ = await sb.exec("ps -eo args= | grep -c '^sleep 30' || true")
            return ps.strip() == "0"

        await poll(sleepers_gone, timeout=10, what="root's process tree, background child too, killed")
        with pytest.raises(RuntimeError, match="TIMED_OUT"):
            await sb.exec("sleep 5", timeout=1, check=True)
        host = tmp_path / "payload.bin"
        host.write_bytes(bytes(range(256)))
        await sb.write_file("/tmp/payload.bin", host)
        _, out_text, _ = await sb.exec("od -An -tx1 /tmp/payload.bin | wc -w")
        assert out_text.strip() == "256"
        assert await sb.read_file("/tmp/nope") == ""
        assert await sb.read_file("/etc/hostname") == "sandbox\n", "image files are read by cat"
        assert await sb.read_file("/etc/nope") == ""
        with pytest.raises(errors.InvalidArgument, match="escapes"):
            await sb.write_file("/etc/x", "x")


async def test_no_wrapper_line_reaches_stderr(client: AsyncClient, pool: str) -> None:
    async with Sandbox(client, pool) as sb:
        for user in ("root", ""):
            code, out, err = await sb.exec("if then fi", user=user)
            assert code == 2 and out == ""
            assert "syntax error" in err
            for wrapper in ("SANDBOXD", "sandboxd", "( cd", "exec bash", "eval"):
                assert wrapper not in err, (user, err)
            code, _, err = await sb.exec("cd /nonexistent", user=user)
            assert code == 1 and err.startswith("bash: line 1: cd: /nonexistent"), err
