"""The E2B front end's translations, checked against the SDK's own decoders
where it has them: Connect framing (parsed by the SDK's stream parser and
into its generated messages), command ends and their errors, requests'
validation, entries, metadata filters and multipart paths."""

from __future__ import annotations

import json
import struct

import pytest

from sandboxd import errors
from sandboxd.client import ExecResult
from sandboxd.e2b.connect import ConnectError, b64, code_for, end_frame, frame, unb64
from sandboxd.e2b.control import Refused, metadata_query, timeout_of
from sandboxd.e2b.envd import part_path
from sandboxd.e2b.filesystem import entry_from_line
from sandboxd.e2b.processes import end_event, exec_user, input_bytes, process_config, selected_pid

# The SDK (e2b 2.63) reads envd's streams with connectrpc's Connect envelope
# reader and protobuf-py messages: the same reader and messages decode here.
connect_protocol = pytest.importorskip("connectrpc._protocol_connect")
connect_errors = pytest.importorskip("connectrpc.errors")
from connectrpc._compression import IdentityCompression  # noqa: E402
from connectrpc.code import Code  # noqa: E402
from connectrpc.codec import proto_json_codec  # noqa: E402

process_pb = pytest.importorskip("e2b.envd.process.process_pb")
filesystem_pb = pytest.importorskip("e2b.envd.filesystem.filesystem_pb")


def _reader() -> object:
    return connect_protocol.ConnectEnvelopeReader(
        process_pb.StartResponse, proto_json_codec(), IdentityCompression(), None
    )


def _parse(data: bytes) -> list[object]:
    return list(_reader().feed(data))  # type: ignore[attr-defined]


def _result(outcome: str, exit_code: int = 0, detail: str = "") -> ExecResult:
    return ExecResult(
        outcome=outcome, exit_code=exit_code, stdout=b"", stderr=b"", duration=0.1, detail=detail
    )


def test_stream_frames_decode_in_the_sdk_even_split_anywhere() -> None:
    data = (
        frame({"event": {"start": {"pid": 7}}})
        + frame({"event": {"data": {"stdout": b64(b"hi\n")}}})
        + frame(end_event(_result("EXITED", 3)))  # type: ignore[arg-type]
        + end_frame()
    )
    whole = _parse(data)
    reader = _reader()
    split = [m for i in range(len(data)) for m in reader.feed(data[i : i + 1])]  # type: ignore[attr-defined]
    assert split == whole
    start, out, end = (m.event.event for m in whole)  # type: ignore[attr-defined]
    assert (start.field, start.value.pid) == ("start", 7)
    assert (out.field, out.value.output.field, out.value.output.value) == ("data", "stdout", b"hi\n")
    assert (end.field, end.value.exit_code, end.value.exited) == ("end", 3, True)


def test_an_error_end_frame_is_the_sdks_connect_exception() -> None:
    data = frame({"event": {"start": {"pid": 1}}}) + end_frame(ConnectError("deadline_exceeded", "late"))
    with pytest.raises(connect_errors.ConnectError) as exc:
        _parse(data)
    assert exc.value.code == Code.DEADLINE_EXCEEDED and exc.value.message == "late"


@pytest.mark.parametrize(
    ("outcome", "code"),
    [("TIMED_OUT", "deadline_exceeded"), ("SANDBOX_LOST", "aborted"), ("OUTPUT_TRUNCATED", "out_of_range")],
)
def test_command_ends_that_are_not_exit_codes(outcome: str, code: str) -> None:
    ended = end_event(_result(outcome, detail="container gone"))
    assert isinstance(ended, ConnectError) and ended.code == code


def test_signals_end_with_minus_one_and_say_why() -> None:
    killed = end_event(_result("KILLED"))
    oom = end_event(_result("OOM_KILLED", detail="limit 512 MiB"))
    assert isinstance(killed, dict) and isinstance(oom, dict)
    assert killed["event"]["end"] == {"exitCode": -1, "exited": False, "status": "signal: killed"}
    assert oom["event"]["end"]["error"] == "oom killed: limit 512 MiB"


def test_sandboxd_errors_keep_their_meaning() -> None:
    assert code_for(errors.NotFound("x")) == "not_found"
    assert code_for(errors.InvalidArgument("f", "bad")) == "invalid_argument"
    assert code_for(errors.SandboxLost("gone")) == "aborted"
    assert code_for(errors.DeadlineExceeded("late")) == "deadline_exceeded"
    assert code_for(errors.ResourceExhausted("full")) == "resource_exhausted"


def test_process_config_is_checked() -> None:
    argv, envs, cwd = process_config(
        {"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "ls"], "envs": {"A": "1"}, "cwd": "/tmp"}}
    )
    assert (argv, envs, cwd) == (["/bin/bash", "-l", "-c", "ls"], {"A": "1"}, "/tmp")
    for bad in (
        {},
        {"process": {"cmd": ""}},
        {"process": {"cmd": "x", "args": [1]}},
        {"process": {"cmd": "x", "envs": {"A": 1}}},
    ):
        with pytest.raises(ConnectError) as exc:
            process_config(bad)
        assert exc.value.code == "invalid_argument"


def test_selectors_input_and_users() -> None:
    assert selected_pid({"process": {"pid": 12}}) == (12, "")
    with pytest.raises(ConnectError):
        selected_pid({"process": {}})
    assert input_bytes({"input": {"stdin": b64(b"\x00data")}}) == b"\x00data"
    with pytest.raises(ConnectError) as exc:
        unb64("not base64!")
    assert exc.value.code == "invalid_argument"
    assert (exec_user("root"), exec_user("user"), exec_user("")) == ("root", "", "")


def test_entries_parse_into_the_sdks_entry_info() -> None:
    line = b"\0".join(
        [b"/tmp/d/b.txt", b"f", b"2", b"644", b"-rw-r--r--", b"root", b"root", b"1700000000.5", b""]
    )
    entry = entry_from_line(line)
    msg = filesystem_pb.EntryInfo.from_json(json.dumps(entry))
    assert (msg.name, msg.path, msg.size, msg.mode, msg.owner) == ("b.txt", "/tmp/d/b.txt", 2, 0o644, "root")
    assert msg.type == filesystem_pb.FileType.FILE
    assert msg.modified_time.seconds == 1700000000
    directory = b"\0".join([b"/tmp/d", b"d", b"4096", b"755", b"drwxr-xr-x", b"u", b"g", b"1.0", b""])
    assert entry_from_line(directory)["type"] == "FILE_TYPE_DIRECTORY"
    with pytest.raises(ConnectError):
        entry_from_line(b"truncated\0f")


def test_metadata_filters_and_timeouts() -> None:
    assert metadata_query("run=r1&user=a%26b") == {"run": "r1", "user": "a&b"}
    assert metadata_query("") == {}
    with pytest.raises(Refused):
        metadata_query("no-equals-sign")
    assert timeout_of({"timeout": 30}, 300) == 30 and timeout_of({}, 300) == 300
    for bad in (-1, 10**9, "30", True, 1.5):
        with pytest.raises(Refused) as exc:
            timeout_of({"timeout": bad}, 300)
        assert exc.value.status == 400


def test_multipart_paths_keep_their_directories() -> None:
    assert part_path('form-data; name="file"; filename="/home/user/a b.txt"') == "/home/user/a b.txt"
    assert part_path('form-data; name="file"; filename="/x/q\\"uote"') == '/x/q"uote'
    assert part_path('form-data; name="file"') == ""


def test_frame_lengths_are_big_endian_with_flags() -> None:
    data = end_frame()
    flags, length = struct.unpack(">BI", data[:5])
    assert (flags, length, data[5:]) == (2, 2, b"{}")
