"""PoolService."""

from __future__ import annotations

from typing import Any

from sandboxd.api.convert import pool_config_from, pool_to
from sandboxd.core.control import ControlPlane
from sandboxd.v1 import pools_pb2, pools_pb2_grpc


class PoolServicer(pools_pb2_grpc.PoolServiceServicer):
    def __init__(self, control: ControlPlane) -> None:
        self._control = control

    async def CreatePool(
        self, request: pools_pb2.CreatePoolRequest, context: Any
    ) -> pools_pb2.CreatePoolResponse:
        pool = await self._control.create_pool(pool_config_from(request.spec))
        return pools_pb2.CreatePoolResponse(pool=pool_to(pool))

    async def GetPool(self, request: pools_pb2.GetPoolRequest, context: Any) -> pools_pb2.GetPoolResponse:
        return pools_pb2.GetPoolResponse(pool=pool_to(self._control.get_pool(request.name)))

    async def ListPools(
        self, request: pools_pb2.ListPoolsRequest, context: Any
    ) -> pools_pb2.ListPoolsResponse:
        pools = self._control.list_pools()
        return pools_pb2.ListPoolsResponse(pools=[pool_to(p) for p in pools])

    async def UpdatePool(
        self, request: pools_pb2.UpdatePoolRequest, context: Any
    ) -> pools_pb2.UpdatePoolResponse:
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
        await self._control.delete_pool(request.name, request.force)
        return pools_pb2.DeletePoolResponse()
