"""Command lengths over the API server's exec stream: the longest shell
command the API takes (1 MiB) runs one-shot, though Kubernetes carries an
exec's arguments in its request URL (the script goes on stdin instead)."""

from __future__ import annotations

import pytest

from sandboxd.backends.base import ExecOutcome, ExecSpec
from sandboxd.backends.kubernetes import KubernetesBackend
from sandboxd.backends.shell import SCRIPT_ON_STDIN
from sandboxd.core import validation as v
from tests.kube.test_exec import run, sandbox

pytestmark = [pytest.mark.kube, pytest.mark.timeout(120)]

__all__ = ["sandbox"]  # the fixture, shared with test_exec


def _command_of(size: int) -> str:
    head = "echo start; x=$(( 6 * 7 ))\n"
    tail = '\necho "end $x"\n'
    command = head + "#" + "é" * ((size - len(head) - len(tail) - 2) // 2)
    command += "p" * (size - len(command.encode()) - len(tail) - 1) + "\n" + tail
    assert len(command.encode()) == size
    return command


@pytest.mark.parametrize("size", [100, SCRIPT_ON_STDIN, SCRIPT_ON_STDIN + 1, 512 << 10, v.MAX_COMMAND])
async def test_commands_up_to_the_limit_run_one_shot(
    sandbox: tuple[KubernetesBackend, str], size: int
) -> None:
    backend, handle = sandbox
    out, err, result = await run(backend, handle, ExecSpec(shell=_command_of(size), cwd="/tmp", timeout=60))
    assert (result.outcome, result.exit_code, err) == (ExecOutcome.EXITED, 0, b""), (size, err[-300:])
    assert out == b"start\nend 42\n"


async def test_the_largest_environment_with_the_longest_command(
    sandbox: tuple[KubernetesBackend, str],
) -> None:
    backend, handle = sandbox
    env = {f"E{i}": "w" * (120 << 10) for i in range(4)}
    v.env("env", env)
    command = _command_of(v.MAX_COMMAND - 40) + "printenv | grep -c '^E[0-3]=w'\n"
    out, err, result = await run(backend, handle, ExecSpec(shell=command, cwd="/tmp", env=env, timeout=60))
    assert (result.outcome, result.exit_code, err) == (ExecOutcome.EXITED, 0, b""), err[-300:]
    assert out == b"start\nend 42\n4\n"
