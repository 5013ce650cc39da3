"""The generator side for real LLMs: samples each group from an
OpenAI-compatible HTTP endpoint (vLLM, SGLang, ...), runs the completions in
sandboxes and submits them to the rollout queue, where the verifier's rewards
are computed. The trainer is whatever trains that model; it pulls batches
with ``RolloutClient.pull`` and publishes versions the generator follows.

    gen = OpenAIGenerator("http://127.0.0.1:8000", model="my-policy")
    await run_http_generator(client, gen, HttpGeneratorConfig(pool="py", run="r1"), groups=100)
"""

from __future__ import annotations

import contextlib
import random
import re
from dataclasses import dataclass
from typing import Any

import aiohttp

from sandboxd import errors
from sandboxd.client.aio import AsyncClient
from sandboxd.client.rollouts import RolloutClient, trajectory
from sandboxd.loop.tasks import VERIFY_SCRIPT, Task, sample_task, verify_command

_EXPR = re.compile(r"[0-9(][0-9+\-*/() ]*")


@dataclass(frozen=True)
class Completion:
    """One completion's text and its token count (the response's total split evenly over ``n``)."""

    text: str
    tokens: int


class OpenAIGenerator:
    """Chat completions from an OpenAI-compatible server, ``n`` per prompt."""

    def __init__(
        self,
        base_url: str,
        *,
        model: str,
        api_key: str = "",
        temperature: float = 1.0,
        max_tokens: int = 64,
        timeout: float = 120.0,
    ) -> None:
        self.url = base_url.rstrip("/") + "/v1/chat/completions"
        self.model = model
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.temperature = temperature
        self.max_tokens = max_tokens
        self._timeout = aiohttp.ClientTimeout(total=timeout)

    async def sample(self, session: aiohttp.ClientSession, prompt: str, n: int) -> list[Completion]:
        """Exactly ``n`` completions of ``prompt`` in one request; TransientBackendError otherwise."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": "user", "content": prompt}],
            "n": n,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }
        async with session.post(self.url, json=body, headers=self._headers, timeout=self._timeout) as r:
            if r.status != 200:
                raise errors.TransientBackendError(
                    f"generator endpoint answered {r.status}: {await r.text()}"
                )
            data = await r.json()
        usage = data.get("usage") or {}
        per = int(usage.get("completion_tokens", 0)) // max(n, 1)
        out = [Completion(str(c["message"]["content"]), per) for c in data.get("choices", [])]
        if len(out) != n:
            raise errors.TransientBackendError(f"asked for {n} completions, got {len(out)}")
        return out


def to_program(text: str) -> str:
    """The first arithmetic expression in a completion, as a program that prints it."""
    match = _EXPR.search(text.replace("**", ""))
    expr = match.group(0).rstrip(" +-*/(") if match else ""
    return f"print({expr or 'None'})\n"


@dataclass
class HttpGeneratorConfig:
    """Where an HTTP generator's groups run (pool) and go (run), and what version they come from."""

    pool: str
    run: str
    group_size: int = 8
    policy_version: int = 0
    """Version of the served model; set it when the server reloads weights."""
    seed: int = 0


async def run_http_generator(
    client: AsyncClient, generator: OpenAIGenerator, config: HttpGeneratorConfig, *, groups: int
) -> int:
    """Generates and submits ``groups`` groups; returns how many were accepted."""
    rollouts = RolloutClient(client)
    rng = random.Random(config.seed)
    accepted = 0
    async with aiohttp.ClientSession() as http, client.acquire(config.pool, labels={"run": config.run}) as sb:
        await sb.write_files({"verify.py": VERIFY_SCRIPT})
        for _ in range(groups):
            (slot,) = await rollouts.wait_slots(config.run, 1)
            task: Task = sample_task(rng)
            completions = await generator.sample(http, task.prompt, config.group_size)
            files, trajs = {}, []
            for i, c in enumerate(completions):
                path = f"llm_{slot.group_id}_{i}.py"
                files[path] = to_program(c.text)
                trajs.append(
                    trajectory(
                        f"{slot.group_id}-{i}",
                        payload=c.text.encode(),
                        segments=[(config.policy_version, c.tokens)],
                        verifier=verify_command(task, path),
                        sandbox_id=sb.id,
                        verifier_timeout=10,
                    )
                )
            await sb.write_files(files)
            with contextlib.suppress(errors.FailedPrecondition):
                await rollouts.submit(config.run, slot.group_id, trajs, prompt_id=str(task.target))
                accepted += 1
    return accepted
