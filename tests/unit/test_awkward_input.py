"""Awkward input through the gRPC API (fake backend): bytes that are not
UTF-8 on the wire and in a session's state, messages that name them, names
with a trailing newline, reserved labels, and stdin and command sizes at and
past their limits. Every call answers a proper status; nothing half-stored
breaks a later one."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from sandboxd import errors
from sandboxd.api.errors import ErrorInterceptor
from sandboxd.app import App, build_app
from sandboxd.backends.fake import FakeBackend
from sandboxd.client import AsyncClient
from sandboxd.core import validation as v
from sandboxd.core.control import ExecRequest
from sandboxd.core.snapshots import LABEL_SNAPSHOT
from sandboxd.v1 import sandboxes_pb2
from tests.unit.conftest import IMAGE, MakeApp, make_settings

pytestmark = pytest.mark.timeout(60)


async def _raw(
    app: App, method: str, payload: bytes, *, stream_in: bool = False, stream_out: bool = False
) -> Any:
    """(code, details) of a call whose request is ``payload`` as it is on the wire."""
    async with grpc.aio.insecure_channel(app.address) as channel:
        kw: dict[str, Any] = dict(request_serializer=lambda b: b, response_deserializer=lambda b: b)
        try:
            if stream_in:
                await channel.stream_unary(method, **kw)(iter([payload]), timeout=5)
            elif stream_out:
                async for _ in channel.unary_stream(method, **kw)(payload, timeout=5):
                    pass
            else:
                await channel.unary_unary(method, **kw)(payload, timeout=5)
        except grpc.aio.AioRpcError as e:
            return e.code(), e.details() or ""
    return grpc.StatusCode.OK, ""


def _string_field(number: int, raw: bytes) -> bytes:
    """A length-delimited field as a string field is encoded, holding ``raw``."""
    return bytes([number << 3 | 2, len(raw)]) + raw


@pytest.mark.parametrize(
    ("method", "kind"),
    [
        ("/sandboxd.v1.PoolService/GetPool", "unary"),
        ("/sandboxd.v1.SandboxService/GetSandbox", "unary"),
        ("/sandboxd.v1.ExecService/ExecStream", "stream_out"),
        ("/sandboxd.v1.FileService/UploadDirectory", "stream_in"),
        ("/sandboxd.v1.SnapshotService/GetSnapshot", "unary"),
    ],
)
@pytest.mark.parametrize("raw", [b"\xff\xfe", b"ok\xc3", b"\xed\xa0\x80"], ids=["ff", "cut", "surrogate"])
async def test_a_string_field_that_is_not_utf8_is_invalid_argument(
    app: App, method: str, kind: str, raw: bytes
) -> None:
    code, details = await _raw(
        app, method, _string_field(1, raw), stream_in=kind == "stream_in", stream_out=kind == "stream_out"
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
    assert "UTF-8" in details


async def test_a_message_with_bytes_that_are_not_utf8_is_still_sent() -> None:
    # A refusal naming what a sandbox produced (held as surrogate escapes)
    # must reach the client, escaped, not hang the call.
    async def refuse(request: bytes, context: Any) -> bytes:
        error = errors.FailedPrecondition("refused")
        # As a message made anywhere (an error's own text is escaped when it
        # is built; the mapping must not depend on it).
        error.message = "/workspace/caf\udce9: cannot be carried (\ud800)"
        raise error

    handler = grpc.method_handlers_generic_handler(
        "t.T", {"M": grpc.unary_unary_rpc_method_handler(refuse, lambda b: b, lambda b: b)}
    )
    server = grpc.aio.server(interceptors=[ErrorInterceptor()])
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_unary(
                "/t.T/M", request_serializer=lambda b: b, response_deserializer=lambda b: b
            )
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await call(b"", timeout=5)
    finally:
        await server.stop(0)
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert caught.value.details() == "/workspace/caf\\xe9: cannot be carried (\\ud800)"


def test_printable_escapes_only_what_cannot_be_encoded() -> None:
    assert errors.printable("plain ü 😀") == "plain ü 😀"
    assert errors.printable("a\udcffb") == "a\\xffb"
    assert errors.printable("\ud83d") == "\\ud83d"


# -- session state as bytes ------------------------------------------------------

ODD_CWD = "/tmp/d\udcff\n"
ODD_ENV = {"ODD": "v\udcfe\udc80\nline", "PLAIN": "ok"}


async def _odd_session(app: App, client: AsyncClient) -> Any:
    """A leased sandbox whose session "agent" has a cwd and a variable that are not UTF-8."""
    await client.create_pool("p", IMAGE, min_ready=1, max_size=8)
    lease = await client.lease("p", timeout=5)
    assert (await lease[0].exec("true", session="agent")).ok
    backend = app.control.backend
    assert isinstance(backend, FakeBackend)
    (box,) = [b for b in backend.sandboxes.values() if b.spec.sandbox_id == lease[0].id]
    box.dirs.add(ODD_CWD)
    box.sessions["agent"].cwd = ODD_CWD
    box.sessions["agent"].env.update(ODD_ENV)
    return lease


def _exact(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


async def test_a_session_state_that_is_not_utf8_travels_as_bytes_and_restores_exactly(
    app: App, client: AsyncClient
) -> None:
    lease = await _odd_session(app, client)
    snap = await lease[0].snapshot(session="agent")
    assert snap.cwd_bytes == _exact(ODD_CWD) and snap.cwd == "/tmp/d\\xff\n"
    assert dict(snap.env_bytes) == {k: _exact(val) for k, val in ODD_ENV.items()}
    assert snap.env["ODD"] == "v\\xfe\\x80\nline" and snap.env["PLAIN"] == "ok"
    assert [s.id for s in await client.list_snapshots()] == [snap.id]
    assert (await client.get_snapshot(snap.id)).cwd_bytes == _exact(ODD_CWD)

    backend = app.control.backend
    assert isinstance(backend, FakeBackend)
    for other in backend.sandboxes.values():  # /tmp is not carried: the directory is the target's own
        other.dirs.add(ODD_CWD)
    restored = await client.restore(snap.id, timeout=5)
    (box,) = [b for b in backend.sandboxes.values() if b.spec.sandbox_id == restored[0].id]
    shell = box.sessions["agent"]
    assert shell.cwd == ODD_CWD
    assert {k: shell.env[k] for k in ODD_ENV} == ODD_ENV


async def test_listing_survives_a_record_that_cannot_be_decoded_across_a_restart(
    make_app: MakeApp, tmp_path: Path
) -> None:
    async def started() -> App:
        app = build_app(make_settings(state_dir=str(tmp_path)), backend=FakeBackend(), persist=True)
        await app.start()
        return app

    app = await started()
    try:
        async with AsyncClient(app.address) as client:
            lease = await _odd_session(app, client)
            good = await lease[0].snapshot(session="agent")
            bad = await lease[0].snapshot(labels={"k": "v"})
    finally:
        await app.stop(grace=0.5)
    db = sqlite3.connect(tmp_path / "unit-snapshots.sqlite3")
    with db:  # what an older or damaged server might have left: not JSON, not UTF-8
        db.execute("UPDATE snapshots SET meta = CAST(? AS BLOB) WHERE id = ?", (b'{"id": "\xff', bad.id))
    db.close()

    app = await started()
    try:
        async with AsyncClient(app.address) as client:
            listed = await client.list_snapshots()
            assert [s.id for s in listed] == [good.id]
            assert listed[0].cwd_bytes == _exact(ODD_CWD)
            assert [s.id for s in await client.list_snapshots(labels={"k": "v"})] == []
            with pytest.raises(errors.FailedPrecondition, match="cannot be read"):
                await client.get_snapshot(bad.id)
            # Its tenant can still delete it; afterwards it is gone.
            await client.delete_snapshot(bad.id)
            with pytest.raises(errors.NotFound):
                await client.get_snapshot(bad.id)
            assert [s.id for s in await client.list_snapshots()] == [good.id]
    finally:
        await app.stop(grace=0.5)


# -- names: whole-string matches ---------------------------------------------------

AWKWARD = ["name\n", "na\nme", "name\x00", "nämé", "\n"]


@pytest.mark.parametrize("value", AWKWARD)
def test_every_validator_refuses_newlines_nul_and_non_ascii(value: str) -> None:
    checks = [
        lambda: v.pool_name("pool", value),
        lambda: v.image_ref("image", value),
        lambda: v.object_id("id", "sb-abcdef" + value, "sandbox"),
        lambda: v.request_id("request_id", value),
        lambda: v.session_name("session", value),
        lambda: v.labels("labels", {value: "x"}),
        lambda: v.env("env", {value: "x"}),
        lambda: v.env("env", {"A" + value: "x"}),
    ]
    if value.isascii():  # free-form names (runs, trajectories) may be any text but control characters
        checks.append(lambda: v.name_text("run", value))
    checks.append(lambda: v.exec_user("user", "root" + value))
    if "\x00" in value:  # paths and values may hold any character but NUL
        checks += [
            lambda: v.workspace_path("path", "a" + value),
            lambda: v.file_path("path", "/tmp/a" + value),
            lambda: v.exec_cwd("cwd", "/a" + value),
            lambda: v.labels("labels", {"k": value}),
            lambda: v.env("env", {"A": value}),
            lambda: v.shell("shell", "echo " + value),
            lambda: v.argv("argv", ["echo", value]),
        ]
    for i, check in enumerate(checks):
        with pytest.raises(errors.InvalidArgument):
            check()
            pytest.fail(f"check {i} took {value!r}")


async def test_names_with_a_trailing_newline_are_refused_by_the_api(app: App, client: AsyncClient) -> None:
    with pytest.raises(errors.InvalidArgument, match="spec.name"):
        await client.create_pool("p\n", IMAGE)
    await client.create_pool("p", IMAGE, min_ready=1, max_size=4)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await client.sandboxes.Acquire(sandboxes_pb2.AcquireRequest(pool="p", request_id="r1\n"), timeout=5)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (caught.value.details() or "").startswith("request_id")
    with pytest.raises(errors.InvalidArgument, match="labels"):
        await client.lease("p", timeout=5, labels={"k\n": "v"})
    lease = await client.lease("p", timeout=5)
    with pytest.raises(errors.InvalidArgument, match="session"):
        await lease[0].exec("true", session="s\n")
    with pytest.raises(errors.InvalidArgument, match="env"):
        await lease[0].exec("true", env={"A\n": "x"})


# -- reserved labels ----------------------------------------------------------------


def test_every_label_sandboxd_sets_is_reserved() -> None:
    from sandboxd.backends import base
    from sandboxd.backends.docker import containers, containerspec, egress, users
    from sandboxd.backends.kubernetes import podspec
    from sandboxd.core.snapshots import lineage

    keys = {
        value
        for module in (base, containers, containerspec, egress, users, podspec, lineage)
        for name, value in vars(module).items()
        if name.startswith("LABEL_") and isinstance(value, str) and value.startswith("sandboxd.")
    }
    assert keys
    for key in keys:
        with pytest.raises(errors.InvalidArgument, match="sets itself"):
            v.settable_labels("labels", {key: "x"})


async def test_reserved_labels_cannot_be_set_but_can_be_filtered_on(app: App, client: AsyncClient) -> None:
    forged = {LABEL_SNAPSHOT: "sn-" + "1" * 24}
    with pytest.raises(errors.InvalidArgument, match="sets itself"):
        await client.create_pool("q", IMAGE, labels={"sandboxd.pool": "other"})
    await client.create_pool("p", IMAGE, min_ready=1, max_size=4)
    with pytest.raises(errors.InvalidArgument, match=r"labels\[sandboxd.snapshot\]"):
        await client.lease("p", timeout=5, labels=forged)
    lease = await client.lease("p", timeout=5)
    with pytest.raises(errors.InvalidArgument, match="sets itself"):
        await lease[0].snapshot(labels={"sandboxd.snapshot.turn": "9"})
    snap = await lease[0].snapshot()
    with pytest.raises(errors.InvalidArgument, match="sets itself"):
        await client.restore(snap.id, labels=forged, timeout=5)
    # A filter may name them.
    assert await client.list_sandboxes(labels=forged) == []
    assert await client.list_snapshots(labels={"sandboxd.run": "r"}) == []


# -- sizes ---------------------------------------------------------------------------


async def test_stdin_at_the_cap_is_taken_and_one_byte_more_refused(app: App, client: AsyncClient) -> None:
    cap = app.control.settings.exec.max_stdin_bytes
    await client.create_pool("p", IMAGE, min_ready=1, max_size=4)
    lease = await client.lease("p", timeout=5)
    for session in ("", "s"):
        assert (await lease[0].exec("true", stdin=b"x" * cap, session=session)).ok
        with pytest.raises(errors.InvalidArgument, match="stdin"):
            await lease[0].exec("true", stdin=b"x" * (cap + 1), session=session)


async def test_commands_at_the_limit_are_taken_and_past_it_refused(app: App, client: AsyncClient) -> None:
    await client.create_pool("p", IMAGE, min_ready=1, max_size=4)
    lease = await client.lease("p", timeout=5)
    at_limit = "true #" + "x" * (v.MAX_COMMAND - 6)
    # Taken (the fake's toy shell would spend long parsing it: run on the real engine's tests).
    _, spec = app.control.prepare_exec(ExecRequest(lease[0].id, shell=at_limit))
    assert spec.shell == at_limit
    _, spec = app.control.prepare_exec(ExecRequest(lease[0].id, argv=["echo", "x" * v.MAX_ARG]))
    assert spec.argv[1] == "x" * v.MAX_ARG
    with pytest.raises(errors.InvalidArgument, match="shell"):
        await lease[0].exec(at_limit + "x")
    with pytest.raises(errors.InvalidArgument, match=r"argv\[1\]"):
        await lease[0].exec(["echo", "x" * (v.MAX_ARG + 1)])
