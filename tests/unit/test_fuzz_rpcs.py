"""Every RPC fuzzed with generated messages: odd types of values, huge and
negative numbers, empty and oversize fields, unicode, path tricks, ids that
exist and ids that do not. Each call must answer a proper status (never
INTERNAL, UNKNOWN or UNIMPLEMENTED), the server must stay healthy, and
nothing may leak."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor as d
from google.protobuf import message_factory
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sandboxd.app import SERVICE_NAMES, App, build_app
from sandboxd.backends.fake import FakeBackend
from sandboxd.v1 import (  # noqa: F401 - registers every service descriptor
    demand_pb2,
    exec_pb2,
    files_pb2,
    pools_pb2,
    preflight_pb2,
    sandboxes_pb2,
    snapshots_pb2,
)
from tests.unit.conftest import make_settings

pytestmark = pytest.mark.timeout(300)

BAD_STATUSES = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.UNIMPLEMENTED}

TRICKY = [
    "",
    " ",
    "p",
    "fuzz",
    "-",
    "a" * 64,
    "x" * 5000,
    "../../etc/passwd",
    "/etc/shadow",
    "/workspace/../x",
    "a/b/../../..",
    "\x00",
    "nul\x00byte",
    "ünïcødé",
    "😀",
    "$(reboot)",
    "'; rm -rf / #",
    "%s%n",
    "\n",
    "sb-000000000000",
    "ls-000000000000000000000000",
    "sn-0000",
    "true",
    "echo hi",
    "KEY",
    "1BAD",
    "SANDBOXD_X",
]
INTS = [0, 1, -1, 2, 7, 64, 2**31 - 1, -(2**31), 2**62, -(2**62)]
FLOATS = [0.0, 0.001, 0.5, 1.0, -1.0, 1e12, float("inf"), float("nan"), 86400.0 * 365]


@dataclass
class Live:
    """A server in a thread of its own, so hypothesis' sync loop can call it."""

    app: App
    loop: asyncio.AbstractEventLoop
    backend: FakeBackend
    ids: list[str]

    def run(self, coro: Any, timeout: float = 30.0) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(timeout)


@pytest.fixture(scope="module")
def live() -> Iterator[Live]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    backend = FakeBackend()

    async def start() -> tuple[App, list[str]]:
        from sandboxd.client import AsyncClient

        app = build_app(make_settings(), backend=backend, persist=False)
        await app.start()
        async with AsyncClient(app.address) as client:
            await client.create_pool("fuzz", "img", min_ready=2, max_size=6)
            lease = await client.lease("fuzz", timeout=5, lease_ttl=3600)
        return app, [lease.id, lease.sandboxes[0].id, "fuzz"]

    app, ids = asyncio.run_coroutine_threadsafe(start(), loop).result(30)
    live = Live(app, loop, backend, ids)
    TRICKY.extend(ids)
    yield live
    live.run(app.stop(grace=1))
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


def _scalar(field: d.FieldDescriptor) -> st.SearchStrategy[Any]:
    t = field.type
    if t == d.FieldDescriptor.TYPE_STRING:
        return st.one_of(st.sampled_from(TRICKY), st.text(max_size=40))
    if t == d.FieldDescriptor.TYPE_BYTES:
        return st.one_of(st.binary(max_size=64), st.sampled_from([b"", b"\x00" * 10, b"not a tar" * 100]))
    if t == d.FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if t in (d.FieldDescriptor.TYPE_DOUBLE, d.FieldDescriptor.TYPE_FLOAT):
        return st.one_of(st.sampled_from(FLOATS), st.floats(allow_nan=True, allow_infinity=True))
    if t == d.FieldDescriptor.TYPE_ENUM:
        return st.integers(-3, 12)
    if t in (d.FieldDescriptor.TYPE_UINT32, d.FieldDescriptor.TYPE_FIXED32):
        return st.one_of(st.sampled_from([0, 1, 0o777, 0o4755, 2**32 - 1]), st.integers(0, 2**32 - 1))
    if t in (d.FieldDescriptor.TYPE_UINT64, d.FieldDescriptor.TYPE_FIXED64):
        return st.integers(0, 2**64 - 1)
    if t in (d.FieldDescriptor.TYPE_INT32, d.FieldDescriptor.TYPE_SINT32, d.FieldDescriptor.TYPE_SFIXED32):
        return st.one_of(
            st.sampled_from([i for i in INTS if -(2**31) <= i < 2**31]), st.integers(-(2**31), 2**31 - 1)
        )
    return st.one_of(st.sampled_from(INTS), st.integers(-(2**63), 2**63 - 1))


def message_strategy(desc: d.Descriptor, depth: int = 0) -> st.SearchStrategy[Any]:
    cls = message_factory.GetMessageClass(desc)
    if desc.full_name.startswith("google.protobuf.") or depth > 3:
        return st.just(cls())
    parts: dict[str, st.SearchStrategy[Any]] = {}
    for field in desc.fields:
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            key = _scalar(field.message_type.fields_by_name["key"])
            vf = field.message_type.fields_by_name["value"]
            value = message_strategy(vf.message_type, depth + 1) if vf.message_type else _scalar(vf)
            parts[field.name] = st.dictionaries(key, value, max_size=3)
        elif field.message_type is not None:
            inner = message_strategy(field.message_type, depth + 1)
            parts[field.name] = (
                st.lists(inner, max_size=2) if _repeated(field) else st.one_of(st.none(), inner)
            )
        elif _repeated(field):
            parts[field.name] = st.lists(_scalar(field), max_size=3)
        else:
            parts[field.name] = st.one_of(st.none(), _scalar(field))

    @st.composite
    def build(draw: st.DrawFn) -> Any:
        msg = cls()
        chosen = set(draw(st.lists(st.sampled_from(sorted(parts)), unique=True))) if parts else set()
        for name in chosen:
            value = draw(parts[name])
            if value is None:
                continue
            field = desc.fields_by_name[name]
            try:
                if field.message_type is not None and field.message_type.GetOptions().map_entry:
                    target = getattr(msg, name)
                    for k, v in value.items():
                        if field.message_type.fields_by_name["value"].message_type is not None:
                            target[k].CopyFrom(v)
                        else:
                            target[k] = v
                elif field.message_type is not None and _repeated(field):
                    getattr(msg, name).extend(value)
                elif field.message_type is not None:
                    getattr(msg, name).CopyFrom(value)
                elif _repeated(field):
                    getattr(msg, name).extend(value)
                else:
                    setattr(msg, name, value)
            except (ValueError, TypeError):
                # Values protobuf itself refuses (e.g. invalid UTF-8) never reach the wire.
                continue
        return msg

    return build()


def _repeated(field: d.FieldDescriptor) -> bool:
    return bool(field.is_repeated)


def _methods() -> list[d.MethodDescriptor]:
    from google.protobuf import descriptor_pool

    pool = descriptor_pool.Default()
    return [m for name in SERVICE_NAMES for m in pool.FindServiceByName(name).methods]


METHODS = _methods()


async def _call(app: App, method: d.MethodDescriptor, messages: list[Any]) -> grpc.StatusCode:
    path = f"/{method.containing_service.full_name}/{method.name}"
    out_cls = message_factory.GetMessageClass(method.output_type)
    async with grpc.aio.insecure_channel(app.address) as channel:
        kwargs: dict[str, Any] = dict(
            request_serializer=lambda m: m.SerializeToString(), response_deserializer=out_cls.FromString
        )
        try:
            if method.client_streaming and method.server_streaming:
                call = channel.stream_stream(path, **kwargs)(iter(messages), timeout=5)
                async for _ in call:
                    pass
            elif method.client_streaming:
                await channel.stream_unary(path, **kwargs)(iter(messages), timeout=5)
            elif method.server_streaming:
                n = 0
                async for _ in channel.unary_stream(path, **kwargs)(messages[0], timeout=5):
                    n += 1
                    if n > 50:
                        break
            else:
                await channel.unary_unary(path, **kwargs)(messages[0], timeout=5)
        except grpc.aio.AioRpcError as e:
            return e.code()
    return grpc.StatusCode.OK


@pytest.mark.parametrize("method", METHODS, ids=lambda m: f"{m.containing_service.name}.{m.name}")
def test_rpc_survives_generated_messages(live: Live, method: d.MethodDescriptor) -> None:
    strategy = st.lists(message_strategy(method.input_type), min_size=1, max_size=3)

    @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(messages=strategy)
    def run(messages: list[Any]) -> None:
        code = live.run(_call(live.app, method, messages))
        assert code not in BAD_STATUSES, f"{method.full_name} answered {code} to {messages}"

    run()

    # Still healthy after the barrage.
    async def health() -> int:
        async with grpc.aio.insecure_channel(live.app.address) as channel:
            reply = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=5
            )
        return int(reply.status)

    assert live.run(health()) == health_pb2.HealthCheckResponse.SERVING


def test_nothing_leaked_after_fuzzing(live: Live) -> None:
    """Every sandbox the fake backend holds is known to the control plane."""

    async def check() -> tuple[set[str], set[str]]:
        known = {r.handle for pool in live.app.control.pools.values() for r in pool.records.values()}
        await asyncio.gather(*(p.drain() for p in live.app.control.pools.values()))
        return set(live.backend.sandboxes), known

    held, known = live.run(check())
    assert held <= known, f"orphans: {held - known}"
