"""The reset step's process fingerprint (sandboxd.sandbox_reset), run here on
this host's kernel: it stays the same while a process's program is written
back from the page cache (an image unpacked just before its sandbox started),
and changes when the process's code is overwritten through /proc/<pid>/mem."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandboxd.sandbox_reset import STEP_LIB

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def step() -> dict[str, Any]:
    """The step's functions, as the step runs them."""
    namespace: dict[str, Any] = {}
    exec(compile(STEP_LIB, "<step>", "exec"), namespace)
    return namespace


@pytest.fixture
def fresh_program(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A process whose program was written a moment ago (its file pages still dirty)."""
    program = tmp_path / "sleeper"
    with open(shutil.which("sleep") or "/bin/sleep", "rb") as src, open(program, "wb") as dst:
        shutil.copyfileobj(src, dst)
    program.chmod(0o755)
    proc = subprocess.Popen([str(program), "600"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _text_start(pid: int, program: str) -> int:
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        fields = line.split()
        if "x" in fields[1] and fields[-1] == program:
            return int(fields[0].split("-")[0], 16)
    raise AssertionError(f"no executable mapping of {program} in {pid}")


def _wait_mapped(pid: int, program: str, seconds: float = 10.0) -> None:
    """Until the child has exec'd ``program`` (its maps name it) and sleeps:
    before that its loader may still be mapping libraries, which changes the
    executable mappings the fingerprint covers."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
            if program in Path(f"/proc/{pid}/maps").read_text() and state == "S":
                return
    raise AssertionError(f"{program} did not start in {seconds:g}s")


def test_writeback_of_the_program_leaves_the_fingerprint(
    step: dict[str, Any], fresh_program: subprocess.Popen[bytes]
) -> None:
    pid, program = fresh_program.pid, str(fresh_program.args[0])  # type: ignore[index]
    _wait_mapped(pid, program)
    before = step["fingerprint"](pid)
    os.sync()
    assert step["fingerprint"](pid) == before


def test_code_overwritten_through_proc_mem_changes_the_fingerprint(
    step: dict[str, Any], fresh_program: subprocess.Popen[bytes]
) -> None:
    pid, program = fresh_program.pid, str(fresh_program.args[0])  # type: ignore[index]
    _wait_mapped(pid, program)
    before = step["fingerprint"](pid)
    start = _text_start(pid, program)
    with open(f"/proc/{pid}/mem", "r+b", buffering=0) as mem:
        mem.seek(start + 64)
        same = mem.read(1)
        mem.seek(start + 64)
        # The same byte back: nothing runs differently, yet the page is a copy now.
        mem.write(same)
    assert step["fingerprint"](pid) != before
