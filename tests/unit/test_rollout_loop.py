"""The loop's policy and tasks without sandboxes: both implementations of the
policy learn the task family from the local reward; the benchmark's
controller beats the fixed baseline within the staleness budget."""

from __future__ import annotations

import random
import statistics

import numpy as np
import pytest

from sandboxd.loop.policy import Sample, make_policy, torch_available
from sandboxd.loop.tasks import Task, decode_payload, encode_payload, local_reward, program, sample_task

pytestmark = pytest.mark.timeout(60)


def test_tasks_programs_and_payloads() -> None:
    task = Task(12)
    assert program([8, 9, 3, 12]) == "print(9+4)\n"
    assert local_reward(task, [8, 9, 3, 12]) == pytest.approx(0.5 * (1 - 1 / 12))
    assert local_reward(task, [5, 11, 1]) == 1.0  # 6*2
    assert local_reward(task, [9, 9]) == 0.0  # not a program
    assert decode_payload(encode_payload(task, [1, 2], [-0.5, -1.0])) == (task, [1, 2], [-0.5, -1.0])


@pytest.mark.parametrize("kind", ["numpy", pytest.param("torch", marks=pytest.mark.skipif(
    not torch_available(), reason="torch not installed"))])  # fmt: skip
def test_policy_learns_offline(kind: str) -> None:
    policy = make_policy(kind, lr=0.2, seed=0)
    rng, nrng = random.Random(0), np.random.default_rng(0)
    curve = []
    for _ in range(30):
        weights, samples, rewards = policy.export(), [], []
        for _ in range(4):
            task = sample_task(rng)
            group = [weights.sample(task.index, nrng) for _ in range(8)]
            r = [local_reward(task, tokens) for tokens, _ in group]
            rewards += r
            mean, std = statistics.fmean(r), statistics.pstdev(r)
            if std > 0:
                samples += [
                    Sample(task.index, t, lp, (x - mean) / std) for (t, lp), x in zip(group, r, strict=True)
                ]
        policy.update(samples)
        curve.append(statistics.fmean(rewards))
    assert statistics.fmean(curve[-5:]) > statistics.fmean(curve[:5]) + 0.1, curve


def test_benchmark_controller_halves_idle_within_budget() -> None:
    from benchmarks.loop import run

    result = run(1500.0, seed=2)
    assert result["controller_trainer_idle"] <= 0.5 * result["fixed_trainer_idle"]  # type: ignore[operator]
    assert result["controller_max_staleness"] <= result["staleness_budget"]  # type: ignore[operator]
