"""DemandService: announced demand, prewarming, and the WatchPool stream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from sandboxd.api.convert import ts
from sandboxd.core.control import ControlPlane
from sandboxd.core.lifecycle import State
from sandboxd.core.pools import WarmPool
from sandboxd.core.tenancy import split_pool_key
from sandboxd.errors import DeadlineExceeded, FailedPrecondition, InvalidArgument
from sandboxd.v1 import demand_pb2, demand_pb2_grpc

_MIN_INTERVAL, _MAX_INTERVAL = 0.05, 60.0


def scaling_to(pool: WarmPool) -> demand_pb2.PoolScaling:
    c = pool.config
    gauges = pool.gauges()
    return demand_pb2.PoolScaling(
        pool=split_pool_key(c.name)[1],
        ready=pool.ready,
        leased=pool.count(State.LEASED),
        starting=pool.creating,
        releasing=int(gauges["sandboxes_releasing"]),
        waiting=pool.waiting,
        warm_target=pool.warm_target,
        warm_keep=pool.warm_keep,
        min_ready=c.min_ready,
        max_ready=c.max_ready,
        max_size=c.max_size,
        acquire_rate=gauges["acquire_rate_per_second"],
        startup_seconds=gauges["startup_estimate_seconds"],
        announced=int(gauges["announced_sandboxes"]),
        reason=pool.plan.reason if pool.plan else "",
        failed_total=pool.failed_total,
        last_error=pool.permanent_error or pool.last_error,
        created_total=pool.created_total,
    )


class DemandServicer(demand_pb2_grpc.DemandServiceServicer):
    def __init__(self, control: ControlPlane) -> None:
        self._control = control

    async def SetDemand(
        self, request: demand_pb2.SetDemandRequest, context: Any
    ) -> demand_pb2.SetDemandResponse:
        pool = self._control.get_pool(request.pool, "pool")
        pool.announce(request.source or "default", request.count, request.in_seconds, request.ttl_seconds)
        return demand_pb2.SetDemandResponse(pool=scaling_to(pool))

    async def Prewarm(self, request: demand_pb2.PrewarmRequest, context: Any) -> demand_pb2.PrewarmResponse:
        pool = self._control.get_pool(request.pool, "pool")
        if request.timeout_seconds < 0:
            raise InvalidArgument("timeout_seconds", f"must be >= 0, got {request.timeout_seconds}")
        source = request.source or "prewarm"
        pool.announce(source, request.count, 0.0, request.ttl_seconds)
        if request.wait:
            loop = asyncio.get_running_loop()
            wait = request.timeout_seconds or self._control.settings.pools.max_acquire_wait_seconds
            remaining = context.time_remaining() if context is not None else None
            if remaining is not None:
                wait = min(wait, max(0.0, remaining - 0.05))
            deadline = loop.time() + wait
            while True:
                if pool.permanent_error:
                    raise FailedPrecondition(
                        f"pool {request.pool} cannot create sandboxes: {pool.permanent_error}"
                    )
                if pool.closed:
                    raise FailedPrecondition(f"pool {request.pool} is being deleted")
                left = pool.announced(source)
                if left == 0 or pool.ready >= min(left, max(pool.config.max_ready, pool.config.min_ready)):
                    break
                if loop.time() >= deadline:
                    raise DeadlineExceeded(
                        f"pool {request.pool}: {pool.ready} of {left} sandboxes READY before the deadline "
                        f"(starting {pool.creating}"
                        + (f", last error: {pool.last_error}" if pool.last_error else "")
                        + ")"
                    )
                await pool.wait_changed(min(1.0, deadline - loop.time()))
        return demand_pb2.PrewarmResponse(pool=scaling_to(pool))

    async def WatchPool(
        self, request: demand_pb2.WatchPoolRequest, context: Any
    ) -> AsyncIterator[demand_pb2.WatchPoolResponse]:
        interval = request.interval_seconds or 1.0
        if not _MIN_INTERVAL <= interval <= _MAX_INTERVAL:
            raise InvalidArgument(
                "interval_seconds", f"must be between {_MIN_INTERVAL} and {_MAX_INTERVAL}, got {interval}"
            )
        if request.pool:
            self._control.get_pool(request.pool, "pool")
        while True:
            pools = (
                [self._control.get_pool(request.pool, "pool")] if request.pool else self._control.list_pools()
            )
            yield demand_pb2.WatchPoolResponse(
                at=ts(self._control.clock.time()), pools=[scaling_to(p) for p in pools]
            )
            await asyncio.sleep(interval)
