"""PreflightService."""

from __future__ import annotations

from typing import Any

from sandboxd.api.convert import limits_from
from sandboxd.core.control import ControlPlane
from sandboxd.core.preflight import preflight
from sandboxd.v1 import preflight_pb2, preflight_pb2_grpc


class PreflightServicer(preflight_pb2_grpc.PreflightServiceServicer):
    """PreflightService over the control plane: reads its pools and backend, creates nothing."""

    def __init__(self, control: ControlPlane) -> None:
        self._control = control

    async def Preflight(
        self, request: preflight_pb2.PreflightRequest, context: Any
    ) -> preflight_pb2.PreflightResponse:
        """INVALID_ARGUMENT (malformed request), NOT_FOUND (unknown pool); the plan's problems are answers."""
        which = request.WhichOneof("target")
        report = await preflight(
            self._control,
            pool=request.pool if which == "pool" else None,
            image=request.template.image if which == "template" else None,
            limits=limits_from(request.template.limits) if which == "template" else None,
            runtime=request.template.runtime if which == "template" else "",
            concurrent=request.concurrent,
            duration=request.expected_duration_seconds,
            images=list(request.images),
        )
        return preflight_pb2.PreflightResponse(
            ok=report.ok,
            problems=[
                preflight_pb2.Problem(kind=int(p.kind), message=p.message, field=p.field)  # type: ignore[arg-type]
                for p in report.problems
            ],
            capacity=preflight_pb2.Capacity(
                memory_bytes=report.memory_bytes,
                cpus=report.cpus,
                memory_needed_bytes=report.memory_needed_bytes,
                cpus_needed=report.cpus_needed,
                quota_sandboxes_left=report.quota_sandboxes_left,
                quota_memory_left_bytes=report.quota_memory_left_bytes,
            ),
            predicted_warm_seconds=report.predicted_warm_seconds,
            measured_start_seconds=report.measured_start_seconds,
            network=report.network,
        )
