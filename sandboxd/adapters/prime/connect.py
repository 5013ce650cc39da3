"""The Connect protocol as Prime's gateway speaks it for command sessions:
the ``command_session`` messages (a wire-compatible subset, built in a
private descriptor pool), the envelope framing of a server-streaming call,
and the error codes sandboxd's errors map to."""

from __future__ import annotations

import json
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from sandboxd import errors

__all__ = [
    "CONTENT_TYPE",
    "START_RPC",
    "ConnectError",
    "StartRequest",
    "StartResponse",
    "connect_code",
    "end_frame",
    "message_frame",
    "parse_start_request",
]

START_RPC = "command_session.CommandSession/Start"
"""The route (service/method) of the one RPC served."""

CONTENT_TYPE = "application/connect+proto"
"""The content type of a streamed Connect response."""

_F = descriptor_pb2.FieldDescriptorProto


def _field(
    name: str,
    number: int,
    kind: int,
    *,
    type_name: str = "",
    repeated: bool = False,
    oneof: int | None = None,
) -> descriptor_pb2.FieldDescriptorProto:
    f = _F(name=name, number=number, type=kind, label=_F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL)  # type: ignore[arg-type]
    if type_name:
        f.type_name = type_name
    if oneof is not None:
        f.oneof_index = oneof
    return f


def _optional(
    msg: descriptor_pb2.DescriptorProto, name: str, number: int, kind: int, type_name: str = ""
) -> None:
    """A proto3 ``optional`` field (presence kept) with its synthetic oneof."""
    msg.oneof_decl.add(name=f"_{name}")
    f = _field(name, number, kind, type_name=type_name, oneof=len(msg.oneof_decl) - 1)
    f.proto3_optional = True
    msg.field.append(f)


def _command_session() -> tuple[Any, Any]:
    """StartRequest and StartResponse of Prime's ``command_session`` package,
    built here (field numbers as the SDK's), in a private descriptor pool."""
    fd = descriptor_pb2.FileDescriptorProto(
        name="sandboxd/prime/command_session.proto", package="command_session", syntax="proto3"
    )
    pty = fd.message_type.add(name="PTY")
    size = pty.nested_type.add(name="Size")
    size.field.extend([_field("cols", 1, _F.TYPE_UINT32), _field("rows", 2, _F.TYPE_UINT32)])
    pty.field.append(_field("size", 1, _F.TYPE_MESSAGE, type_name=".command_session.PTY.Size"))
    spec = fd.message_type.add(name="CommandSpec")
    entry = spec.nested_type.add(name="EnvsEntry")
    entry.options.map_entry = True
    entry.field.extend([_field("key", 1, _F.TYPE_STRING), _field("value", 2, _F.TYPE_STRING)])
    spec.field.extend(
        [
            _field("cmd", 1, _F.TYPE_STRING),
            _field("args", 2, _F.TYPE_STRING, repeated=True),
            _field(
                "envs", 3, _F.TYPE_MESSAGE, type_name=".command_session.CommandSpec.EnvsEntry", repeated=True
            ),
        ]
    )
    _optional(spec, "cwd", 4, _F.TYPE_STRING)
    _optional(spec, "user", 5, _F.TYPE_STRING)
    start = fd.message_type.add(name="StartRequest")
    start.field.append(_field("command", 1, _F.TYPE_MESSAGE, type_name=".command_session.CommandSpec"))
    _optional(start, "pty", 2, _F.TYPE_MESSAGE, ".command_session.PTY")
    _optional(start, "stdin", 4, _F.TYPE_BOOL)
    _optional(start, "session_uuid", 5, _F.TYPE_STRING)
    event = fd.message_type.add(name="CommandSessionEvent")
    event.oneof_decl.add(name="event")
    started = event.nested_type.add(name="StartEvent")
    started.field.append(_field("pid", 1, _F.TYPE_UINT32))
    data = event.nested_type.add(name="DataEvent")
    data.oneof_decl.add(name="output")
    data.field.extend(
        [
            _field("stdout", 1, _F.TYPE_BYTES, oneof=0),
            _field("stderr", 2, _F.TYPE_BYTES, oneof=0),
            _field("pty", 3, _F.TYPE_BYTES, oneof=0),
        ]
    )
    end = event.nested_type.add(name="EndEvent")
    end.field.extend(
        [
            _field("exit_code", 1, _F.TYPE_SINT32),
            _field("exited", 2, _F.TYPE_BOOL),
            _field("status", 3, _F.TYPE_STRING),
        ]
    )
    _optional(end, "error", 4, _F.TYPE_STRING)
    event.nested_type.add(name="KeepAlive")
    prefix = ".command_session.CommandSessionEvent."
    event.field.extend(
        [
            _field(kind, n, _F.TYPE_MESSAGE, type_name=prefix + sub, oneof=0)
            for kind, n, sub in [("start", 1, "StartEvent"), ("data", 2, "DataEvent"), ("end", 3, "EndEvent")]
        ]
        + [_field("keepalive", 4, _F.TYPE_MESSAGE, type_name=prefix + "KeepAlive", oneof=0)]
    )
    response = fd.message_type.add(name="StartResponse")
    response.field.append(
        _field("event", 1, _F.TYPE_MESSAGE, type_name=".command_session.CommandSessionEvent")
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    get = message_factory.GetMessageClass
    return (
        get(pool.FindMessageTypeByName("command_session.StartRequest")),
        get(pool.FindMessageTypeByName("command_session.StartResponse")),
    )


StartRequest, StartResponse = _command_session()


class ConnectError(Exception):
    """A Connect error (code and message) that ends a stream."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


_CONNECT_CODES: dict[type[errors.SandboxdError], str] = {
    errors.InvalidArgument: "invalid_argument",
    errors.NotFound: "not_found",
    errors.FailedPrecondition: "failed_precondition",
    errors.ResourceExhausted: "resource_exhausted",
    errors.DeadlineExceeded: "deadline_exceeded",
    errors.Unauthenticated: "unauthenticated",
    errors.SandboxLost: "not_found",
}


def connect_code(e: errors.SandboxdError) -> str:
    """The Connect code that a sandboxd error is reported with."""
    return _CONNECT_CODES.get(type(e), "unavailable")


def _envelope(flags: int, data: bytes) -> bytes:
    return bytes([flags]) + len(data).to_bytes(4, "big") + data


def message_frame(message: Any) -> bytes:
    """One streamed message, enveloped."""
    return _envelope(0, message.SerializeToString())


def end_frame(error: ConnectError | None = None) -> bytes:
    """The end-of-stream envelope: empty, or carrying ``error``."""
    end: dict[str, Any] = {} if error is None else {"error": {"code": error.code, "message": error.message}}
    return _envelope(2, json.dumps(end).encode())


def parse_start_request(body: bytes) -> Any:
    """The StartRequest of a request body of one uncompressed envelope."""
    if len(body) < 5 or body[0] & 1 or int.from_bytes(body[1:5], "big") != len(body) - 5:
        raise ConnectError("invalid_argument", "expected one uncompressed enveloped StartRequest")
    return StartRequest.FromString(body[5:])
