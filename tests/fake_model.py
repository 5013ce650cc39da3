"""A fake OpenAI-compatible inference server (vLLM's spelling), for the model gateway's tests and benchmark.

It answers ``/v1/chat/completions`` and ``/v1/completions``, whole or
streamed (server-sent events), with token ids per choice and
``prompt_token_ids`` (as vLLM's ``return_token_ids``), log-probs (chat and
completion shapes) and usage (streamed only with
``stream_options.include_usage``, as OpenAI does). The reply is fixed, so
tests know every id and log-prob; each request it got is kept.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

REPLY = ["hello", " from", " the", " fake", " model"]
REPLY_IDS = [1000, 1001, 1002, 1003, 1004]
REPLY_LOGPROBS = [-0.5, -0.25, -0.125, -0.0625, -0.03125]
PROMPT_IDS = [1, 2, 3]


@dataclass
class Seen:
    """One request the fake server got."""

    path: str
    authorization: str
    body: dict[str, Any]


@dataclass
class FakeModel:
    """The running server: its base URL and what it was asked."""

    url: str
    seen: list[Seen] = field(default_factory=list)


def _chat_logprobs(i: int) -> dict[str, Any]:
    return {"content": [{"token": REPLY[i], "logprob": REPLY_LOGPROBS[i], "top_logprobs": []}]}


def _whole(path: str, model: str) -> dict[str, Any]:
    usage = {"prompt_tokens": len(PROMPT_IDS), "completion_tokens": len(REPLY), "total_tokens": 8}
    if path.endswith("/chat/completions"):
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": "".join(REPLY)},
            "logprobs": {"content": [_chat_logprobs(i)["content"][0] for i in range(len(REPLY))]},
            "finish_reason": "stop",
            "token_ids": REPLY_IDS,
        }
        kind = "chat.completion"
    else:
        choice = {
            "index": 0,
            "text": "".join(REPLY),
            "logprobs": {"tokens": REPLY, "token_logprobs": REPLY_LOGPROBS},
            "finish_reason": "stop",
            "token_ids": REPLY_IDS,
        }
        kind = "text_completion"
    return {
        "id": "fake-1",
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": usage,
        "prompt_token_ids": PROMPT_IDS,
    }


def _chunks(path: str, model: str, usage: bool) -> list[dict[str, Any]]:
    chat = path.endswith("/chat/completions")
    out: list[dict[str, Any]] = []
    for i, word in enumerate(REPLY):
        choice: dict[str, Any] = {"index": 0, "token_ids": [REPLY_IDS[i]], "finish_reason": None}
        if chat:
            choice["delta"] = {"content": word} if i else {"role": "assistant", "content": word}
            choice["logprobs"] = _chat_logprobs(i)
        else:
            choice["text"] = word
            choice["logprobs"] = {"tokens": [word], "token_logprobs": [REPLY_LOGPROBS[i]]}
        if i == len(REPLY) - 1:
            choice["finish_reason"] = "stop"
        chunk: dict[str, Any] = {"id": "fake-1", "object": "chat.completion.chunk", "created": 0}
        chunk.update(model=model, choices=[choice])
        if i == 0:
            chunk["prompt_token_ids"] = PROMPT_IDS
        out.append(chunk)
    if usage:
        out.append(
            {
                "id": "fake-1",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": model,
                "choices": [],
                "usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8},
            }
        )
    return out


def app(server: FakeModel) -> web.Application:
    """The fake server's routes, recording into ``server``."""

    async def complete(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        server.seen.append(Seen(request.path, request.headers.get("Authorization", ""), body))
        model = str(body.get("model", "fake"))
        if not body.get("stream"):
            return web.json_response(_whole(request.path, model))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        usage = bool((body.get("stream_options") or {}).get("include_usage"))
        for chunk in _chunks(request.path, model, usage):
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def models(request: web.Request) -> web.Response:
        server.seen.append(Seen(request.path, request.headers.get("Authorization", ""), {}))
        return web.json_response({"object": "list", "data": [{"id": "fake", "object": "model"}]})

    application = web.Application()
    application.router.add_post("/v1/chat/completions", complete)
    application.router.add_post("/v1/completions", complete)
    application.router.add_get("/v1/models", models)
    return application


@asynccontextmanager
async def fake_model(host: str = "127.0.0.1") -> AsyncIterator[FakeModel]:
    """The fake server on ``host`` at a free port, for the block."""
    server = FakeModel(url="")
    runner = web.AppRunner(app(server), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, 0)
    await site.start()
    port = runner.addresses[0][1]
    server.url = f"http://{host}:{port}/v1"
    try:
        yield server
    finally:
        await runner.cleanup()
