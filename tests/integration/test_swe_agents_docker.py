"""SWE-style agents on the real engine: mini-swe-agent's own DefaultAgent
loop (PyPI ``mini-swe-agent``, with its DeterministicModel) driving
sandboxd.adapters.miniswe, and rLLM's sandbox call shapes (rLLM is not on
PyPI: copied from rllm-org/rllm ``rllm/eval/script_evaluator.py``,
``rllm/harnesses/oracle.py`` and ``rllm/sandbox/protocol.py``) on
sandboxd.adapters.rllm."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import pytest

from sandboxd import errors
from sandboxd.adapters.rllm import SandboxdSandbox
from sandboxd.app import App
from sandboxd.backends.uids import DEFAULT_UIDS
from sandboxd.client import Client

pytestmark = [pytest.mark.docker, pytest.mark.timeout(120)]


@pytest.fixture
def minisweagent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """mini-swe-agent (a dev extra: missing, the test fails), imported only once its
    global config is pointed at tmp_path, which it reads on import."""
    monkeypatch.setenv("MSWEA_GLOBAL_CONFIG_DIR", str(tmp_path / "mswea"))
    monkeypatch.setenv("MSWEA_SILENT_STARTUP", "1")
    import minisweagent

    return minisweagent


def _mini_run(address: str, pool: str) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.environments import get_environment
    from minisweagent.models.test_models import DeterministicModel, make_output

    env: Any = get_environment(
        {
            "environment_class": "sandboxd.adapters.miniswe.SandboxdEnvironment",
            "target": address,
            "pool": pool,
            "env": {"GREETING": "hi"},
            "timeout": 5,
        }
    )
    try:
        steps = [
            "printf 'def add(a, b):\\n    return a - b\\n' > calc.py && echo written",
            "cd /tmp && pwd",  # every action is a fresh shell: the next one starts in cwd again
            "pwd; sed -i 's/a - b/a + b/' calc.py && python3 -c 'import calc; print(calc.add(2, 3))'",
            "echo $GREETING; echo oops >&2; exit 4",
            "sleep 30",
            "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && cat calc.py",
        ]
        model = DeterministicModel(
            outputs=[make_output(f"step {i}", [{"command": c}]) for i, c in enumerate(steps)]
        )
        agent = DefaultAgent(
            model,
            env,
            system_template="You fix bugs.",
            instance_template="{{task}}",
            step_limit=10,
            cost_limit=0,
        )
        info = agent.run("fix calc.add")
        direct = env.execute({"command": "ls"}, cwd="/tmp")
        return info, agent.messages, direct
    finally:
        env.cleanup()


async def test_mini_swe_agent_drives_a_sandbox(minisweagent: Any, app: App, pool: str) -> None:
    info, messages, direct = await asyncio.to_thread(_mini_run, app.address, pool)
    assert info["exit_status"] == "Submitted"
    assert info["submission"] == "def add(a, b):\n    return a + b\n"
    observations = [m["content"] for m in messages if m["role"] == "user"][1:]
    assert "<returncode>0</returncode>\n<output>\nwritten\n</output>" in observations[0]
    assert "<output>\n/tmp\n</output>" in observations[1]
    assert "<output>\n/workspace\n5\n</output>" in observations[2]
    assert "<returncode>4</returncode>" in observations[3] and "hi\noops\n" in observations[3]
    timed_out = observations[4]
    assert "<returncode>-1</returncode>" in timed_out
    assert "timed out after 5 seconds" in timed_out and "<exception>" in timed_out
    assert direct["returncode"] == 0 and "calc.py" not in direct["output"]
    for o in observations:
        assert "SANDBOXD" not in o and "sandboxd" not in o


def _mini_template_vars(address: str, pool: str) -> tuple[dict[str, Any], dict[str, Any]]:
    from minisweagent.environments import get_environment

    env: Any = get_environment(
        {
            "environment_class": "sandboxd.adapters.miniswe.SandboxdEnvironment",
            "target": address,
            "pool": pool,
        }
    )
    try:
        return env.get_template_vars(extra=1), env.serialize()
    finally:
        env.cleanup()


async def test_mini_swe_agent_template_vars_describe_the_sandbox(
    minisweagent: Any, app: App, pool: str
) -> None:
    tv, ser = await asyncio.to_thread(_mini_template_vars, app.address, pool)
    assert tv["system"] == "Linux" and tv["node"] == "sandbox" and tv["machine"] and tv["extra"] == 1
    assert tv["pool"] == pool and "token" not in tv
    assert ser["info"]["config"]["environment_type"] == "sandboxd.adapters.miniswe.SandboxdEnvironment"


# -- rLLM ----------------------------------------------------------------------


@runtime_checkable
class RllmSandbox(Protocol):
    """rLLM's ``Sandbox`` Protocol (rllm/sandbox/protocol.py)."""

    def exec(self, command: str, timeout: float | None = None, user: str | None = None) -> str: ...

    def upload_file(self, local_path: str, remote_path: str) -> None: ...

    def upload_dir(self, local_path: str, remote_path: str) -> None: ...

    def close(self) -> None: ...

    def is_alive(self) -> bool: ...


def _safe_exec(sandbox: RllmSandbox, command: str, timeout: float | None = None) -> str:
    """rLLM's helper, verbatim: stderr text on a non-zero exit instead of raising."""
    try:
        return sandbox.exec(command, timeout=timeout)
    except (RuntimeError, subprocess.CalledProcessError) as e:
        return str(e)


def _rllm_evaluate(address: str, pool: str, tests_dir: Path, solution: Path) -> dict[str, Any]:
    """The shape of rLLM's ScriptEvaluator.evaluate and Oracle harness."""
    out: dict[str, Any] = {}
    with Client(address) as client:
        sandbox = SandboxdSandbox("task-42", "python:3.11-slim", pool=pool, client=client)
        assert isinstance(sandbox, RllmSandbox)
        try:
            v_user = None
            with contextlib.suppress(Exception):
                sandbox.exec("mkdir -p /tmp/rllm /tmp/logs/verifier", timeout=10, user=v_user)
            sandbox.upload_dir(str(tests_dir), "/tmp/tests")
            sandbox.upload_file(str(solution), "/tmp/rllm_setup.sh")
            out["oracle"] = sandbox.exec("bash /tmp/rllm_setup.sh", timeout=30, user=v_user)
            try:
                sandbox.exec("chmod +x /tmp/tests/test.sh && /tmp/tests/test.sh", timeout=30, user=v_user)
            except Exception as e:
                out["verifier_error"] = str(e)
            path = "/tmp/logs/verifier/reward.txt"
            check = sandbox.exec(f"test -f {path} && echo yes || echo no", timeout=10, user=v_user).strip()
            out["reward"] = float(sandbox.exec(f"cat {path}", timeout=10).strip()) if check == "yes" else None
            out["safe"] = _safe_exec(sandbox, "echo bad >&2; exit 2")
            try:
                sandbox.exec("sleep 30", timeout=1)
            except RuntimeError as e:
                out["timeout"] = str(e)
            out["alive"] = sandbox.is_alive()
        finally:
            sandbox.close()
        out["alive_after_close"] = sandbox.is_alive()
    return out


async def test_rllm_evaluator_shapes(app: App, pool: str, tmp_path: Path) -> None:
    tests_dir = tmp_path / "tests"
    (tests_dir / "data").mkdir(parents=True)
    (tests_dir / "data" / "expected.txt").write_text("42\n")
    (tests_dir / "test.sh").write_text(
        "#!/bin/bash\n"
        'if [ "$(cat /tmp/rllm/answer)" = "$(cat /tmp/tests/data/expected.txt)" ]\n'
        "then r=1.0; else r=0.0; fi\n"
        "echo $r > /tmp/logs/verifier/reward.txt\n"
        '[ "$r" = 1.0 ]\n'
    )
    solution = tmp_path / "solve.sh"
    solution.write_text("echo 42 > /tmp/rllm/answer && echo solved\n")
    out = await asyncio.to_thread(_rllm_evaluate, app.address, pool, tests_dir, solution)
    assert out["oracle"] == "solved\n"
    assert "verifier_error" not in out and out["reward"] == 1.0
    assert out["safe"].startswith("Command failed (exit 2) in sandbox task-42: echo bad >&2; exit 2")
    assert out["safe"].endswith("bad\n")
    assert "timed out after 1s" in out["timeout"]
    assert out["alive"] is True and out["alive_after_close"] is False


def _rllm_oracle(address: str, pool: str, solution_dir: Path, users: dict[str, str] | None) -> str:
    """rLLM's Oracle harness: mkdir and chmod as root around an upload."""
    with Client(address) as client:
        sandbox = SandboxdSandbox("oracle", pool=pool, client=client, users=users)
        try:
            solution = "/tmp/solution"
            sandbox.exec(f"mkdir -p {solution}", user="root")
            sandbox.upload_dir(str(solution_dir), solution)
            sandbox.exec(f"chmod +x {solution}/solve.sh", user="root")
            return sandbox.exec(f"{solution}/solve.sh; id -u", timeout=30, user=None)
        finally:
            sandbox.close()


async def test_rllm_oracle_shape(app: App, pool: str, tmp_path: Path) -> None:
    solution_dir = tmp_path / "solution"
    solution_dir.mkdir()
    (solution_dir / "solve.sh").write_text("#!/bin/bash\necho solved\n")
    # Root is uid 0 without capabilities, and uploads are the sandbox user's:
    # the user cannot write into root's new directory (nor root chmod the
    # user's file), and the failure says so.
    with pytest.raises(errors.PermissionDenied, match="(?i)permission denied"):
        await asyncio.to_thread(_rllm_oracle, app.address, pool, solution_dir, None)
    # Mapping rLLM's root onto the sandbox's user is the explicit way through.
    out = await asyncio.to_thread(_rllm_oracle, app.address, pool, solution_dir, {"root": ""})
    solved, uid = out.splitlines()
    assert solved == "solved" and int(uid) >= DEFAULT_UIDS.base, "run as the sandbox's own user"
