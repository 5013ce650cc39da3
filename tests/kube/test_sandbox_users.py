"""Pods on one real node share no per-user kernel limit: each runs as a uid
of its own, so one that takes every inotify instance of its uid and queues
real-time signals to its limit leaves another Pod's inotify_init1,
timer_create and coreutils ``timeout`` working, and tools name the user."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

import pytest

from sandboxd.client import AsyncClient, Sandbox
from tests.integration.test_sandbox_users_docker import CHECK, HOG
from tests.kube.conftest import poll, real_node_app
from tests.kube.test_exec import _real_image

pytestmark = [pytest.mark.kube, pytest.mark.kube_node, pytest.mark.timeout(240)]


async def test_one_pod_taking_its_users_kernel_limits_leaves_another_working(
    tmp_path: Path, kubeconfig: str, namespace: str
) -> None:
    limits = {"limits.memory_bytes": 256 << 20}
    async with (
        real_node_app(tmp_path, kubeconfig, namespace, **limits) as app,
        AsyncClient(app.address) as client,
    ):
        await client.create_pool("users", _real_image(), min_ready=0, max_size=2)
        lease = await client.lease("users", n=2, lease_ttl=600, timeout=120)
        try:
            await _check(*lease.sandboxes)
        finally:
            await lease.release()


async def _check(hog: Sandbox, other: Sandbox) -> None:
    uids = [(await sb.exec("id -u")).text for sb in (hog, other)]
    assert uids[0] != uids[1] and "1000\n" not in uids, uids
    # The workspace is the Pod's fsGroup's; the user tables name the uid.
    who = await other.exec('id -un; whoami; echo "$USER $LOGNAME"; stat -c %g /workspace')
    assert who.text == f"sandbox\nsandbox\nsandbox sandbox\n{uids[1]}", who
    held = asyncio.ensure_future(hog.exec(["python3", "-c", HOG], timeout=200))
    try:

        async def ready() -> bool:
            return (await hog.exec("test -s hog.json")).ok

        await poll(ready, timeout=120, what="the hog to hold its limits")
        took = json.loads(await hog.read_file("hog.json"))
        assert (took["inotify"], took["sigqueue"], took["timer"]) == ("EMFILE", "EAGAIN", "EAGAIN"), took
        r = await other.exec(["python3", "-c", CHECK])
        assert r.ok and json.loads(r.stdout) == {"inotify": "ok", "timer": "ok"}, r
        r = await other.exec("timeout 1 true")
        assert r.ok and r.stderr == b"", r
    finally:
        with contextlib.suppress(Exception):
            await hog.exec("pkill -f 'import ctypes, errno, json, os, signal'")
        held.cancel()
        with contextlib.suppress(BaseException):
            await held
