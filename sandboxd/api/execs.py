"""ExecService: unary and streaming."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from sandboxd.api.convert import exec_result_to
from sandboxd.backends.base import ExecResult, ExecSpec, OutputChunk
from sandboxd.core.control import ControlPlane, ExecRequest
from sandboxd.core.lifecycle import SandboxRecord
from sandboxd.v1 import exec_pb2, exec_pb2_grpc


class ExecServicer(exec_pb2_grpc.ExecServiceServicer):
    """ExecService on the control plane; the caller's deadline goes to the core as it came."""

    def __init__(self, control: ControlPlane) -> None:
        self._control = control

    def _prepare(self, request: exec_pb2.ExecRequest, context: Any) -> tuple[SandboxRecord, ExecSpec]:
        which = request.WhichOneof("command")
        return self._control.prepare_exec(
            ExecRequest(
                sandbox_id=request.sandbox_id,
                argv=list(request.argv.args) if which == "argv" else None,
                shell=request.shell if which == "shell" else None,
                cwd=request.cwd,
                env=dict(request.env),
                timeout=request.timeout_seconds,
                stdin=request.stdin,
                output_limit=request.output_limit_bytes,
                session=request.session,
                user=request.user,
                call_remaining=context.time_remaining(),
            )
        )

    async def Exec(self, request: exec_pb2.ExecRequest, context: Any) -> exec_pb2.ExecResponse:
        """Runs a command to its end; the answer carries all output and the result."""
        rec, spec = self._prepare(request, context)
        out: dict[int, list[bytes]] = {1: [], 2: []}
        result: ExecResult | None = None
        async for event in self._control.exec(rec, spec):
            if isinstance(event, OutputChunk):
                out[event.stream].append(event.data)
            else:
                result = event
        assert result is not None
        return exec_pb2.ExecResponse(result=exec_result_to(result, b"".join(out[1]), b"".join(out[2])))

    async def ExecStream(
        self, request: exec_pb2.ExecRequest, context: Any
    ) -> AsyncIterator[exec_pb2.ExecEvent]:
        """Runs a command, streaming output as it comes and the result last."""
        rec, spec = self._prepare(request, context)
        async for event in self._control.exec(rec, spec):
            if isinstance(event, OutputChunk):
                if event.stream == 1:
                    yield exec_pb2.ExecEvent(stdout=event.data)
                else:
                    yield exec_pb2.ExecEvent(stderr=event.data)
            else:
                yield exec_pb2.ExecEvent(result=exec_result_to(event))
