"""A ``sandboxd run-code`` endpoint on the real engine and the code-judge image,
shared by the modules that replay many requests against one server."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import docker

from sandboxd.adapters.sandboxfusion import ensure_pool, make_app
from sandboxd.client import AsyncClient
from tests.integration.conftest import make_settings, running_app
from tests.served import served


@contextlib.asynccontextmanager
async def judge_endpoint(
    tmp: Path, engine: docker.DockerClient, pool: str, *, reserve: int = 2, max_size: int = 12
) -> AsyncIterator[str]:
    """A started sandboxd, a pool of the code-judge image, and the run-code app on a
    free port; yields its URL. Everything is removed at the end, and a sandbox the
    app still holds once closed fails the teardown."""
    from sandboxd.images.codejudge import ensure_code_judge_image

    judge = await asyncio.to_thread(ensure_code_judge_image, log=lambda _: None)
    async with running_app(make_settings(tmp), engine) as app, AsyncClient(app.address) as client:
        await ensure_pool(client, pool, judge, min_ready=reserve, max_size=max_size)
        wapp = make_app(client, pool, acquire_timeout=60.0, reserve=reserve)
        try:
            async with served(wapp) as url:
                yield url
        finally:
            # Closed, run-code holds no lease: a delete without force fails,
            # naming the pool's leased sandboxes, if it left one behind.
            await client.delete_pool(pool)
