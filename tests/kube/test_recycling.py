"""Recycling on Kubernetes, on the real kubelet node: a released sandbox is
reset in place inside its Pod (no Pod delete and create), so a hostile
tenant's files, background process and session state never reach the next
lease; after max_uses leases the Pod is replaced."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandboxd.client import AsyncClient
from sandboxd.images.build import default_image_tag
from tests.kube.conftest import poll, real_node_app

pytestmark = [pytest.mark.kube, pytest.mark.timeout(240)]

HOSTILE = (
    "echo secret > /workspace/secret.txt; echo t > /tmp/left.txt; "
    "nohup sh -c 'while :; do date > /tmp/daemon.txt; sleep 0.1; done' >/dev/null 2>&1 &"
)

# Processes running the hostile loop (the pattern split so as not to match
# itself). The loop's `date` and `sleep` come and go while /proc is read, and
# for a moment a forked subshell carries the loop's command line too.
LEFT = r"""
import os
seen = 0
for p in os.listdir("/proc"):
    if p.isdigit():
        try:
            seen += b"daemon" + b".txt" in open(f"/proc/{p}/cmdline", "rb").read()
        except OSError:
            pass
print(seen)
"""


async def test_a_pod_is_reset_in_place_and_replaced_after_max_uses(
    tmp_path: Path, kubeconfig: str, namespace: str
) -> None:
    async with (
        real_node_app(tmp_path, kubeconfig, namespace) as app,
        AsyncClient(app.address) as client,
    ):
        await client.create_pool(
            "rc", default_image_tag(), min_ready=1, max_size=1, recycle="same-tenant", max_uses=2
        )
        pool = app.control.pools["rc"]
        async with client.acquire("rc", timeout=180) as sb:
            first, pod = sb.id, app.control._index[sb.id].handle
            assert (await sb.exec(HOSTILE)).ok
            assert int((await sb.exec(["python3", "-c", LEFT])).text) >= 1
            assert (await sb.exec("export TOKEN=hunter2", session="agent")).ok
        await poll(
            lambda: bool(pool.recycled_total or pool._recycler.destroyed), timeout=120, what="the reset"
        )
        assert pool.recycled_total == 1, pool._recycler.destroyed
        async with client.acquire("rc", timeout=180) as sb:
            # The same Pod, not a new one.
            assert sb.id == first and app.control._index[sb.id].handle == pod
            look = await sb.exec(
                "ls -A /workspace /tmp; ps -eo args | grep -c 'date >' ; echo [$TOKEN]", session="agent"
            )
            assert look.text.split() == ["/tmp:", "/workspace:", "1", "[]"], look.text
        # Its second lease was its last (max_uses 2): a new Pod replaces it.
        await poll(lambda: first not in app.control._index and pool.ready == 1, timeout=180, what="a new Pod")
        assert pool._recycler.destroyed == {"max uses": 1}
        async with client.acquire("rc", timeout=180) as sb:
            assert app.control._index[sb.id].handle != pod
