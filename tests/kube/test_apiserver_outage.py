"""The Kubernetes API server unavailable for a while. The control plane
talks to a second kube-apiserver (tests/kube/apiserver.py) that is first
paused (SIGSTOP: it hangs), then killed and started again once a whole Pod
create has failed; the rest of the cluster keeps running through the first
one. During the outage: calls that need the API
answer UNAVAILABLE at once with a message that says so, in-memory calls and
coalesced heartbeats keep working, leases are kept. After it: the Pod watch
re-syncs (a Pod deleted behind its back during the outage is noticed), the
pool returns to its target by itself, exec works again in the leased
sandbox, and nothing is orphaned."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sandboxd.app import build_app
from sandboxd.backends.kubernetes import KubernetesBackend
from sandboxd.backends.kubernetes.client import KubeClient
from sandboxd.backends.kubernetes.ledger import ANNOTATION_LEASE
from sandboxd.backends.kubernetes.podspec import pod_name, selector
from sandboxd.client import AsyncClient
from sandboxd.errors import TransientBackendError
from sandboxd.v1 import common_pb2
from tests.kube.apiserver import SecondApiServer
from tests.kube.conftest import IMAGE, kube_settings, pods, poll
from tests.kube.test_exec import LOCAL_EXEC_NS, _ensure_namespace

pytestmark = [pytest.mark.kube, pytest.mark.timeout(300)]


@pytest.fixture
async def second(kubeconfig: str, tmp_path: Path) -> AsyncIterator[SecondApiServer]:
    try:
        server = SecondApiServer(kubeconfig, tmp_path)
    except LookupError as e:
        pytest.skip(str(e))
    await server.start()
    try:
        yield server
    finally:
        await server.close()


async def test_an_api_server_outage_is_survived(
    tmp_path: Path, kube: KubeClient, second: SecondApiServer
) -> None:
    await _ensure_namespace(kube)  # kwok runs exec in this namespace as local processes
    settings = kube_settings(
        tmp_path, second.kubeconfig, LOCAL_EXEC_NS, instance_id="out-" + secrets.token_hex(4),
        **{"leases.orphan_sweep_seconds": 1.0, "pools.liveness_interval_seconds": 0.5},
    )  # fmt: skip
    sel = selector(settings.instance_id)
    app = build_app(settings)
    await app.start()
    assert isinstance(app.backend, KubernetesBackend)
    cache = app.backend.cache
    try:
        async with AsyncClient(app.address) as client:
            await client.create_pool("out", IMAGE, min_ready=3, max_size=8)

            async def at_target() -> bool:
                return (await client.get_pool("out")).status.ready >= 3

            await poll(at_target, timeout=90, what="the pool to warm")
            held = await client.lease("out", n=1, lease_ttl=120, timeout=30)
            sid = held.sandboxes[0].id
            assert (await client.exec(sid, ["echo", "before"], cwd="/tmp")).stdout == b"before\n"
            await poll(at_target, timeout=90, what="the pool to refill")
            warm = [s.id for s in await client.list_sandboxes("out", state=common_pb2.SANDBOX_STATE_READY)]
            relists = cache.relists

            # A hung API server (accepts connections, never answers): an exec
            # answers UNAVAILABLE after its open deadline instead of hanging,
            # and a heartbeat (nothing due to write) is not held up at all.
            loop = asyncio.get_running_loop()
            second.pause()
            try:
                began = loop.time()
                with pytest.raises(TransientBackendError, match="API server"):
                    await asyncio.wait_for(client.exec(sid, ["echo", "hung"], cwd="/tmp"), 30)
                assert loop.time() - began < 25
                await asyncio.wait_for(client.heartbeat(held.id), 5)
            finally:
                second.resume()
            assert (await client.exec(sid, ["echo", "resumed"], cwd="/tmp")).stdout == b"resumed\n"

            await second.kill()
            # What needs the API server answers UNAVAILABLE, promptly.
            for call in (
                lambda: client.exec(sid, ["echo", "during"], cwd="/tmp"),
                lambda: client.exec(sid, "echo during", session="s"),
                lambda: client.read_files(sid, ["x"]),
                lambda: client.create_pool("other", IMAGE, min_ready=0, max_size=1),
            ):
                began = loop.time()
                # UNAVAILABLE on the wire (the client's TransientBackendError).
                with pytest.raises(TransientBackendError) as info:
                    await asyncio.wait_for(call(), 20)
                assert "API server" in str(info.value), info.value
                assert loop.time() - began < 15
            # What does not, works: the lease is kept and heartbeats
            # (coalesced: nothing to write yet) succeed; a warm sandbox is
            # still handed out, its lease recorded on the Pod once the API
            # server is back (written behind the answer).
            await client.heartbeat(held.id)
            during = await asyncio.wait_for(client.lease("out", n=1, lease_ttl=120, timeout=20), 15)
            victim = next(w for w in warm if w != during.sandboxes[0].id)
            sb = await client.get_sandbox(sid)
            assert sb.state == common_pb2.SANDBOX_STATE_LEASED and sb.lease_id == held.id
            # The outage lasts until a whole create (all its retries) has
            # failed: the pool is below target and cannot refill.
            pool = app.control.pools["out"]
            failed = pool.failed_total
            await poll(lambda: pool.failed_total > failed, timeout=120, what="a create to fail for good")
            assert (await client.get_pool("out")).status.ready < 3
            # Behind the control plane's back (through the first API server),
            # a warm Pod goes away while it cannot watch.
            await kube.request(
                "DELETE",
                f"/api/v1/namespaces/{LOCAL_EXEC_NS}/pods/{pod_name(victim)}",
                body={"gracePeriodSeconds": 0},
            )

            await second.start()
            # The watch re-syncs: the deleted Pod drops out of the cache.
            await poll(lambda: cache.get(pod_name(victim)) is None, timeout=60, what="the watch to re-sync")
            assert cache.relists > relists
            await poll(at_target, timeout=90, what="the pool to return to its target")
            await client.heartbeat(held.id)
            await client.heartbeat(during.id)
            during_pod = f"/api/v1/namespaces/{LOCAL_EXEC_NS}/pods/{pod_name(during.sandboxes[0].id)}"

            async def recorded() -> bool:
                pod = await kube.request("GET", during_pod)
                return during.id in (pod["metadata"].get("annotations") or {}).get(ANNOTATION_LEASE, "")

            await poll(recorded, timeout=30, what="the lease taken during the outage to be recorded")
            await client.release(during.id)
            assert (await client.exec(sid, ["echo", "after"], cwd="/tmp")).stdout == b"after\n"

            # No orphans: every Pod of the instance is one the control plane knows.
            async def no_orphans() -> bool:
                known = {s.id for s in await client.list_sandboxes("out")}
                live = {
                    p["metadata"]["labels"]["sandboxd.sandbox"] for p in await pods(kube, LOCAL_EXEC_NS, sel)
                }
                return live <= known

            await poll(no_orphans, timeout=60, what="Pods left by failed calls to be removed")
            await client.release(held.id)
    finally:
        await app.stop(grace=1)
    await poll(lambda: _gone(kube, sel), timeout=60, what="every Pod of the instance to be gone")


async def _gone(kube: KubeClient, sel: str) -> bool:
    return not await pods(kube, LOCAL_EXEC_NS, sel)
