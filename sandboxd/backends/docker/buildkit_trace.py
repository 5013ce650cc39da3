"""BuildKit's build trace, as the engine's /build?version=2 streams it: each
``{"id": "moby.buildkit.trace", "aux": "<base64>"}`` carries a protobuf
``moby.buildkit.v1.StatusResponse`` (moby/buildkit's
api/services/control/control.proto). The few fields read here are decoded
from the wire format by hand, with the upstream field numbers, so no
generated code for a foreign API sits beside sandboxd's own. ``Trace``
turns the messages into the plain log lines ``docker build --progress=plain``
prints ("#3 [2/4] RUN make", "#3 0.512 output", "#3 DONE 1.2s") and keeps the
failing step: only a bounded tail of anything, whatever the build's size."""

from __future__ import annotations

import base64
import binascii
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

TRACE_ID = "moby.buildkit.trace"
# Wire types of the protobuf encoding.
_VARINT, _FIXED64, _BYTES, _FIXED32 = 0, 1, 2, 5
# StatusResponse: vertexes = 1, logs = 3 (statuses = 2 and warnings = 4 are
# progress bars and lint notes, not read).
_VERTEXES, _LOGS = 1, 3
# Vertex: digest = 1, name = 3, cached = 4, started = 5, completed = 6, error = 7.
_V_DIGEST, _V_NAME, _V_CACHED, _V_STARTED, _V_COMPLETED, _V_ERROR = 1, 3, 4, 5, 6, 7
# VertexLog: vertex = 1, timestamp = 2, stream = 3, msg = 4.
_L_VERTEX, _L_TIMESTAMP, _L_MSG = 1, 2, 4
# google.protobuf.Timestamp: seconds = 1, nanos = 2.
_T_SECONDS, _T_NANOS = 1, 2

# Lines kept per step for a failure's message, and the longest line kept:
# a step that prints megabytes without a newline must not grow without end.
TAIL_LINES = 20
MAX_LINE_CHARS = 4096
# BuildKit cancels a failed build's other steps with this error: they are not what failed.
_CANCELED = "context canceled"


class TraceError(ValueError):
    """A trace message that is not a valid StatusResponse."""


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise TraceError("truncated varint")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, at


def _fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) of each field of one message: an int for
    varints, the raw bytes for everything else."""
    at = 0
    while at < len(data):
        key, at = _varint(data, at)
        number, wire = key >> 3, key & 7
        value: int | bytes
        if wire == _VARINT:
            value, at = _varint(data, at)
        elif wire == _BYTES:
            size, at = _varint(data, at)
            if at + size > len(data):
                raise TraceError("truncated field")
            value, at = data[at : at + size], at + size
        elif wire == _FIXED64:
            value, at = data[at : at + 8], at + 8
        elif wire == _FIXED32:
            value, at = data[at : at + 4], at + 4
        else:
            raise TraceError(f"unknown wire type {wire}")
        yield number, value


def _text(value: int | bytes) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else ""


def _seconds(value: int | bytes) -> float:
    if not isinstance(value, bytes):
        return 0.0
    parts = {n: v for n, v in _fields(value) if isinstance(v, int)}
    return parts.get(_T_SECONDS, 0) + parts.get(_T_NANOS, 0) / 1e9


@dataclass(frozen=True)
class Vertex:
    """One step's state in a message: ``started``/``completed`` in seconds since the epoch (0: not yet)."""

    digest: str
    name: str = ""
    cached: bool = False
    started: float = 0.0
    completed: float = 0.0
    error: str = ""


@dataclass(frozen=True)
class VertexLog:
    """Output of a step's process (stdout or stderr), a chunk that may end mid-line."""

    vertex: str
    at: float
    data: bytes


@dataclass(frozen=True)
class Status:
    """The parts of one StatusResponse read here."""

    vertexes: list[Vertex] = field(default_factory=list)
    logs: list[VertexLog] = field(default_factory=list)


def decode_status(aux: str) -> Status:
    """The StatusResponse in a trace message's ``aux`` (base64); TraceError when it is not one."""
    try:
        data = base64.b64decode(aux, validate=True)
    except (binascii.Error, ValueError) as e:
        raise TraceError(f"trace is not base64: {e}") from e
    status = Status()
    for number, value in _fields(data):
        if not isinstance(value, bytes):
            continue
        if number == _VERTEXES:
            v: dict[int, int | bytes] = dict(_fields(value))
            status.vertexes.append(
                Vertex(
                    digest=_text(v.get(_V_DIGEST, b"")),
                    name=_text(v.get(_V_NAME, b"")),
                    cached=bool(v.get(_V_CACHED, 0)),
                    started=_seconds(v.get(_V_STARTED, b"")),
                    completed=_seconds(v.get(_V_COMPLETED, b"")),
                    error=_text(v.get(_V_ERROR, b"")),
                )
            )
        elif number == _LOGS:
            log: dict[int, int | bytes] = dict(_fields(value))
            data_ = log.get(_L_MSG, b"")
            status.logs.append(
                VertexLog(
                    vertex=_text(log.get(_L_VERTEX, b"")),
                    at=_seconds(log.get(_L_TIMESTAMP, b"")),
                    data=data_ if isinstance(data_, bytes) else b"",
                )
            )
    return status


def step_of(name: str) -> str:
    """The Dockerfile instruction of a vertex name: "[stage-0 4/4] RUN make" -> "RUN make"."""
    if name.startswith("[") and "] " in name:
        return name.split("] ", 1)[1]
    return name


@dataclass
class _Step:
    number: int
    name: str
    started: float = 0.0
    offset: float = 0.0
    announced: bool = False
    ended: bool = False
    partial: bytes = b""
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))


@dataclass(frozen=True)
class Failure:
    """The step that failed: its instruction, BuildKit's error and its last output lines."""

    step: str
    error: str
    tail: tuple[str, ...]


class Trace:
    """Log lines from a build's StatusResponses, numbered by step in the
    order BuildKit first reports them; remembers the first step that failed
    (not the ones BuildKit cancelled because of it)."""

    def __init__(self) -> None:
        self._steps: dict[str, _Step] = {}
        self.failure: Failure | None = None

    def lines(self, status: Status) -> Iterator[str]:
        """The log lines ``status`` adds."""
        for vertex in status.vertexes:
            yield from self._vertex(vertex)
        for log in status.logs:
            yield from self._log(log)

    def _step(self, digest: str, name: str) -> _Step:
        step = self._steps.get(digest)
        if step is None:
            step = self._steps[digest] = _Step(len(self._steps) + 1, name)
        elif name:
            step.name = name
        return step

    def _vertex(self, vertex: Vertex) -> Iterator[str]:
        step = self._step(vertex.digest, vertex.name)
        if vertex.started:
            step.started = vertex.started
        if step.ended or not (vertex.started or vertex.cached or vertex.completed):
            return
        if not step.announced:
            step.announced = True
            yield f"#{step.number} {step.name}"
        if vertex.cached and not vertex.error:
            step.ended = True
            yield f"#{step.number} CACHED"
        elif vertex.completed:
            step.ended = True
            yield from self._flush(step)
            if vertex.error:
                yield f"#{step.number} ERROR: {vertex.error}"
                if self.failure is None and _CANCELED not in vertex.error:
                    self.failure = Failure(step_of(step.name), vertex.error, tuple(step.tail))
            else:
                took = max(0.0, vertex.completed - step.started) if step.started else 0.0
                yield f"#{step.number} DONE {took:.1f}s"

    def _log(self, log: VertexLog) -> Iterator[str]:
        step = self._step(log.vertex, "")
        if not step.announced:
            step.announced = True
            yield f"#{step.number} {step.name}"
        if step.started and log.at:
            step.offset = max(0.0, log.at - step.started)
        data = step.partial + log.data
        *whole, step.partial = data.split(b"\n")
        if len(step.partial) > MAX_LINE_CHARS:
            whole.append(step.partial)
            step.partial = b""
        for raw in whole:
            yield self._output(step, raw)

    def _output(self, step: _Step, raw: bytes) -> str:
        text = raw.decode("utf-8", "replace").rstrip("\r")
        if len(text) > MAX_LINE_CHARS:
            text = text[:MAX_LINE_CHARS] + " [...]"
        step.tail.append(text)
        return f"#{step.number} {step.offset:.3f} {text}"

    def _flush(self, step: _Step) -> Iterator[str]:
        if step.partial:
            raw, step.partial = step.partial, b""
            yield self._output(step, raw)
