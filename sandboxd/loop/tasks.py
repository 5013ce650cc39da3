"""A family of tiny coding tasks: write a Python expression, token by token,
that evaluates to a target number. The program runs in a sandbox; the
verifier (VERIFY_SCRIPT, placed in the sandbox) prints the reward as JSON with
named components: ``runs`` (it ran and printed a number), ``correct``, and
``closeness`` (1 - relative error), reward = correct or half the closeness."""

from __future__ import annotations

import json
import random
import shlex
from dataclasses import dataclass

VOCAB = ["1", "2", "3", "4", "5", "6", "7", "8", "9", "+", "-", "*", "<eos>"]
EOS = len(VOCAB) - 1
BOS = len(VOCAB)  # the "previous token" before the first
MAX_TOKENS = 5
TARGETS = list(range(2, 21))

VERIFY_SCRIPT = r"""
import contextlib, io, json, sys
target, path = int(sys.argv[1]), sys.argv[2]
out = io.StringIO()
try:
    with contextlib.redirect_stdout(out):
        exec(compile(open(path).read(), path, "exec"), {"__builtins__": {"print": print}})
    value = float(out.getvalue().split()[-1])
except Exception:
    print(json.dumps({"reward": 0.0, "components": {"runs": 0.0, "correct": 0.0, "closeness": 0.0}}))
    sys.exit(0)
correct = float(value == target)
closeness = max(0.0, 1.0 - abs(value - target) / target)
reward = 1.0 if correct else 0.5 * closeness
print(json.dumps({"reward": reward, "components": {"runs": 1.0, "correct": correct, "closeness": closeness}}))
"""


@dataclass(frozen=True)
class Task:
    """One task: an expression that evaluates to ``target``."""

    target: int

    @property
    def index(self) -> int:
        """The task's row in the policy's table: its target's place in TARGETS."""
        return TARGETS.index(self.target)

    @property
    def prompt(self) -> str:
        """The task in words, for a model that reads text (the OpenAI-compatible generator)."""
        return f"Write a Python expression using digits 1-9 and + - * that equals {self.target}."


def sample_task(rng: random.Random) -> Task:
    """A task whose target is drawn uniformly from TARGETS."""
    return Task(rng.choice(TARGETS))


def program(tokens: list[int]) -> str:
    """The program a token sequence spells (EOS and what follows dropped)."""
    text = "".join(VOCAB[t] for t in tokens if t != EOS)
    return f"print({text})\n"


def verify_command(task: Task, path: str) -> str:
    """The shell command printing the reward of the program at ``path``; needs VERIFY_SCRIPT as verify.py."""
    return f"python3 verify.py {task.target} {shlex.quote(path)}"


def local_reward(task: Task, tokens: list[int]) -> float:
    """The verifier's reward computed here (for tests and offline tuning)."""
    text = "".join(VOCAB[t] for t in tokens if t != EOS)
    try:
        value = float(eval(text, {"__builtins__": {}}))  # digits and + - * only
    except Exception:
        return 0.0
    if value == task.target:
        return 1.0
    return 0.5 * max(0.0, 1.0 - abs(value - task.target) / task.target)


def encode_payload(task: Task, tokens: list[int], logprobs: list[float]) -> bytes:
    """A trajectory's payload: what the trainer needs to rebuild its sample (target, tokens, log-probs)."""
    return json.dumps({"target": task.target, "tokens": tokens, "logprobs": logprobs}).encode()


def decode_payload(data: bytes) -> tuple[Task, list[int], list[float]]:
    """The task, tokens and log-probs that ``encode_payload`` packed."""
    d = json.loads(data)
    return Task(int(d["target"])), list(d["tokens"]), list(d["logprobs"])
