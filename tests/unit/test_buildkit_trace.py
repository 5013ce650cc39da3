"""BuildKit's trace as the engine streams it: messages a real engine sent
(a RUN step starting, its output, its failure) decode to the step, its
output and its error; chunks that split lines are joined, lines too long are
cut, and whatever the build prints only a bounded tail is kept. Also the
builder an engine's /_ping headers choose, the credentials header, and a
context tar whose first header BuildKit can read."""

from __future__ import annotations

import base64
import io
import json
import tarfile
from pathlib import Path

import pytest

from sandboxd.backends.base import BuildSpec, RegistryAuth
from sandboxd.backends.docker.buildkit_trace import (
    MAX_LINE_CHARS,
    TAIL_LINES,
    Status,
    Trace,
    TraceError,
    Vertex,
    VertexLog,
    decode_status,
    step_of,
)
from sandboxd.backends.docker.builds import BUILDKIT, CLASSIC, builder_of, context_tar, registry_config

# Sent by Docker 20.10.24 building "FROM rootmini:1 / RUN echo captured-out; exit 4".
RUN_STARTED = (
    "CsUBCkdzaGEyNTY6OGFmNzJjYmEwZTViNTdhOWU1MGE0OWQ3N2YyNzcxNTYyMTdjMjZiZTQ2ZDkzZmQ2ZmU0OGVlYzFiNWQ4ZDQ3"
    "MxJHc2hhMjU2Ojg3MWVjNmRjMDlmZTliYTFmZGRjNGFiZjk0NWEyNTk3NTY0OWIwMDQ5MGM0Nzk3NTgxNjBhM2M3MGZkODhhN2Ia"
    "I1syLzJdIFJVTiBlY2hvIGNhcHR1cmVkLW91dDsgZXhpdCA0KgwI7o3Z2AYQw+Cj8gI="
)
RUN_OUTPUT = (
    "GmgKR3NoYTI1Njo4YWY3MmNiYTBlNWI1N2E5ZTUwYTQ5ZDc3ZjI3NzE1NjIxN2MyNmJlNDZkOTNmZDZmZTQ4ZWVjMWI1ZDhkNDcz"
    "EgwI7o3Z2AYQg5eyswMYASINY2FwdHVyZWQtb3V0Cg=="
)
RUN_FAILED = (
    "CqACCkdzaGEyNTY6OGFmNzJjYmEwZTViNTdhOWU1MGE0OWQ3N2YyNzcxNTYyMTdjMjZiZTQ2ZDkzZmQ2ZmU0OGVlYzFiNWQ4ZDQ3"
    "MxJHc2hhMjU2Ojg3MWVjNmRjMDlmZTliYTFmZGRjNGFiZjk0NWEyNTk3NTY0OWIwMDQ5MGM0Nzk3NTgxNjBhM2M3MGZkODhhN2Ia"
    "I1syLzJdIFJVTiBlY2hvIGNhcHR1cmVkLW91dDsgZXhpdCA0KgwI7o3Z2AYQw+Cj8gIyCwjvjdnYBhCs2+YIOkxleGVjdXRvciBm"
    "YWlsZWQgcnVubmluZyBbL2Jpbi9zaCAtYyBlY2hvIGNhcHR1cmVkLW91dDsgZXhpdCA0XTogZXhpdCBjb2RlOiA0"
)
RUN_DIGEST = "sha256:8af72cba0e5b57a9e50a49d77f277156217c26be46d93fd6fe48eec1b5d8d473"
ERROR = "executor failed running [/bin/sh -c echo captured-out; exit 4]: exit code: 4"


def test_messages_of_a_real_engine_decode() -> None:
    started = decode_status(RUN_STARTED)
    [vertex] = started.vertexes
    assert (vertex.digest, vertex.name, vertex.cached, vertex.error) == (
        RUN_DIGEST,
        "[2/2] RUN echo captured-out; exit 4",
        False,
        "",
    )
    assert vertex.started > 1.7e9 and vertex.completed == 0.0
    [log] = decode_status(RUN_OUTPUT).logs
    assert (log.vertex, log.data) == (RUN_DIGEST, b"captured-out\n")
    assert log.at > vertex.started
    [failed] = decode_status(RUN_FAILED).vertexes
    assert failed.error == ERROR and failed.completed > failed.started


def test_a_failing_step_is_logged_and_named_with_its_output() -> None:
    trace = Trace()
    lines = [
        line for aux in (RUN_STARTED, RUN_OUTPUT, RUN_FAILED) for line in trace.lines(decode_status(aux))
    ]
    assert lines[0] == "#1 [2/2] RUN echo captured-out; exit 4"
    assert lines[1].startswith("#1 0.") and lines[1].endswith(" captured-out")
    assert lines[2] == f"#1 ERROR: {ERROR}"
    assert trace.failure is not None
    assert trace.failure.step == "RUN echo captured-out; exit 4"
    assert trace.failure.error == ERROR
    assert trace.failure.tail == ("captured-out",)


def test_steps_are_numbered_cached_and_timed() -> None:
    trace = Trace()
    out = list(
        trace.lines(
            Status(
                vertexes=[
                    Vertex("a", "[internal] load metadata"),
                    Vertex("b", "[1/3] FROM base", cached=True, started=10.0, completed=10.0),
                    Vertex("c", "[2/3] RUN make", started=10.0),
                ]
            )
        )
    )
    out += trace.lines(Status(vertexes=[Vertex("c", "[2/3] RUN make", started=10.0, completed=11.25)]))
    # A step reported again after it ended adds nothing.
    out += trace.lines(Status(vertexes=[Vertex("c", "[2/3] RUN make", started=10.0, completed=11.25)]))
    assert out == ["#2 [1/3] FROM base", "#2 CACHED", "#3 [2/3] RUN make", "#3 DONE 1.2s"]
    assert trace.failure is None


def test_output_split_across_messages_is_joined_and_bounded() -> None:
    trace = Trace()
    list(trace.lines(Status(vertexes=[Vertex("r", "[1/1] RUN gen", started=5.0)])))
    chunks = [b"par", b"tial\nwhole\n", b"x" * (MAX_LINE_CHARS + 10), b"\n"]
    lines = [line for chunk in chunks for line in trace.lines(Status(logs=[VertexLog("r", 5.5, chunk)]))]
    assert lines[:2] == ["#1 0.500 partial", "#1 0.500 whole"]
    # A line with no end in sight is cut rather than held.
    assert lines[2].endswith(" [...]") and len(lines[2]) < MAX_LINE_CHARS + 40
    for n in range(TAIL_LINES * 3):
        list(trace.lines(Status(logs=[VertexLog("r", 6.0, f"line {n}\n".encode())])))
    list(trace.lines(Status(logs=[VertexLog("r", 6.0, b"no newline")])))
    ended = list(
        trace.lines(Status(vertexes=[Vertex("r", "[1/1] RUN gen", started=5.0, completed=7.0, error="boom")]))
    )
    assert ended == ["#1 1.000 no newline", "#1 ERROR: boom"]
    assert trace.failure is not None
    assert len(trace.failure.tail) == TAIL_LINES and trace.failure.tail[-1] == "no newline"


def test_steps_cancelled_by_the_failure_are_not_the_failure() -> None:
    trace = Trace()
    list(
        trace.lines(
            Status(
                vertexes=[
                    Vertex("x", "[a 2/2] RUN sleep 9", started=1.0, completed=2.0, error="context canceled"),
                    Vertex("y", "[b 2/2] RUN false", started=1.0, completed=2.0, error="exit code: 1"),
                ]
            )
        )
    )
    assert trace.failure is not None and trace.failure.step == "RUN false"


def test_what_is_not_a_status_response_is_refused() -> None:
    with pytest.raises(TraceError):
        decode_status("not base64!")
    with pytest.raises(TraceError):
        decode_status(base64.b64encode(b"\x0a\x10short").decode())  # length past the end
    with pytest.raises(TraceError):
        decode_status(base64.b64encode(b"\x0b").decode())  # wire type 3 (groups)


def test_step_names() -> None:
    assert step_of("[stage-0 4/4] RUN make -j") == "RUN make -j"
    assert step_of("[internal] load metadata for x") == "load metadata for x"
    assert step_of("copy /context /") == "copy /context /"


def test_the_builder_follows_the_engines_word() -> None:
    assert builder_of({"Api-Version": "1.41"}, has_bridge=True).name == BUILDKIT
    assert builder_of({"Builder-Version": "2"}, has_bridge=True).name == BUILDKIT
    off = builder_of({"Builder-Version": "1"}, has_bridge=True)
    assert off.name == CLASSIC and "features.buildkit=false" in off.describe()
    assert builder_of({"OSType": "windows"}, has_bridge=True).name == CLASSIC
    bare = builder_of({}, has_bridge=False)
    assert bare.name == BUILDKIT and bare.network_none


def test_registry_credentials_go_in_one_header() -> None:
    header = registry_config(
        {
            "127.0.0.1:5000": RegistryAuth("127.0.0.1:5000", "rl", "pw"),
            "ghcr.io": RegistryAuth("ghcr.io", identity_token="tok"),
        }
    )
    decoded = json.loads(base64.urlsafe_b64decode(header))
    assert decoded["127.0.0.1:5000"] == {
        "username": "rl",
        "password": "pw",
        "serveraddress": "127.0.0.1:5000",
    }
    assert decoded["ghcr.io"]["identitytoken"] == "tok"


def test_the_context_tar_opens_with_a_header_buildkit_reads(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 120)
    deep.mkdir()
    (deep / "file").write_text("x")
    (tmp_path / "Dockerfile").write_text("FROM scratch\n")
    tar = context_tar(BuildSpec(tmp_path, "t:1")).getvalue()
    # BuildKit reads 1,024 bytes and needs one whole entry header in them.
    with tarfile.open(fileobj=io.BytesIO(tar[:1024] + b"\0" * 1024)) as head:
        assert head.next() is not None
    with tarfile.open(fileobj=io.BytesIO(tar)) as whole:
        assert sorted(whole.getnames()) == sorted(["Dockerfile", "d" * 120, "d" * 120 + "/file"])
