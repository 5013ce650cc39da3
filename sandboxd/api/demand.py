"""DemandService: announced demand, prewarming, and the WatchPool stream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

from sandboxd.api.convert import ts
from sandboxd.core import capacity
from sandboxd.core import validation as v
from sandboxd.core.control import ControlPlane
from sandboxd.core.images import PullProgress
from sandboxd.core.lifecycle import State
from sandboxd.core.pools import WarmPool
from sandboxd.core.tenancy import split_pool_key
from sandboxd.errors import DeadlineExceeded, FailedPrecondition, InvalidArgument, ResourceExhausted
from sandboxd.v1 import demand_pb2, demand_pb2_grpc

_MIN_INTERVAL, _MAX_INTERVAL = 0.05, 60.0


def pulls_to(pulls: Sequence[PullProgress], wall_minus_monotonic: float) -> list[demand_pb2.ImagePull]:
    """Image pulls as WatchPool shows them; ``started`` (monotonic) turned wall time."""
    return [
        demand_pb2.ImagePull(
            image=p.image,
            state=p.state,
            bytes_done=p.bytes_done,
            bytes_total=p.bytes_total,
            started=ts(p.started + wall_minus_monotonic),
            detail=p.detail,
        )
        for p in pulls
    ]


def images_to(pool: WarmPool) -> list[demand_pb2.ImageScaling]:
    """Per-image counts of a pool that serves several images (none for one that serves its own only)."""
    if not pool.config.images:
        return []
    targets = pool.warm_targets()
    return [
        demand_pb2.ImageScaling(
            image=image, ready=ready, starting=starting, waiting=waiting, warm_target=targets.get(image, 0)
        )
        for image, (ready, starting, waiting) in sorted(pool.image_counts().items())
    ]


def scaling_to(pool: WarmPool, pulls: Sequence[demand_pb2.ImagePull] = ()) -> demand_pb2.PoolScaling:
    """A pool's scaling state now (counts, targets, estimates, per image, and
    the server's image ``pulls``), named as its tenant knows it."""
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
        oldest_wait_seconds=gauges["oldest_wait_seconds"],
        in_doubt=int(gauges["in_doubt"]),
        engine_degraded=pool.engine_degraded,
        start_window=int(gauges["start_window"]),
        images=images_to(pool),
        pulls=pulls,
    )


class DemandServicer(demand_pb2_grpc.DemandServiceServicer):
    """DemandService over the control plane: announcements move warm targets and lease nothing."""

    def __init__(self, control: ControlPlane) -> None:
        self._control = control

    async def SetDemand(
        self, request: demand_pb2.SetDemandRequest, context: Any
    ) -> demand_pb2.SetDemandResponse:
        """NOT_FOUND (no such pool), INVALID_ARGUMENT (bad count, times or source), FAILED_PRECONDITION
        (the pool does not follow demand)."""
        pool = self._control.get_pool(request.pool, "pool")
        source = v.name_text("source", request.source) or "default"
        images = tuple(sorted(request.images.items()))
        count = request.count or sum(max(n, 0) for _, n in images)
        pool.announce(source, count, request.in_seconds, request.ttl_seconds, images)
        return demand_pb2.SetDemandResponse(pool=scaling_to(pool, self._pulls()))

    def _pulls(self) -> list[demand_pb2.ImagePull]:
        images = self._control.images
        if images is None:
            return []
        clock = self._control.clock
        return pulls_to(images.progress(), clock.time() - clock.monotonic())

    async def Prewarm(self, request: demand_pb2.PrewarmRequest, context: Any) -> demand_pb2.PrewarmResponse:
        """As SetDemand; with ``wait``, RESOURCE_EXHAUSTED at once when ``count`` cannot fit under the
        server's ceiling (the host's capacity), FAILED_PRECONDITION when the pool cannot create
        sandboxes or is being deleted, DEADLINE_EXCEEDED when the wait (capped by the call's
        deadline) runs out."""
        pool = self._control.get_pool(request.pool, "pool")
        # NaN or infinity would make the wait below endless.
        timeout = v.non_negative("timeout_seconds", request.timeout_seconds)
        source = v.name_text("source", request.source) or "prewarm"
        pool.announce(source, request.count, 0.0, request.ttl_seconds)
        if request.wait:
            # Waiting for more than the host can ever hold would only end at the
            # deadline; say so now (the announcement stands: what fits warms).
            self._check_fits(request.pool, pool, request.count)
            loop = asyncio.get_running_loop()
            wait = timeout or self._control.settings.pools.max_acquire_wait_seconds
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
        return demand_pb2.PrewarmResponse(pool=scaling_to(pool, self._pulls()))

    def _check_fits(self, name: str, pool: WarmPool, count: int) -> None:
        """RESOURCE_EXHAUSTED when ``count`` READY sandboxes of ``pool`` cannot
        fit under the server's ceiling (the host's capacity by default) beside
        what the other pools hold."""
        reconciler = self._control.reconciler
        ceiling = reconciler.ceiling()
        if not ceiling:
            return
        others = sum(len(p.records) for p in reconciler.pools.values() if p is not pool)
        room = max(0, min(ceiling - others, pool.config.max_size))
        if count <= room:
            return
        host = reconciler.capacity
        why = (
            capacity.refusal(count, host)
            if host.sandboxes and host.sandboxes == ceiling
            else f"{count} asked, the server holds at most {ceiling} (pools.max_total_sandboxes)"
        )
        raise ResourceExhausted(
            f"pool {name}: {why}; {room} fit this pool now ({others} held by other pools, "
            f"max_size {pool.config.max_size}); it keeps warming what fits"
        )

    async def WatchPool(
        self, request: demand_pb2.WatchPoolRequest, context: Any
    ) -> AsyncIterator[demand_pb2.WatchPoolResponse]:
        """NOT_FOUND for an unknown pool, INVALID_ARGUMENT for an interval outside [0.05, 60];
        it streams until cancelled."""
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
            pulls = self._pulls()
            yield demand_pb2.WatchPoolResponse(
                at=ts(self._control.clock.time()), pools=[scaling_to(p, pulls) for p in pools]
            )
            await asyncio.sleep(interval)
