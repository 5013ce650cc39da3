"""Pools, their demand-following scaling, and preflight checks of a planned run."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence

from sandboxd.client.rpc import Connection, rpc_errors
from sandboxd.v1 import common_pb2, demand_pb2, pools_pb2, preflight_pb2


class PoolCalls(Connection):
    """The client's pool, demand and preflight calls."""

    async def create_pool(
        self,
        name: str,
        image: str,
        *,
        min_ready: int = 0,
        max_size: int = 64,
        limits: Mapping[str, int] | None = None,
        env: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
        max_ready: int = 0,
        idle_seconds: float = 0.0,
        runtime: str = "",
        images: Sequence[str] = (),
        network: Sequence[str] = (),
        live_snapshots: str = "",
        recycle: str = "",
        recycle_label: str = "",
        max_uses: int = 0,
        model_endpoint: str = "",
        image_pull_secrets: Sequence[str] = (),
        root: str = "",
    ) -> pools_pb2.Pool:
        """``max_ready`` above ``min_ready`` makes the pool follow demand
        between the two; ``idle_seconds`` is its scale-down delay; ``runtime``
        is runc (the default) or gvisor; ``images`` are those an acquire may
        name besides ``image`` (``["*"]``: any); ``network`` the egress
        allow-list (empty: no network); ``live_snapshots`` "on" or "off"
        says whether live snapshots of a gVisor pool's sandboxes are asked
        for ("off": they start faster, without the keeper; empty: the
        runtime's default); ``recycle`` "same-tenant" or "same-run" (by the
        lease label ``recycle_label``) resets released sandboxes in place and
        hands them out again, each for at most ``max_uses`` leases ("" or
        "off": released sandboxes are destroyed); ``model_endpoint`` the
        run's OpenAI-compatible server, reached from the sandboxes only
        through sandboxd's metered gateway; ``image_pull_secrets`` (Kubernetes)
        the Secrets the pool's Pods pull their images with; ``root``
        "writable" lets the sandboxes write anywhere in the image's
        filesystem, bounded by the pool's disk and file limits ("" or
        "read-only": only the workspace and scratch mounts are writable)."""
        spec = pools_pb2.PoolSpec(
            name=name,
            image=image,
            min_ready=min_ready,
            max_size=max_size,
            limits=common_pb2.Limits(**(limits or {})),
            env=env or {},
            labels=labels or {},
            max_ready=max_ready,
            idle_seconds=idle_seconds,
            runtime=runtime,
            images=list(images),
            network=list(network),
            live_snapshots=live_snapshots,
            recycle=recycle,
            recycle_label=recycle_label,
            max_uses=max_uses,
            model_endpoint=model_endpoint,
            image_pull_secrets=list(image_pull_secrets),
            root=root,
        )
        with rpc_errors():
            response: pools_pb2.CreatePoolResponse = await self.pools.CreatePool(
                pools_pb2.CreatePoolRequest(spec=spec), metadata=self.metadata
            )
        return response.pool

    async def get_pool(self, name: str) -> pools_pb2.Pool:
        """A pool's spec and status."""
        with rpc_errors():
            response: pools_pb2.GetPoolResponse = await self.pools.GetPool(
                pools_pb2.GetPoolRequest(name=name), metadata=self.metadata
            )
        return response.pool

    async def list_pools(self) -> list[pools_pb2.Pool]:
        """The pools the caller can see."""
        with rpc_errors():
            return list(
                (await self.pools.ListPools(pools_pb2.ListPoolsRequest(), metadata=self.metadata)).pools
            )

    async def update_pool(
        self,
        name: str,
        *,
        min_ready: int | None = None,
        max_size: int | None = None,
        max_ready: int | None = None,
    ) -> pools_pb2.Pool:
        """Changes a pool's sizes (None = keep)."""
        request = pools_pb2.UpdatePoolRequest(
            name=name, min_ready=min_ready, max_size=max_size, max_ready=max_ready
        )
        with rpc_errors():
            response: pools_pb2.UpdatePoolResponse = await self.pools.UpdatePool(
                request, metadata=self.metadata
            )
        return response.pool

    async def delete_pool(self, name: str, *, force: bool = False) -> None:
        """Deletes a pool and its warm sandboxes; ``force``: leased ones too."""
        with rpc_errors():
            await self.pools.DeletePool(
                pools_pb2.DeletePoolRequest(name=name, force=force), metadata=self.metadata
            )

    async def set_demand(
        self,
        pool: str,
        count: int,
        *,
        in_seconds: float = 0.0,
        ttl: float = 0.0,
        source: str = "",
        images: Mapping[str, int] | None = None,
    ) -> demand_pb2.PoolScaling:
        """Announces "in ~in_seconds I will acquire ``count`` sandboxes of
        ``pool``, ``images`` saying how many of which image" (replacing this
        source's previous announcement; 0 withdraws; with ``images`` and
        count 0, count is their sum)."""
        request = demand_pb2.SetDemandRequest(
            pool=pool, source=source, count=count, in_seconds=in_seconds, ttl_seconds=ttl, images=images or {}
        )
        with rpc_errors():
            response: demand_pb2.SetDemandResponse = await self.demand.SetDemand(
                request, metadata=self.metadata
            )
        return response.pool

    async def prewarm(
        self,
        pool: str,
        count: int,
        *,
        wait: bool = False,
        timeout: float = 0.0,
        ttl: float = 0.0,
        source: str = "",
    ) -> demand_pb2.PoolScaling:
        """Warms ``count`` sandboxes now; with ``wait``, returns once they are READY."""
        request = demand_pb2.PrewarmRequest(
            pool=pool, count=count, wait=wait, timeout_seconds=timeout, ttl_seconds=ttl, source=source
        )
        with rpc_errors():
            response: demand_pb2.PrewarmResponse = await self.demand.Prewarm(
                request, timeout=timeout + 5.0 if wait and timeout else None, metadata=self.metadata
            )
        return response.pool

    async def watch_pools(
        self, pool: str = "", *, interval: float = 1.0
    ) -> AsyncIterator[demand_pb2.WatchPoolResponse]:
        """Yields the scaling state of ``pool`` (or of every pool) every ``interval`` seconds."""
        call = self.demand.WatchPool(
            demand_pb2.WatchPoolRequest(pool=pool, interval_seconds=interval), metadata=self.metadata
        )
        try:
            with rpc_errors():
                async for update in call:
                    yield update
        finally:
            call.cancel()

    async def preflight(
        self,
        *,
        concurrent: int,
        pool: str = "",
        image: str = "",
        limits: Mapping[str, int] | None = None,
        duration: float = 0.0,
        runtime: str = "",
        images: Sequence[str] = (),
    ) -> preflight_pb2.PreflightResponse:
        """Checks a planned run (an existing pool, or an image and limits)
        before anything is created; the answer lists every problem found.
        ``images``: further images the run takes (per-task images), each
        checked to be pullable and to fit the server's image cache."""
        request = preflight_pb2.PreflightRequest(
            concurrent=concurrent, expected_duration_seconds=duration, images=list(images)
        )
        if pool:
            request.pool = pool
        else:
            request.template.CopyFrom(
                preflight_pb2.Template(
                    image=image, limits=common_pb2.Limits(**(limits or {})), runtime=runtime
                )
            )
        with rpc_errors():
            response: preflight_pb2.PreflightResponse = await self.preflight_stub.Preflight(
                request, metadata=self.metadata
            )
        return response
