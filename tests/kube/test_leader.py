"""Leader election on a real coordination.k8s.io Lease: only one of two
electors leads; the standby takes over when the leader stops renewing."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Callable
from pathlib import Path

import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sandboxd.app import LIVENESS_SERVICE, build_app
from sandboxd.backends.kubernetes import LeaderElector
from sandboxd.backends.kubernetes.client import KubeClient
from sandboxd.client import AsyncClient
from tests.kube.conftest import kube_settings, poll

pytestmark = [pytest.mark.kube, pytest.mark.timeout(90)]


def elector(kube: KubeClient, namespace: str, lease: str, who: str) -> LeaderElector:
    return LeaderElector(
        kube, namespace, lease, who, lease_duration=3.0, renew_deadline=2.0, retry_period=0.25
    )


async def watch_renewals(
    kube: KubeClient, namespace: str, lease: str, count: int, holds: Callable[[], bool]
) -> None:
    """Waits until the Lease has been renewed ``count`` times (its renewTime
    moved), checking ``holds`` at every look: a property that must stay true
    across renewal rounds, observed round by round rather than over a guessed
    stretch of time."""
    seen: list[str] = []

    async def renewed() -> bool:
        assert holds(), "the invariant broke between two renewals"
        held = await kube.request(
            "GET", f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{lease}"
        )
        stamp = str(held["spec"].get("renewTime"))
        if not seen or seen[-1] != stamp:
            seen.append(stamp)
        return len(seen) > count

    await poll(renewed, timeout=30, what=f"{count} renewals of {lease}")


async def test_only_one_leads_and_the_standby_takes_over_after_renewals_stop(
    kube: KubeClient, namespace: str
) -> None:
    lease = "sandboxd-" + secrets.token_hex(3)
    a, b = elector(kube, namespace, lease, "a"), elector(kube, namespace, lease, "b")
    a.start()
    b.start()
    try:
        await poll(lambda: a.is_leader or b.is_leader, timeout=20, what="a leader")
        leader, standby = (a, b) if a.is_leader else (b, a)
        # Several renewal rounds pass: leadership stays put, never shared.
        await watch_renewals(kube, namespace, lease, 6, lambda: leader.is_leader and not standby.is_leader)
        held = await kube.request(
            "GET", f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{lease}"
        )
        assert held["spec"]["holderIdentity"] == leader.identity
        # The leader dies without releasing (a crash): the standby waits out
        # the lease duration as seen on its own clock, then takes over.
        await leader.stop(release=False)
        await poll(lambda: standby.is_leader, timeout=20, what="standby to take over")
        held = await kube.request(
            "GET", f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{lease}"
        )
        assert held["spec"]["holderIdentity"] == standby.identity
        assert held["spec"]["leaseTransitions"] >= 1
    finally:
        await a.stop()
        await b.stop()


async def test_a_clean_stop_hands_over_at_once(kube: KubeClient, namespace: str) -> None:
    lease = "sandboxd-" + secrets.token_hex(3)
    a = elector(kube, namespace, lease, "a")
    await a.wait_leading(timeout=20)
    b = elector(kube, namespace, lease, "b")
    b.start()
    try:
        # b retries every 0.25 s; over two of a's renewals it must not lead.
        await watch_renewals(kube, namespace, lease, 2, lambda: not b.is_leader)
        await a.stop(release=True)
        # Released: b need not wait out the 3 s lease duration.
        loop = asyncio.get_running_loop()
        started = loop.time()
        await poll(lambda: b.is_leader, timeout=20, what="b to lead")
        assert loop.time() - started < 2.5
    finally:
        await a.stop()
        await b.stop()


async def test_a_leader_that_cannot_renew_steps_down(kube: KubeClient, namespace: str) -> None:
    lease = "sandboxd-" + secrets.token_hex(3)
    a = elector(kube, namespace, lease, "a")
    await a.wait_leading(timeout=20)
    try:
        # Someone else takes the Lease by force (e.g. an operator): a's
        # renewals now fail the holder check and it steps down.
        path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{lease}"
        for _ in range(5):
            held = await kube.request("GET", path)
            held["spec"]["holderIdentity"] = "intruder"
            held["spec"]["leaseDurationSeconds"] = 60
            try:
                await kube.request("PUT", path, body=held)
                break
            except Exception:
                continue
        await poll(lambda: a.lost.is_set(), timeout=20, what="a to step down")
        assert not a.is_leader
    finally:
        await a.stop()


async def test_two_replicas_only_the_leader_serves_and_the_standby_takes_over(
    tmp_path: Path, kubeconfig: str, namespace: str
) -> None:
    settings = kube_settings(
        tmp_path,
        kubeconfig,
        namespace,
        backend={"leader_election": True, "lease_name": "sandboxd-" + secrets.token_hex(3)},
    )
    first, second = build_app(settings), build_app(settings)
    await first.start()
    first_running = True
    standby = asyncio.create_task(second.start())
    try:
        async with AsyncClient(first.address) as c1, AsyncClient(second.address) as c2:
            await poll(lambda: _status(c2, ""), timeout=20, what="standby to answer health")
            assert await _status(c1, "") == health_pb2.HealthCheckResponse.SERVING
            assert await _status(c2, "") == health_pb2.HealthCheckResponse.NOT_SERVING
            assert await _status(c2, LIVENESS_SERVICE) == health_pb2.HealthCheckResponse.SERVING
            assert not standby.done()
            first_running = False
            await first.stop(grace=1)  # releases the Lease
            await asyncio.wait_for(standby, 30)
            assert await _status(c2, "") == health_pb2.HealthCheckResponse.SERVING
    finally:
        if first_running:
            await first.stop(grace=1)
        if not standby.done():
            standby.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await standby
        await second.stop(grace=1)


async def _status(client: AsyncClient, service: str) -> int:
    stub = health_pb2_grpc.HealthStub(client._channel)
    try:
        reply = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=2)
    except Exception:
        return 0
    return int(reply.status)
