"""The model gateway against a fake OpenAI-compatible server, driven by the real ``openai`` package.

The gateway here serves loopback sockets, one per sandbox, as it serves the
sockets in sandboxes' egress namespaces; the Docker test
(tests/integration/test_model_gateway_docker.py) drives it from inside a
sandbox with curl. Keys are checked against a real lease table.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import openai
import pytest

from sandboxd.backends.network.gateway import ModelGateway
from sandboxd.backends.network.meter import CallBuilder, ModelCall
from sandboxd.client import AsyncClient
from sandboxd.clock import FakeClock
from sandboxd.core.leases import Lease, LeaseTable
from sandboxd.core.model_route import ModelKeys, ModelLedger, ModelRoute
from sandboxd.errors import FailedPrecondition, InvalidArgument
from tests.fake_model import PROMPT_IDS, REPLY, REPLY_IDS, REPLY_LOGPROBS, FakeModel, fake_model

POOL = "team/agents"


def _listener() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    return sock


class Rig:
    """A route over a real lease table, the gateway serving sandboxes "sb-a" and "sb-b" on loopback."""

    def __init__(self, upstream: str) -> None:
        self.clock = FakeClock()
        self.leases = LeaseTable()
        self.endpoint = upstream
        self.route = ModelRoute(
            self.leases, lambda pool: self.endpoint if pool == POOL else "", ModelLedger(self.clock)
        )
        self.urls: dict[str, str] = {}
        self.closers: list[Callable[[], Awaitable[None]]] = []

    def lease(self, lease_id: str, sandbox_id: str, pool: str = POOL) -> str:
        self.leases.add(Lease(lease_id, pool, [sandbox_id], 60.0, 1e9, 1e9), {})
        return self.route.key_for(lease_id, pool, sandbox_id)

    def client(self, sandbox_id: str, key: str) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.urls[sandbox_id], api_key=key, max_retries=0)


@asynccontextmanager
async def rig() -> AsyncIterator[tuple[Rig, FakeModel]]:
    async with fake_model() as model:
        r = Rig(model.url)
        for sandbox in ("sb-a", "sb-b"):
            sock = _listener()
            r.urls[sandbox] = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
            r.closers.append(await r.route.gateway.serve(sandbox, sock))
        try:
            yield r, model
        finally:
            for close in r.closers:
                await close()
            await r.route.gateway.close()


def _only(calls: list[ModelCall]) -> ModelCall:
    assert len(calls) == 1, calls
    return calls[0]


async def test_a_chat_completion_is_forwarded_and_recorded_with_its_token_ids_and_logprobs() -> None:
    async with rig() as (r, model):
        key = r.lease("ls-1", "sb-a")
        client = r.client("sb-a", key)
        answer = await client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "hi"}], logprobs=True
        )
        assert answer.choices[0].message.content == "".join(REPLY)
        assert answer.usage is not None and answer.usage.completion_tokens == 5
        # The server never sees the lease's key.
        assert model.seen[-1].authorization == "" and model.seen[-1].body["model"] == "policy"
        call = _only(r.route.ledger.take("team", "sb-a", ["ls-1"]))
        assert (call.lease_id, call.sandbox_id, call.path, call.status) == (
            "ls-1",
            "sb-a",
            "/chat/completions",
            200,
        )
        assert (call.prompt_tokens, call.completion_tokens, call.model, call.stream) == (
            3,
            5,
            "policy",
            False,
        )
        assert call.prompt_token_ids == PROMPT_IDS
        assert call.choices[0].token_ids == REPLY_IDS
        assert call.choices[0].logprobs == REPLY_LOGPROBS
        assert call.choices[0].text == "".join(REPLY) and call.choices[0].finish_reason == "stop"
        assert b'"content": "hi"' in call.request or b'"content":"hi"' in call.request
        assert r.route.ledger.take("team", "sb-a", None) == []  # taken once


async def test_a_streamed_chat_completion_streams_through_and_is_recorded_whole() -> None:
    async with rig() as (r, _):
        client = r.client("sb-a", r.lease("ls-1", "sb-a"))
        stream = await client.chat.completions.create(
            model="policy",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            stream_options={"include_usage": True},
            logprobs=True,
        )
        pieces = [c.choices[0].delta.content async for c in stream if c.choices]
        assert "".join(p or "" for p in pieces) == "".join(REPLY)
        call = _only(r.route.ledger.take("team", "sb-a", ["ls-1"]))
        assert call.stream and call.status == 200 and not call.error
        assert call.choices[0].token_ids == REPLY_IDS and call.choices[0].logprobs == REPLY_LOGPROBS
        assert call.choices[0].text == "".join(REPLY)
        assert (call.prompt_tokens, call.completion_tokens) == (3, 5)
        assert call.prompt_token_ids == PROMPT_IDS


async def test_streamed_without_usage_the_tokens_are_counted_from_their_ids() -> None:
    async with rig() as (r, _):
        client = r.client("sb-a", r.lease("ls-1", "sb-a"))
        stream = await client.completions.create(model="policy", prompt="hi", stream=True, logprobs=1)
        text = "".join([c.choices[0].text async for c in stream])
        assert text == "".join(REPLY)
        call = _only(r.route.ledger.take("team", "sb-a", None))
        assert call.path == "/completions" and call.completion_tokens == 5 and call.prompt_tokens == 3
        assert call.choices[0].logprobs == REPLY_LOGPROBS


async def test_a_key_stops_working_the_moment_its_lease_ends() -> None:
    async with rig() as (r, _):
        key = r.lease("ls-1", "sb-a")
        client = r.client("sb-a", key)
        await client.models.list()
        r.leases.remove("ls-1")
        with pytest.raises(openai.AuthenticationError, match="lease ls-1 has ended") as caught:
            await client.models.list()
        assert caught.value.status_code == 401
        assert len(r.route.ledger.take("team", "sb-a", None)) == 1  # only the call made while it held


async def test_another_leases_key_cannot_put_calls_on_this_sandboxes_trajectory() -> None:
    async with rig() as (r, model):
        r.lease("ls-1", "sb-a")
        other = r.lease("ls-2", "sb-b")
        with pytest.raises(openai.PermissionDeniedError, match="sandbox sb-b's") as caught:
            await r.client("sb-a", other).chat.completions.create(
                model="policy", messages=[{"role": "user", "content": "hi"}]
            )
        assert caught.value.status_code == 403
        assert model.seen == []
        assert r.route.ledger.take("team", "sb-a", None) == []
        assert r.route.ledger.take("team", "sb-b", None) == []


@pytest.mark.parametrize(
    "key",
    ["", "sk-not-ours", "sbxk.ls-1.sb-a.0000000000000000000000000000000000000000", "sbxk.ls-1.sb-a"],
)
async def test_keys_not_issued_by_sandboxd_are_refused(key: str) -> None:
    async with rig() as (r, model):
        r.lease("ls-1", "sb-a")
        with pytest.raises(openai.AuthenticationError) as caught:
            await r.client("sb-a", key or "x").models.list() if key else await _no_key(r.urls["sb-a"])
        assert caught.value.status_code == 401
        assert model.seen == []


async def _no_key(url: str) -> None:
    client = openai.AsyncOpenAI(
        base_url=url, api_key="unused", max_retries=0, default_headers={"Authorization": ""}
    )
    await client.models.list()


async def test_a_key_from_another_server_secret_is_refused() -> None:
    async with rig() as (r, _):
        r.lease("ls-1", "sb-a")
        forged = ModelKeys(b"another secret entirely, 32 byte").key_for("ls-1", "sb-a")
        with pytest.raises(openai.AuthenticationError, match="not a key sandboxd issued"):
            await r.client("sb-a", forged).models.list()


async def test_an_unreachable_model_server_is_a_502_naming_it_and_the_call_is_recorded() -> None:
    async with rig() as (r, _):
        key = r.lease("ls-1", "sb-a")
        r.endpoint = "http://127.0.0.1:9/v1"  # discard port: nothing listens
        with pytest.raises(openai.APIStatusError, match="model server unreachable") as caught:
            await r.client("sb-a", key).chat.completions.create(
                model="policy", messages=[{"role": "user", "content": "hi"}]
            )
        assert caught.value.status_code == 502
        call = _only(r.route.ledger.take("team", "sb-a", None))
        assert call.status == 0 and "unreachable" in call.error


async def test_a_pool_without_an_endpoint_refuses_and_other_tenants_do_not_take_the_calls() -> None:
    async with rig() as (r, _):
        key = r.lease("ls-9", "sb-a", pool="team/plain")
        with pytest.raises(openai.PermissionDeniedError, match="names no model endpoint"):
            await r.client("sb-a", key).models.list()
        key = r.lease("ls-1", "sb-a")
        await r.client("sb-a", key).models.list()
        assert r.route.ledger.take("other", "sb-a", None) == []
        assert r.route.ledger.take("team", "sb-a", ["ls-2"]) == []
        assert len(r.route.ledger.take("team", "sb-a", ["ls-1"])) == 1


def test_a_stream_cut_anywhere_parses_the_same() -> None:
    stream = (
        b'data: {"choices":[{"index":0,"delta":{"content":"ab"},"token_ids":[7],'
        b'"logprobs":{"content":[{"token":"ab","logprob":-1.5}]}}]}\n\n'
        b'data: {"choices":[{"index":0,"delta":{"content":"c"},"token_ids":[8],"finish_reason":"length",'
        b'"logprobs":{"content":[{"token":"c","logprob":-0.5}]}}]}\n\n'
        b"data: [DONE]\n\n"
    )
    for cut in range(1, len(stream), 7):
        builder = CallBuilder(ModelCall("ls", "sb", "POST", "/chat/completions", 0.0))
        builder.feed(stream[:cut])
        builder.feed(stream[cut:])
        call = builder.finish()
        assert call.choices[0].text == "abc" and call.choices[0].token_ids == [7, 8]
        assert call.choices[0].logprobs == [-1.5, -0.5] and call.choices[0].finish_reason == "length"
        assert call.completion_tokens == 2


def test_token_ids_come_from_token_strings_when_the_server_gives_no_ids() -> None:
    builder = CallBuilder(ModelCall("ls", "sb", "POST", "/completions", 0.0))
    builder.body(
        b'{"choices":[{"index":0,"text":"xy","logprobs":{"tokens":["token_id:5","token_id:6"],'
        b'"token_logprobs":[-0.1,-0.2]}}]}'
    )
    call = builder.finish()
    assert call.choices[0].token_ids == [5, 6] and call.choices[0].logprobs == [-0.1, -0.2]


def test_the_ledger_lets_go_of_untaken_calls_after_its_retention() -> None:
    clock = FakeClock()
    ledger = ModelLedger(clock)
    ledger.record("team", ModelCall("ls-1", "sb-a", "POST", "/chat/completions", 0.0))
    assert ledger.pending("team", "sb-a") == 1
    clock.advance(3601)
    ledger.record("team", ModelCall("ls-2", "sb-b", "POST", "/chat/completions", 0.0))
    assert ledger.pending("team", "sb-a") == 0 and ledger.pending("team", "sb-b") == 1


def test_recorded_calls_survive_the_rollout_stores_round_trip() -> None:
    from sandboxd.backends.network.meter import ModelChoice
    from sandboxd.core.rollouts.model import Group, Trajectory, group_from_json, group_to_json

    call = ModelCall("ls-1", "sb-a", "POST", "/chat/completions", 12.5, model="policy", stream=True)
    call.request, call.prompt_token_ids = b'{"x": "\\u00e9"}\x00', [1, 2]
    call.choices = [ModelChoice(0, "hi", [7, 8], [-0.5, -0.25], "stop")]
    group = Group("g-1", 0, 0.0, trajectories=[Trajectory("t-1", sandbox_id="sb-a", model_calls=[call])])
    back = group_from_json(json.loads(json.dumps(group_to_json(group))))
    assert back.trajectories[0].model_calls == [call]


async def test_a_backend_without_the_gateway_refuses_a_model_endpoint_and_bad_urls_are_named(
    client: AsyncClient,
) -> None:
    with pytest.raises(FailedPrecondition, match="does not enforce network policies"):
        await client.create_pool("m", "img", model_endpoint="http://10.0.0.5:8000/v1")
    for url, why in [
        ("10.0.0.5:8000", "http:// or https://"),
        ("http://:8000/v1", "with a host"),
        ("http://k:s@10.0.0.5/v1", "credentials"),
        ("http://10.0.0.5/v1?key=1", "a query"),
        ("http://10.0.0.5:99999/v1", "URL|port"),
    ]:
        with pytest.raises(InvalidArgument, match=why) as caught:
            await client.create_pool("m", "img", model_endpoint=url)
        assert caught.value.field == "spec.model_endpoint"
    assert [p.spec.name for p in await client.list_pools()] == []


async def test_calls_past_a_sandboxes_bound_are_429_and_the_others_go_through() -> None:
    async with rig() as (r, model):
        key = r.lease("ls-1", "sb-a")
        gateway = ModelGateway(r.route.authorize, r.route.record, max_calls=1)
        release, entered = asyncio.Event(), asyncio.Event()
        forward = gateway._forward

        async def held(*args: Any) -> Any:
            entered.set()
            await release.wait()
            return await forward(*args)

        gateway._forward = held  # type: ignore[method-assign]
        sock = _listener()
        close = await gateway.serve("sb-a", sock)
        client = openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{sock.getsockname()[1]}/v1", api_key=key, max_retries=0
        )

        async def models() -> Any:
            return await client.models.list()

        first = asyncio.create_task(models())
        await entered.wait()
        with pytest.raises(openai.RateLimitError, match="more than 1 model calls at once"):
            await models()
        release.set()
        await first
        await close()
        await gateway.close()
        assert len(model.seen) == 1


async def test_the_servers_own_key_goes_to_the_model_and_the_section_is_checked() -> None:
    from sandboxd.model_gateway_settings import ModelGatewaySettings
    from sandboxd.settings import load_settings

    settings = load_settings(None, {"model_gateway.api_key": "upstream-secret"}).model_gateway
    async with fake_model() as model:
        leases = LeaseTable()
        route = ModelRoute(leases, lambda _: model.url, ModelLedger(FakeClock()), gateway=settings)
        leases.add(Lease("ls-1", POOL, ["sb-a"], 60.0, 1e9, 1e9), {})
        sock = _listener()
        close = await route.gateway.serve("sb-a", sock)
        client = openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{sock.getsockname()[1]}/v1",
            api_key=route.key_for("ls-1", POOL, "sb-a"),
            max_retries=0,
        )
        await client.models.list()
        await close()
        await route.gateway.close()
        assert [s.authorization for s in model.seen] == ["Bearer upstream-secret"]
    with pytest.raises(InvalidArgument, match="max_calls_per_sandbox"):
        ModelGatewaySettings(max_calls_per_sandbox=0).check()
    with pytest.raises(InvalidArgument, match="timeout_seconds"):
        ModelGatewaySettings(timeout_seconds=float("nan")).check()
