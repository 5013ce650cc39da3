"""PoolService."""

from __future__ import annotations

from typing import Any

from sandboxd.api.convert import pool_config_from, pool_to
from sandboxd.core import validation as v
from sandboxd.core.control import ControlPlane
from sandboxd.v1 import pools_pb2, pools_pb2_grpc


class PoolServicer(pools_pb2_grpc.PoolServiceServicer):
    """PoolService over the control plane; a call only ever sees the caller's own tenant's pools."""

    def __init__(self, control: ControlPlane) -> None:
        self._control = control

    async def CreatePool(
        self, request: pools_pb2.CreatePoolRequest, context: Any
    ) -> pools_pb2.CreatePoolResponse:
        """INVALID_ARGUMENT (bad spec, the field named), ALREADY_EXISTS, FAILED_PRECONDITION
        (the image is not on the backend)."""
        v.settable_labels("spec.labels", dict(request.spec.labels))
        pool = await self._control.create_pool(pool_config_from(request.spec))
        return pools_pb2.CreatePoolResponse(pool=pool_to(pool))

    async def GetPool(self, request: pools_pb2.GetPoolRequest, context: Any) -> pools_pb2.GetPoolResponse:
        """NOT_FOUND when the caller has no pool of that name, INVALID_ARGUMENT for a malformed name."""
        return pools_pb2.GetPoolResponse(pool=pool_to(self._control.get_pool(request.name)))

    async def ListPools(
        self, request: pools_pb2.ListPoolsRequest, context: Any
    ) -> pools_pb2.ListPoolsResponse:
        """The caller's pools, by name; it answers no error of its own."""
        pools = self._control.list_pools()
        return pools_pb2.ListPoolsResponse(pools=[pool_to(p) for p in pools])

    async def UpdatePool(
        self, request: pools_pb2.UpdatePoolRequest, context: Any
    ) -> pools_pb2.UpdatePoolResponse:
        """Only the fields set change; NOT_FOUND (unknown pool), INVALID_ARGUMENT (sizes that do not fit)."""
        pool = await self._control.update_pool(
            request.name,
            request.min_ready if request.HasField("min_ready") else None,
            request.max_size if request.HasField("max_size") else None,
            request.max_ready if request.HasField("max_ready") else None,
        )
        return pools_pb2.UpdatePoolResponse(pool=pool_to(pool))

    async def DeletePool(
        self, request: pools_pb2.DeletePoolRequest, context: Any
    ) -> pools_pb2.DeletePoolResponse:
        """NOT_FOUND (unknown pool), FAILED_PRECONDITION (sandboxes are leased and ``force`` is unset)."""
        await self._control.delete_pool(request.name, request.force)
        return pools_pb2.DeletePoolResponse()
