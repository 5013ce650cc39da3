"""sandboxd's E2B app served to the unit tests (the ``e2b_http`` fixture,
which tests/unit/conftest.py registers) over a sandboxd address
nothing listens on: what it answers before (or without) reaching sandboxd."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from sandboxd.client import AsyncClient
from sandboxd.e2b import E2bSettings, make_app

__all__ = ["KEY", "e2b_http"]

KEY = "e2b_" + "ab" * 20
"""The one API key the app accepts."""


@pytest.fixture
async def e2b_http() -> AsyncIterator[TestClient[web.Request, web.Application]]:
    client = AsyncClient("127.0.0.1:1")
    app = make_app(client, E2bSettings(api_keys=frozenset({KEY})))
    async with TestClient(TestServer(app)) as c:
        yield c
    await client.close()
