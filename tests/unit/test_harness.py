"""The unit tier's own machinery must be able to fail."""

from __future__ import annotations

import asyncio

import pytest

from tests.unit.conftest import pending_tasks_since, wait_for


@pytest.mark.timeout(10)
async def test_wait_for_fails_at_its_deadline() -> None:
    with pytest.raises(AssertionError, match="not met within"):
        await wait_for(lambda: False, timeout=0.05, what="never")


@pytest.mark.timeout(10)
async def test_wait_for_returns_once_the_condition_holds() -> None:
    flag = asyncio.Event()
    asyncio.get_running_loop().call_later(0.01, flag.set)
    await wait_for(flag.is_set, timeout=2.0)


@pytest.mark.timeout(10)
async def test_leak_guard_sees_a_pending_task() -> None:
    before = asyncio.all_tasks()
    stray = asyncio.create_task(asyncio.Event().wait(), name="stray")
    try:
        assert stray in pending_tasks_since(before)
    finally:
        stray.cancel()
        await asyncio.gather(stray, return_exceptions=True)
    assert stray not in pending_tasks_since(before)
