"""Harbor (the task format of TRL, SkyRL, rLLM and others) runs a task end to
end through its own E2B environment, unchanged, against ``sandboxd serve
--e2b-port`` on the real engine: Harbor's CLI in its own virtual environment
(Harbor needs Python 3.12 or later; scripts/harbor-venv.sh makes it), its
oracle agent running the task's solution, its verifier running the task's
tests and reading the reward back. Harbor builds the task's template itself
through the SDK's template builder (``AsyncTemplate.build_in_background``,
tags, build status), which sandboxd serves with its own image builds, no
templates file involved; the sandboxes come from the build pool, one with a
writable root, where Harbor writes /solution, /tests and /logs. A wrong
solution scores 0, and a task whose Dockerfile fails ends in Harbor's build
error naming the failing step."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import subprocess
from pathlib import Path
from typing import Any

import docker
import pytest

from tests.integration.e2b_server import sdk_env, serve_process

e2b = pytest.importorskip("e2b")

pytestmark = [pytest.mark.docker, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
TASK = REPO / "tests" / "harbor_tasks" / "hello"
VENV = REPO / ".venv-harbor"
KEY = "e2b_" + "4a" * 20
POOL = "harbor"


def _harbor_venv() -> Path:
    """The Harbor environment's python; a skip where no Python 3.12+ exists."""
    found = subprocess.run(
        ["bash", str(REPO / "scripts" / "harbor-venv.sh"), "--python"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if found.returncode != 0:
        pytest.skip(
            "Harbor needs Python 3.12 or later, and this machine has none "
            "(python3.12/python3.13 on PATH or pyenv's)"
        )
    python = VENV / "bin" / "python"
    if not (VENV / "bin" / "harbor").exists():
        pytest.fail(f"{VENV.name} has no harbor: run scripts/setup.sh test (or scripts/harbor-venv.sh)")
    return python


def _task(tmp_path: Path, name: str, image: str, solution: str = "", run: str = "") -> Path:
    """A copy of the task whose Dockerfile starts from ``image`` (sandboxd's
    rollout image, whose tag is the hash of its recipe), with another
    solution or an extra RUN step where given."""
    task = tmp_path / name
    shutil.copytree(TASK, task)
    (task / "environment" / "Dockerfile").write_text(
        f"FROM {image}\n" + (f"RUN {run}\n" if run else "") + "WORKDIR /app\n"
    )
    if solution:
        (task / "solution" / "solve.sh").write_text(f"#!/bin/bash\n{solution}\n")
    return task


async def _trial(
    harbor: Path, task: Path, trials: Path, name: str, env: dict[str, str], ok: bool = True
) -> dict[str, Any]:
    """One Harbor trial of ``task`` with the oracle agent; its result.json,
    checked to have ended without an error where ``ok``."""
    log = trials / f"{name}.log"
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            str(harbor),
            "trials",
            "start",
            "--path",
            str(task),
            "--agent",
            "oracle",
            "--env",
            "e2b",
            "--trials-dir",
            str(trials),
            "--trial-name",
            name,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
        try:
            await asyncio.wait_for(proc.wait(), 240)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    result_path = trials / name / "result.json"
    assert proc.returncode == 0 and result_path.exists(), log.read_text()
    result: dict[str, Any] = json.loads(result_path.read_text())
    if ok:
        assert result["exception_info"] is None, (result["exception_info"], log.read_text())
    return result


async def test_harbor_trials_through_e2b_environment(
    image: str, engine: docker.DockerClient, tmp_path: Path
) -> None:
    python = await asyncio.to_thread(_harbor_venv)
    right_task = await asyncio.to_thread(_task, tmp_path, "hello", image)
    wrong_task = await asyncio.to_thread(
        _task, tmp_path, "hello-wrong", image, "echo goodbye > /app/hello.txt"
    )
    broken_task = await asyncio.to_thread(_task, tmp_path, "hello-broken", image, run="echo no >&2; exit 7")
    instance = "it-harbor-" + secrets.token_hex(3)
    trials = tmp_path / "trials"
    trials.mkdir()
    build_args = ["--e2b-build-pool", POOL, "--e2b-api-key", KEY]
    async with serve_process(engine, tmp_path, instance, build_args, up_timeout=300) as (client, url):
        # Only the SDK's own settings point Harbor's E2B environment here.
        env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
        env.update(sdk_env(url, KEY), HOME=str(tmp_path / "home"))
        await client.create_pool(POOL, image, min_ready=0, max_size=4, images=["*"], root="writable")

        harbor = python.parent / "harbor"
        right = await _trial(harbor, right_task, trials, "hello-right", env)
        assert right["verifier_result"]["rewards"] == {"reward": 1}, right
        assert right["task_name"] == "hello"
        # The verifier really ran: a wrong solution is scored 0.
        failed = await _trial(harbor, wrong_task, trials, "hello-wrong", env)
        assert failed["verifier_result"]["rewards"] == {"reward": 0}, failed
        # A Dockerfile that fails: Harbor's build error, naming the step and its exit code.
        broken = await _trial(harbor, broken_task, trials, "hello-broken", env, ok=False)
        exception = broken["exception_info"]
        assert exception is not None and "exit code: 7" in exception["exception_message"], exception

        # Harbor killed its sandboxes: no E2B sandbox and no leased sandbox are left.
        listed = await e2b.AsyncSandbox.list(api_key=KEY, api_url=url).next_items()
        assert listed == []
        boxes = await client.list_sandboxes(POOL)
        assert not [b for b in boxes if b.lease_id], boxes
        await client.delete_pool(POOL, force=True)
