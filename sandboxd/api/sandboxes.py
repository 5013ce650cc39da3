"""SandboxService: acquire, heartbeat, release, inspect."""

from __future__ import annotations

from typing import Any

from sandboxd.api.abandoning import Abandoned
from sandboxd.api.convert import lease_to, limits_from, sandbox_to
from sandboxd.core import validation as v
from sandboxd.core.control import AcquireRequest, ControlPlane
from sandboxd.core.lifecycle import State
from sandboxd.core.narrowing import asked_network
from sandboxd.core.pausing import Pausing
from sandboxd.errors import InvalidArgument
from sandboxd.v1 import sandboxes_pb2, sandboxes_pb2_grpc


class SandboxServicer(sandboxes_pb2_grpc.SandboxServiceServicer):
    """SandboxService on the control plane; the caller's deadline goes to the core as it came.
    ``abandoned`` releases what a cancelled Acquire was granted (shared with Restore)."""

    def __init__(self, control: ControlPlane, abandoned: Abandoned) -> None:
        self._control = control
        self._pausing = Pausing(control)
        self._abandoned = abandoned

    async def Acquire(
        self, request: sandboxes_pb2.AcquireRequest, context: Any
    ) -> sandboxes_pb2.AcquireResponse:
        """Leases sandboxes of a pool."""
        lease, records = await self._control.acquire(
            AcquireRequest(
                pool=request.pool,
                n=request.n,
                min_n=request.min_n,
                labels=v.settable_labels("labels", dict(request.labels)),
                ttl=request.lease_ttl_seconds,
                timeout=request.timeout_seconds,
                call_remaining=context.time_remaining(),
                limits=limits_from(request.limits) if request.HasField("limits") else None,
                request_id=request.request_id,
                image=request.image,
                network=asked_network(request.network, request.no_network),
            )
        )
        # A call ended CANCELLED from here on never delivers the lease (see api.abandoning).
        self._abandoned.watch(context, lease.lease_id)
        return sandboxes_pb2.AcquireResponse(
            lease=lease_to(lease), sandboxes=[sandbox_to(r, lease) for r in records]
        )

    async def Heartbeat(
        self, request: sandboxes_pb2.HeartbeatRequest, context: Any
    ) -> sandboxes_pb2.HeartbeatResponse:
        """Extends a lease."""
        lease = await self._control.heartbeat(request.lease_id, request.ttl_seconds)
        return sandboxes_pb2.HeartbeatResponse(lease=lease_to(lease))

    async def SetLeaseNetwork(
        self, request: sandboxes_pb2.SetLeaseNetworkRequest, context: Any
    ) -> sandboxes_pb2.SetLeaseNetworkResponse:
        """Changes a running lease's network rules; answers once they are in force."""
        lease = await self._control.set_network(
            request.lease_id, asked_network(request.network, request.no_network)
        )
        return sandboxes_pb2.SetLeaseNetworkResponse(lease=lease_to(lease))

    async def Release(
        self, request: sandboxes_pb2.ReleaseRequest, context: Any
    ) -> sandboxes_pb2.ReleaseResponse:
        """Releases a lease's sandboxes, or some of them."""
        if request.request_id and not request.lease_id:
            if request.sandbox_ids:
                raise InvalidArgument("sandbox_ids", "name a lease_id to release only some sandboxes")
            released = await self._control.release_request(request.request_id)
            return sandboxes_pb2.ReleaseResponse(released=released)
        if request.request_id:
            raise InvalidArgument("request_id", "give lease_id or request_id, not both")
        released = await self._control.release(request.lease_id, list(request.sandbox_ids))
        return sandboxes_pb2.ReleaseResponse(released=released)

    async def GetSandbox(
        self, request: sandboxes_pb2.GetSandboxRequest, context: Any
    ) -> sandboxes_pb2.GetSandboxResponse:
        """One sandbox of the caller's tenant."""
        rec = self._control.get_sandbox(request.sandbox_id)
        return sandboxes_pb2.GetSandboxResponse(
            sandbox=sandbox_to(rec, self._control.leases.find(rec.lease_id))
        )

    async def GetUsage(
        self, request: sandboxes_pb2.GetUsageRequest, context: Any
    ) -> sandboxes_pb2.GetUsageResponse:
        """What a leased sandbox uses now."""
        u = await self._control.usage_of(request.sandbox_id)
        return sandboxes_pb2.GetUsageResponse(
            usage=sandboxes_pb2.Usage(
                memory_bytes=u.memory_bytes,
                memory_peak_bytes=u.memory_peak_bytes,
                pids=u.pids,
                disk_bytes=u.disk_bytes,
                disk_limit_bytes=u.disk_total_bytes,
                files=u.files,
                files_limit=u.files_total,
                cpu_seconds=u.cpu_seconds,
            )
        )

    async def ListSandboxes(
        self, request: sandboxes_pb2.ListSandboxesRequest, context: Any
    ) -> sandboxes_pb2.ListSandboxesResponse:
        """The tenant's sandboxes, filtered."""
        state = None
        if request.state:
            try:
                state = State(request.state)
            except ValueError as e:
                raise InvalidArgument("state", f"unknown state {request.state}") from e
        records = self._control.list_sandboxes(request.pool, state, dict(request.labels))
        return sandboxes_pb2.ListSandboxesResponse(
            sandboxes=[sandbox_to(r, self._control.leases.find(r.lease_id)) for r in records]
        )

    async def Pause(self, request: sandboxes_pb2.PauseRequest, context: Any) -> sandboxes_pb2.PauseResponse:
        """Freezes a leased sandbox; FAILED_PRECONDITION where its runtime or backend cannot."""
        rec = await self._pausing.pause(request.sandbox_id)
        return sandboxes_pb2.PauseResponse(sandbox=sandbox_to(rec, self._control.leases.find(rec.lease_id)))

    async def Resume(
        self, request: sandboxes_pb2.ResumeRequest, context: Any
    ) -> sandboxes_pb2.ResumeResponse:
        """Thaws a paused sandbox."""
        rec = await self._pausing.resume(request.sandbox_id)
        return sandboxes_pb2.ResumeResponse(sandbox=sandbox_to(rec, self._control.leases.find(rec.lease_id)))
