"""The OpenAI-compatible generator against a small stand-in model server:
completions become programs, run in sandboxes, and come back scored."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from sandboxd.client import AsyncClient
from sandboxd.client.rollouts import RolloutClient
from sandboxd.loop.openai_generator import (
    HttpGeneratorConfig,
    OpenAIGenerator,
    run_http_generator,
    to_program,
)

pytestmark = [pytest.mark.docker, pytest.mark.timeout(180)]


@pytest.fixture
async def model_url() -> AsyncIterator[str]:
    """Answers every prompt with the right expression half the time."""
    seen: list[dict[str, Any]] = []

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append(body)
        target = int(re.findall(r"equals (\d+)", body["messages"][0]["content"])[0])
        texts = [
            f"The answer is {target - 1} + 1" if i % 2 == 0 else "I think 1 + 1" for i in range(body["n"])
        ]
        return web.json_response(
            {
                "choices": [
                    {"index": i, "message": {"role": "assistant", "content": t}} for i, t in enumerate(texts)
                ],
                "usage": {"completion_tokens": 5 * body["n"]},
            }
        )

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    await runner.cleanup()


def test_to_program_extracts_an_expression() -> None:
    assert to_program("The answer is 3 + 4.") == "print(3 + 4)\n"
    assert to_program("no digits here") == "print(None)\n"


async def test_llm_completions_are_scored_in_sandboxes(
    client: AsyncClient, pool: str, model_url: str
) -> None:
    rollouts = RolloutClient(client)
    await rollouts.configure("llm", batch_groups=2, group_size=4, max_staleness=1, pool=pool)
    generator = OpenAIGenerator(model_url, model="stand-in")
    accepted = await run_http_generator(
        client, generator, HttpGeneratorConfig(pool=pool, run="llm", group_size=4), groups=2
    )
    assert accepted == 2
    async for batch in rollouts.pull("llm", max_batches=1):
        rewards = sorted(t.reward for g in batch.groups for t in g.trajectories)
        assert all(not t.failure for g in batch.groups for t in g.trajectories)
        assert rewards[-4:] == [1.0] * 4, "the right answers scored 1"
        assert max(rewards[:4]) < 1.0, "the wrong ones did not"
        await rollouts.ack("llm", batch.batch_id)
        break
    figures = await rollouts.figures("llm")
    assert figures.infra_failures_masked == 0
