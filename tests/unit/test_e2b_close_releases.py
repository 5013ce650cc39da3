"""The E2B front end's close releases the lease of every sandbox it holds,
each release retried while the server refuses it for now (over the tenant's
call rate, answered RESOURCE_EXHAUSTED with a retry hint), so that one
refused release neither fails the close nor keeps the other sandboxes from
theirs."""

from __future__ import annotations

import pytest

from sandboxd import errors
from sandboxd.client import AsyncClient
from sandboxd.e2b.control import Control, E2bSettings
from sandboxd.e2b.registry import Box, Registry
from tests.unit.conftest import IMAGE, MakeApp, wait_for

pytestmark = pytest.mark.timeout(60)


async def test_close_releases_every_box_while_the_server_is_busy(make_app: MakeApp) -> None:
    app = await make_app(tenants={"t": {"token": "tk", "requests_per_second": 4}})
    async with AsyncClient(app.address, token="tk") as client:
        await client.create_pool("p", IMAGE, min_ready=3, max_size=4)
        # The pool is tenant t's: looked at through the registry, not as the default tenant.
        await wait_for(
            lambda: all(pool.ready >= 3 for pool in app.control.registry.pools.values()),
            what="the pool warm",
        )
        control = Control(client, E2bSettings(), Registry())
        for i in range(3):
            lease = await client.lease("p", timeout=10)
            control.registry.add(
                Box(
                    id=f"i{i}",
                    key="k",
                    client=client,
                    template="base",
                    pool="p",
                    metadata={},
                    envs={},
                    timeout=300,
                    sandbox_id=lease[0].id,
                    lease_id=lease.id,
                )
            )
        assert len(app.control.leases) == 3
        with pytest.raises(errors.ResourceExhausted):
            for _ in range(40):
                await client.list_pools()
        await control.close()
        assert not control.registry.all()
        assert not app.control.leases.all()
