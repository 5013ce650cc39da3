"""Agent episodes: a seeded plan, and the driver-agnostic code that plays it.

A plan is drawn from the profile with ``random.Random(f"{seed}/{step}/{rollout}")``
before anything runs, so both drivers play exactly the same episodes. An
episode: acquire (a group of ``group_size`` at once), per trajectory the setup
commands and a task file, then turns of think time -> file writes -> execs
(session or one-shot) -> maybe a snapshot; the reward command; release.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from benchmarks.load.profile import Profile
from benchmarks.load.stats import OpFailed, Recorder, Stopped

TASK_FILE = "main.py"


@dataclass(frozen=True)
class Exec:
    command: str
    session: bool


@dataclass(frozen=True)
class Write:
    files: tuple[tuple[str, bytes], ...]


@dataclass(frozen=True)
class Turn:
    think_seconds: float
    actions: tuple[Write | Exec, ...]
    snapshot: bool


@dataclass(frozen=True)
class Plan:
    rollout: int
    step: int
    setup: tuple[str, ...]
    task: Write
    turns: tuple[Turn, ...]
    reward: str

    @property
    def execs(self) -> int:
        return sum(isinstance(a, Exec) for t in self.turns for a in t.actions) + len(self.setup) + 1


def file_content(path: str, size: int, tag: str) -> bytes:
    """About ``size`` bytes of valid Python that prints a line (for reward commands)."""
    head = f"# {path} ({tag})\n".encode()
    tail = f"print('ok {tag}')\n".encode()
    room = max(0, size - len(head) - len(tail))
    line = b"# " + b"x" * 76 + b"\n"
    rest = room % len(line)
    body = line * (room // len(line)) + (b"#" + b"y" * (rest - 2) + b"\n" if rest >= 2 else b"")
    return head + body + tail


def _fill(template: str, file: str, turn: int, rollout: int) -> str:
    return template.format(file=file, turn=turn, rollout=rollout)


def plan_episode(profile: Profile, rollout: int, step: int = 0) -> Plan:
    ep, cmds = profile.episode, profile.commands
    rng = random.Random(f"{profile.run.seed}/{step}/{rollout}")
    last_file = TASK_FILE
    task = Write(((TASK_FILE, file_content(TASK_FILE, ep.file_bytes.sample_int(rng), f"r{rollout}")),))
    setup = tuple(_fill(c, last_file, 0, rollout) for c in cmds.setup)
    turns = []
    for t in range(1, ep.turns.sample_int(rng) + 1):
        actions: list[Write | Exec] = []
        files = []
        for j in range(ep.files_per_turn.sample_int(rng)):
            last_file = f"src/t{t}_{j}.py"
            files.append(
                (last_file, file_content(last_file, ep.file_bytes.sample_int(rng), f"r{rollout}t{t}"))
            )
        if files:
            actions.append(Write(tuple(files)))
        for _ in range(ep.execs_per_turn.sample_int(rng)):
            session = rng.random() < ep.session_fraction
            pool = cmds.session if session else cmds.oneshot
            actions.append(Exec(_fill(rng.choice(pool), last_file, t, rollout), session))
        snapshot = rng.random() < ep.snapshot_probability
        turns.append(Turn(ep.think_seconds.sample(rng), tuple(actions), snapshot))
    return Plan(rollout, step, setup, task, tuple(turns), _fill(cmds.reward, last_file, len(turns), rollout))


# -- drivers -------------------------------------------------------------------


@dataclass(frozen=True)
class ExecOutcome:
    outcome: str
    """EXITED, TIMED_OUT, ... (sandboxd's ExecOutcome names)."""
    exit_code: int
    stderr: bytes = b""


class Driver(Protocol):
    """Where episodes run. Methods raise on failure; the recorder types the error."""

    name: str
    snapshots: bool
    """Whether snapshot() works here (set by setup)."""

    async def acquire(self, n: int, labels: Mapping[str, str]) -> Sequence[object]:
        """n sandboxes, all or nothing; the returned sequence is the handle release() takes."""
        ...

    async def exec(self, box: object, command: str, *, session: bool, timeout: float) -> ExecOutcome: ...

    async def write(self, box: object, files: Sequence[tuple[str, bytes]]) -> None: ...

    async def snapshot(self, box: object) -> None: ...

    async def release(self, boxes: Sequence[object]) -> None: ...

    def classify(self, error: BaseException) -> str:
        """A typed reason for an error: ``grpc:DEADLINE_EXCEEDED``, ``docker:500``..."""
        ...


@dataclass
class Tally:
    """Episode counts of one driver's run."""

    planned: int = 0
    completed: int = 0
    failed: int = 0
    cut: int = 0
    """Stopped early by the run's bounds."""
    execs: int = 0
    held_seconds: float = 0.0
    """Sandbox-seconds under lease, each sandbox from its acquire's answer to
    its release's: what the sandboxes cost."""


async def think(seconds: float, stop: asyncio.Event) -> None:
    """The LLM generating: waits ``seconds``, or less if the run is stopped."""
    if seconds > 0 and not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), seconds)
    if stop.is_set():
        raise Stopped("stop")


async def _exec(driver: Driver, rec: Recorder, box: object, action: Exec, timeout: float, op: str) -> None:
    result = await rec.call(
        op, lambda: driver.exec(box, action.command, session=action.session, timeout=timeout)
    )
    rec.latencies.setdefault("exec", []).append(rec.latencies[op][-1])
    if result.outcome != "EXITED":
        rec.error(op, f"exec:{result.outcome}", action.command)
    elif result.exit_code != 0:
        rec.error(
            op,
            "exec:EXIT_NONZERO",
            f"{action.command!r} exited {result.exit_code}: " + result.stderr.decode(errors="replace")[-200:],
        )


async def play(driver: Driver, rec: Recorder, box: object, plan: Plan, timeout: float, tally: Tally) -> None:
    """One trajectory in one sandbox (acquired and released by the caller)."""
    stop = rec.bounds.stop
    try:
        await rec.call("write", lambda: driver.write(box, plan.task.files))
        for command in plan.setup:
            await _exec(driver, rec, box, Exec(command, True), timeout, "exec_session")
        for turn in plan.turns:
            await think(turn.think_seconds, stop)
            for action in turn.actions:
                if isinstance(action, Write):
                    await rec.call("write", functools.partial(driver.write, box, action.files))
                else:
                    op = "exec_session" if action.session else "exec_oneshot"
                    await _exec(driver, rec, box, action, timeout, op)
                    tally.execs += 1
            if turn.snapshot and driver.snapshots:
                await rec.call("snapshot", lambda: driver.snapshot(box))
        await _exec(driver, rec, box, Exec(plan.reward, False), timeout, "reward")
        tally.completed += 1
    except Stopped:
        tally.cut += 1
    except OpFailed:
        tally.failed += 1


async def run_group(
    driver: Driver,
    rec: Recorder,
    plans: Sequence[Plan],
    labels: Mapping[str, str],
    timeout: float,
    tally: Tally,
    on_acquired: Callable[[], None] = lambda: None,
) -> None:
    """Acquire len(plans) sandboxes at once, play a trajectory in each, release
    them all. ``on_acquired`` runs once the acquire is over (whatever its outcome)."""
    tally.planned += len(plans)
    try:
        boxes = await rec.call("acquire", lambda: driver.acquire(len(plans), labels))
    except Stopped:
        tally.cut += len(plans)
        return
    except OpFailed:
        tally.failed += len(plans)
        return
    finally:
        on_acquired()
    held_since = time.perf_counter()
    try:
        await asyncio.gather(
            *(play(driver, rec, b, p, timeout, tally) for b, p in zip(boxes, plans, strict=True))
        )
    finally:
        with contextlib.suppress(OpFailed):
            await asyncio.shield(rec.call("release", lambda: driver.release(boxes), cleanup=True))
        tally.held_seconds += len(boxes) * (time.perf_counter() - held_since)
