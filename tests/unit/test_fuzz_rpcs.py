"""Every RPC fuzzed with generated messages: odd types of values, huge and
negative numbers, empty and oversize fields, unicode, path tricks, ids that
exist and ids that do not. Each call must answer a proper status (never
INTERNAL, UNKNOWN or UNIMPLEMENTED), the server must stay healthy, and
nothing may leak."""

from __future__ import annotations

import asyncio
import posixpath
import threading
import unicodedata
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
    rollouts_pb2,
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
    # Whole-string validation: a trailing or embedded newline, CR, NUL, wide text.
    "name\n",
    "fuzz\n",
    "a\nb",
    "A\n",
    "p\r",
    "KEY\x00",
    "\u2028",
    "é" * 70_000,
    "sandboxd.snapshot",
    "sandboxd.pool",
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


# -- properties of single fields ------------------------------------------------
# Each holds for every generated value, on a pool and lease of its own (the
# barrage above may have released or deleted the shared ones).

ROOTS = ("/workspace", "/tmp")
SEGMENTS = ["..", ".", "", "workspace", "tmp", "etc", "x", "\x00", "ü", " ", "...", "~"]
PATHS = st.builds(
    lambda absolute, parts: ("/" if absolute else "") + "/".join(parts),
    st.booleans(),
    st.lists(st.one_of(st.sampled_from(SEGMENTS), st.text(max_size=6)), max_size=6),
)
INT32S = st.one_of(
    st.sampled_from([i for i in INTS if -(2**31) <= i < 2**31]), st.integers(-(2**31), 2**31 - 1)
)
PROPERTY = settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck), database=None)
PROPERTY_POOL_SIZE = 4


@dataclass
class Own:
    """A pool, a lease on one of its sandboxes and a run, made for the property tests."""

    pool: str
    lease_id: str
    sandbox_id: str
    run: str


@pytest.fixture(scope="module")
def own(live: Live) -> Iterator[Own]:
    from sandboxd.client import AsyncClient
    from sandboxd.client.rollouts import RolloutClient

    async def make() -> Own:
        async with AsyncClient(live.app.address) as client:
            await client.create_pool("props", "img", min_ready=1, max_size=PROPERTY_POOL_SIZE)
            lease = await client.lease("props", timeout=5, lease_ttl=3600)
            await RolloutClient(client).configure("props", batch_groups=1, group_size=2)
        return Own("props", lease.id, lease.sandboxes[0].id, "props")

    yield live.run(make())


async def _unary(app: App, method: str, request: Any, reply: type[Any]) -> tuple[grpc.StatusCode, str, Any]:
    """Code, details and reply of one unary call, by its full method name."""
    async with grpc.aio.insecure_channel(app.address) as channel:
        call = channel.unary_unary(
            method, request_serializer=lambda m: m.SerializeToString(), response_deserializer=reply.FromString
        )
        try:
            return grpc.StatusCode.OK, "", await call(request, timeout=5)
        except grpc.aio.AioRpcError as e:
            return e.code(), e.details() or "", None


def _inside_roots(cwd: str) -> bool:
    full = posixpath.normpath(cwd if cwd.startswith("/") else f"/workspace/{cwd}")
    return any(full == r or full.startswith(r + "/") for r in ROOTS)


def _allowed_cwd(cwd: str) -> bool:
    """Absolute cwds are kept; relative ones must stay beneath /workspace."""
    if cwd.startswith("/"):
        return True
    full = posixpath.normpath(f"/workspace/{cwd}")
    return full == "/workspace" or full.startswith("/workspace/")


def test_exec_cwd_stays_beneath_the_workspace_or_is_refused(live: Live, own: Own) -> None:
    @PROPERTY
    @given(cwd=st.one_of(PATHS, st.sampled_from(TRICKY)))
    def run(cwd: str) -> None:
        request = exec_pb2.ExecRequest(sandbox_id=own.sandbox_id, shell="pwd", cwd=cwd)
        code, details, reply = live.run(
            _unary(live.app, "/sandboxd.v1.ExecService/Exec", request, exec_pb2.ExecResponse)
        )
        if cwd and ("\x00" in cwd or len(cwd) > 4096 or not _allowed_cwd(cwd)):
            assert code == grpc.StatusCode.INVALID_ARGUMENT, (cwd, code, details)
            assert details.startswith("cwd: "), (cwd, details)
            return
        assert code == grpc.StatusCode.OK, (cwd, code, details)
        if reply.result.exit_code == 0 and not cwd.startswith("/"):
            where = reply.result.stdout.decode().rstrip("\n")
            assert where == "/workspace" or where.startswith("/workspace/"), (cwd, where)

    run()


def _good_run_name(name: str) -> bool:
    return (
        0 < len(name) <= 128
        and "/" not in name
        and not any(unicodedata.category(c) in ("Cc", "Cs") for c in name)
    )


def test_run_names_are_taken_only_when_clean(live: Live, own: Own) -> None:
    @PROPERTY
    @given(name=st.one_of(st.text(max_size=140), st.sampled_from(TRICKY)))
    def run(name: str) -> None:
        expected = grpc.StatusCode.OK if _good_run_name(name) else grpc.StatusCode.INVALID_ARGUMENT
        configure = rollouts_pb2.ConfigureRunRequest(run=name, config=rollouts_pb2.RunConfig(batch_groups=1))
        figures = rollouts_pb2.GetFiguresRequest(run=name)
        for method, request, reply in [
            ("ConfigureRun", configure, rollouts_pb2.ConfigureRunResponse),
            ("GetFigures", figures, rollouts_pb2.GetFiguresResponse),
        ]:
            path = f"/sandboxd.v1.RolloutService/{method}"
            code, details, _ = live.run(_unary(live.app, path, request, reply))
            assert code == expected, (method, name, code, details)
            if code != grpc.StatusCode.OK:
                assert details.startswith("run: "), (method, name, details)

    run()


def test_slot_counts_below_one_are_refused(live: Live, own: Own) -> None:
    @PROPERTY
    @given(count=INT32S)
    def run(count: int) -> None:
        request = rollouts_pb2.RequestSlotsRequest(run=own.run, count=count)
        path = "/sandboxd.v1.RolloutService/RequestSlots"
        code, details, _ = live.run(_unary(live.app, path, request, rollouts_pb2.RequestSlotsResponse))
        if count < 1:
            assert code == grpc.StatusCode.INVALID_ARGUMENT, (count, code, details)
            assert details.startswith("count: "), (count, details)
        else:
            assert code in (grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED), (count, code, details)

    run()


def test_acquire_counts_are_checked(live: Live, own: Own) -> None:
    @PROPERTY
    @given(n=INT32S, min_n=INT32S)
    def run(n: int, min_n: int) -> None:
        request = sandboxes_pb2.AcquireRequest(pool=own.pool, n=n, min_n=min_n, timeout_seconds=0.05)
        path = "/sandboxd.v1.SandboxService/Acquire"
        code, details, reply = live.run(_unary(live.app, path, request, sandboxes_pb2.AcquireResponse))
        wanted = n or 1
        if n < 0:
            assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("n: "), (n, min_n, code)
        elif min_n < 0 or min_n > wanted:
            assert code == grpc.StatusCode.INVALID_ARGUMENT, (n, min_n, code, details)
            assert details.startswith("min_n: "), (n, min_n, details)
        elif (min_n or wanted) > PROPERTY_POOL_SIZE:
            assert code == grpc.StatusCode.FAILED_PRECONDITION, (n, min_n, code, details)
        else:
            assert code in (grpc.StatusCode.OK, grpc.StatusCode.DEADLINE_EXCEEDED), (n, min_n, code, details)
        if reply is not None:
            assert (min_n or wanted) <= len(reply.sandboxes) <= wanted
            release = sandboxes_pb2.ReleaseRequest(lease_id=reply.lease.id)
            path = "/sandboxd.v1.SandboxService/Release"
            live.run(_unary(live.app, path, release, sandboxes_pb2.ReleaseResponse))

    run()


# Links planted in the property sandbox: out of /workspace (to /, to /tmp,
# through a chain, with ".." in the target), out of /tmp, and one inside.
LINKS = {
    "/workspace/r": "/",
    "/workspace/t": "/tmp",
    "/workspace/chain": "r",
    "/workspace/up": "../..",
    "/workspace/inroot": "real",
    "/tmp/tr": "/",
}
LINK_PATHS = st.builds(
    lambda absolute, parts: ("/" if absolute else "") + "/".join(parts),
    st.booleans(),
    st.lists(st.sampled_from(["r", "t", "chain", "up", "inroot", "tr", "real", "f", "..", ".", "tmp", "etc"]),
             min_size=1, max_size=5),
)  # fmt: skip


def _through_link(path: str) -> str | None:
    """The planted link a file path passes through, if any (as a directory
    on the way; the path itself being a link is a different refusal)."""
    full = posixpath.normpath(path if path.startswith("/") else f"/workspace/{path}")
    parts = full.strip("/").split("/")
    for i in range(1, len(parts)):
        prefix = "/" + "/".join(parts[:i])
        if prefix in LINKS:
            return prefix
    return None


def test_file_paths_through_planted_links_are_refused(live: Live, own: Own) -> None:
    """ReadFiles, WriteFiles and DownloadDirectory of generated path shapes
    over planted links: a path on the way through a link is INVALID_ARGUMENT
    naming it, and no write lands below a link."""
    (box,) = [b for b in live.backend.sandboxes.values() if b.spec.sandbox_id == own.sandbox_id]

    def plant() -> None:
        box.links.clear()
        box.links.update(LINKS)
        for path in [p for p in box.files if p.startswith(("/workspace/", "/tmp/"))]:
            del box.files[path]
        box.dirs.add("/workspace/real")
        box.files["/workspace/real/f"] = (b"inside", 0o644)

    @PROPERTY
    @given(path=LINK_PATHS, call=st.sampled_from(["read", "write", "download"]))
    def run(path: str, call: str) -> None:
        plant()  # a write over a link itself replaces it, as documented
        reply: Any
        if call == "read":
            request: Any = files_pb2.ReadFilesRequest(sandbox_id=own.sandbox_id, paths=[path])
            method, reply = "ReadFiles", files_pb2.ReadFilesResponse
        elif call == "write":
            request = files_pb2.WriteFilesRequest(
                sandbox_id=own.sandbox_id, files=[files_pb2.File(path=path, content=b"x")]
            )
            method, reply = "WriteFiles", files_pb2.WriteFilesResponse
        else:
            request = files_pb2.DownloadDirectoryRequest(sandbox_id=own.sandbox_id, path=path)
            method, reply = "DownloadDirectory", files_pb2.DownloadChunk
        if call == "download":
            code, details = live.run(_download(live.app, request))
        else:
            code, details, _ = live.run(
                _unary(live.app, f"/sandboxd.v1.FileService/{method}", request, reply)
            )
        assert code not in BAD_STATUSES, (path, call, code, details)
        full = posixpath.normpath(path if path.startswith("/") else f"/workspace/{path}")
        link = _through_link(path) if _inside_roots(path) else None
        if call == "download" and full in LINKS:
            link = full
        if link is not None:
            assert code == grpc.StatusCode.INVALID_ARGUMENT, (path, call, code, details)
            assert f"{link} is a symbolic link" in details, (path, call, details)
        for written in [*box.files, *box.dirs]:
            assert _through_link(written) is None, (path, call, written)

    try:
        run()
    finally:
        box.links.clear()


async def _download(app: App, request: Any) -> tuple[grpc.StatusCode, str]:
    """Code and details of a DownloadDirectory call, its stream read whole."""
    async with grpc.aio.insecure_channel(app.address) as channel:
        call = channel.unary_stream(
            "/sandboxd.v1.FileService/DownloadDirectory",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=files_pb2.DownloadChunk.FromString,
        )
        try:
            async for _ in call(request, timeout=5):
                pass
            return grpc.StatusCode.OK, ""
        except grpc.aio.AioRpcError as e:
            return e.code(), e.details() or ""


# -- bytes that are not UTF-8 in every string field ---------------------------------

_MARK = b"ZQ0MARK0QZ"
_BAD = b"ZQ\xffMARK\xc3Z"  # same length: the field's length prefix stays right


def _string_paths(desc: d.Descriptor, depth: int = 0) -> list[tuple[d.FieldDescriptor, ...]]:
    """Every string field reachable from ``desc`` (map keys and values, nested messages)."""
    out: list[tuple[d.FieldDescriptor, ...]] = []
    if depth > 2 or desc.full_name.startswith("google.protobuf."):
        return out
    for field in desc.fields:
        if field.type == d.FieldDescriptor.TYPE_STRING:
            out.append((field,))
        elif field.message_type is not None:
            out.extend((field, *rest) for rest in _string_paths(field.message_type, depth + 1))
    return out


def _with_mark(desc: d.Descriptor, path: tuple[d.FieldDescriptor, ...]) -> bytes:
    """A message of type ``desc`` whose field at ``path`` holds the marker, serialized."""
    msg = message_factory.GetMessageClass(desc)()
    target, mark, i = msg, _MARK.decode(), 0
    while i < len(path) - 1:
        field = path[i]
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            entry, container = path[i + 1], getattr(target, field.name)
            key_field = field.message_type.fields_by_name["key"]
            key: Any = "k" if key_field.type == d.FieldDescriptor.TYPE_STRING else 1
            if entry.name == "key":
                container[mark]  # naming a key makes its entry
                return bytes(msg.SerializeToString())
            if entry.type == d.FieldDescriptor.TYPE_STRING:
                container[key] = mark
                return bytes(msg.SerializeToString())
            target, i = container[key], i + 2
            continue
        target = getattr(target, field.name).add() if _repeated(field) else getattr(target, field.name)
        i += 1
    last = path[-1]
    if _repeated(last):
        getattr(target, last.name).append(mark)
    else:
        setattr(target, last.name, mark)
    return bytes(msg.SerializeToString())


async def _raw_call(app: App, method: d.MethodDescriptor, payload: bytes) -> grpc.StatusCode:
    path = f"/{method.containing_service.full_name}/{method.name}"
    kw: dict[str, Any] = dict(request_serializer=lambda b: b, response_deserializer=lambda b: b)
    async with grpc.aio.insecure_channel(app.address) as channel:
        try:
            if method.client_streaming:
                await channel.stream_unary(path, **kw)(iter([payload]), timeout=5)
            elif method.server_streaming:
                async for _ in channel.unary_stream(path, **kw)(payload, timeout=5):
                    pass
            else:
                await channel.unary_unary(path, **kw)(payload, timeout=5)
        except grpc.aio.AioRpcError as e:
            return e.code()
    return grpc.StatusCode.OK


@pytest.mark.parametrize("method", METHODS, ids=lambda m: f"{m.containing_service.name}.{m.name}")
def test_every_string_field_that_is_not_utf8_is_invalid_argument(
    live: Live, method: d.MethodDescriptor
) -> None:
    """Bytes a client can put on the wire in any string field (a proto
    library does not check them all): INVALID_ARGUMENT, never UNKNOWN or a
    call that is not answered."""
    paths = _string_paths(method.input_type)
    if not paths:
        pytest.skip(f"{method.input_type.full_name} has no string field")
    for path in paths:
        good = _with_mark(method.input_type, path)
        assert _MARK in good, path
        code = live.run(_raw_call(live.app, method, good.replace(_MARK, _BAD)))
        where = ".".join(f.name for f in path)
        assert code == grpc.StatusCode.INVALID_ARGUMENT, f"{method.full_name} {where}: {code}"


def test_nothing_leaked_after_fuzzing(live: Live) -> None:
    """Every sandbox the fake backend holds is known to the control plane."""

    async def check() -> tuple[set[str], set[str]]:
        known = {r.handle for pool in live.app.control.pools.values() for r in pool.records.values()}
        await asyncio.gather(*(p.drain() for p in live.app.control.pools.values()))
        return set(live.backend.sandboxes), known

    held, known = live.run(check())
    assert held <= known, f"orphans: {held - known}"
