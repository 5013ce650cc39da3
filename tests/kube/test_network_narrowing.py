"""A lease's network rules narrower than its pool's on Kubernetes, against
the real API server and ``sandboxd egress-proxy`` as the chart runs it: the
backend writes a Pod's lease rules and returns only once the proxy has
acknowledged them, so the proxy's very next decision for that Pod is by the
new rules (no stale window), the connections opened under the wider ones
are cut, and the pool's rules come back the same way; a proxy that does not
acknowledge fails the change, and a chart whose proxy cannot is refused up
front. A lease narrowed to no network at all (no_network) is refused
everything, its resolver answering no name. A running lease's rules changed
through the server (SetLeaseNetwork) are acknowledged before the call
answers, and a restart puts back the latest. On the real kubelet node, end
to end through the server: a narrowed lease's Pod is refused the host its
pool allows but its lease does not, while an un-narrowed lease of the same
pool reaches it; that one, cut to no network while it runs, is refused it
at once, and widened back reaches it again."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandboxd import errors
from sandboxd.app import build_app
from sandboxd.backends.base import LABEL_SANDBOX
from sandboxd.backends.kubernetes import KubernetesBackend, KubernetesOptions
from sandboxd.backends.kubernetes.client import KubeClient, KubeError, load_configuration
from sandboxd.backends.kubernetes.egress import (
    ACK_PREFIX,
    ANNOTATION_LEASE_NETWORK,
    ANNOTATION_NETWORK_REV,
    ANNOTATION_PROXY_ACKS,
    EgressProxyRef,
)
from sandboxd.backends.network.policy import NO_EGRESS, NO_NETWORK
from sandboxd.client import AsyncClient
from sandboxd.images.build import default_image_tag
from tests.kube.conftest import IMAGE, REAL_NODE_BACKEND, kube_settings, pods, poll, require_real_node
from tests.kube.egress_proxy import (
    FETCH,
    PROXY,
    PROXY_LABELS,
    RULES,
    bridge_address,
    free_port,
    host_proxy,
    proxy_get,
    proxy_resolve,
    proxy_service,
    upstream,
)
from tests.kube.proxy_pod import PODS_INSTANCE, proxy_stand_in, sandbox_pod_at

pytestmark = [pytest.mark.kube, pytest.mark.timeout(180)]

__all__ = ["upstream"]  # the fixture


@pytest.fixture
def held() -> Iterator[tuple[int, list[socket.socket]]]:
    """A server on this host that takes connections and never answers (what it took, to close)."""
    server = socket.create_server(("127.0.0.1", 0))
    taken: list[socket.socket] = []
    server.settimeout(0.2)
    stop = False

    def accept() -> None:
        while not stop:
            with contextlib.suppress(TimeoutError, OSError):
                taken.append(server.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1], taken
    finally:
        stop = True
        thread.join(5)
        for s in taken:
            s.close()
        server.close()


def _backend(kubeconfig: str, namespace: str) -> KubernetesBackend:
    opts = KubernetesOptions(
        instance=PODS_INSTANCE,
        namespace=namespace,
        kubeconfig=kubeconfig,
        threads=4,
        network_policy=False,
        egress_proxy=EgressProxyRef(PROXY, namespace),
    )
    return KubernetesBackend(opts, KubeClient(load_configuration(kubeconfig, None), threads=4))


async def test_the_proxys_next_decision_after_a_change_of_rules_is_the_new_one(
    kubeconfig: str, namespace: str, kube: KubeClient, upstream: int, held: tuple[int, list[socket.socket]]
) -> None:
    hold_port, taken = held
    wider, holding = f"127.0.0.1:{upstream}", f"127.0.0.1:{hold_port}"
    name = await sandbox_pod_at(kube, namespace, "sb-narrow1", "127.0.0.1", [wider, holding, "pypi.internal"])
    port, dns = free_port(socket.SOCK_STREAM), free_port(socket.SOCK_DGRAM)
    await proxy_service(kube, namespace, port, dns, acks=True)
    backend = _backend(kubeconfig, namespace)
    await backend.ping()
    try:
        async with proxy_stand_in(kube, namespace, PROXY_LABELS, "127.0.0.1") as uid:
            async with host_proxy(kubeconfig, namespace, port=port, dns_port=dns, ack_as=uid):
                assert await backend.narrowing_refusal("runc") is None
                # A connection opened under the pool's rules, held open upstream.
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(f"GET http://{holding}/ HTTP/1.1\r\nHost: {holding}\r\n\r\n".encode())
                await writer.drain()
                await poll(lambda: bool(taken), timeout=10, what="the held connection upstream")
                timings = []
                for _ in range(5):
                    began = time.monotonic()
                    await backend.narrow_egress(name, (holding,))
                    timings.append(time.monotonic() - began)
                    # The very next decisions, no waiting: by the lease's rules.
                    denied = await proxy_get(port, wider)
                    assert denied.startswith(b"HTTP/1.1 403") and b"the lease's rules" in denied, denied[:300]
                    no = await proxy_resolve(port=dns, name="pypi.internal")
                    assert no[3] & 0x0F == 3, "NXDOMAIN for a name only the pool's rules name"
                    # And at once by the pool's again (a recycled sandbox's reset).
                    await backend.narrow_egress(name, ())
                    ok = await proxy_get(port, wider)
                    assert ok.endswith(b"upstream ok\n"), ok[:300]
                    yes = await proxy_resolve(port=dns, name="pypi.internal")
                    assert yes[3] & 0x0F == 0
                print(f"narrow_egress with the proxy's acknowledgement: max {max(timings) * 1000:.0f} ms")
                # No network at all: everything refused, no name answered, at once.
                await backend.narrow_egress(name, NO_NETWORK)
                denied = await proxy_get(port, wider)
                assert denied.startswith(b"HTTP/1.1 403") and b"no network at all" in denied, denied[:300]
                no = await proxy_resolve(port=dns, name="pypi.internal")
                assert no[3] & 0x0F == 3, "NXDOMAIN under no network at all"
                await backend.narrow_egress(name, ())
                ok = await proxy_get(port, wider)
                assert ok.endswith(b"upstream ok\n"), ok[:300]
                # The connection opened under the pool's rules was cut by the first narrowing.
                assert await asyncio.wait_for(reader.read(), 10) == b""
                writer.close()
                pod = await kube.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
                annotations = pod["metadata"]["annotations"]
                assert ACK_PREFIX + uid in annotations and ANNOTATION_LEASE_NETWORK not in annotations
            # With no proxy to acknowledge it, a change fails rather than returning.
            with pytest.raises(errors.BackendError, match="did not acknowledge"):
                await backend.narrow_egress(name, (holding,))
    finally:
        await backend.close()


async def test_a_chart_whose_proxy_cannot_acknowledge_is_refused_narrowing(
    kubeconfig: str, namespace: str, kube: KubeClient
) -> None:
    await proxy_service(kube, namespace)
    backend = _backend(kubeconfig, namespace)
    await backend.ping()
    try:
        why = await backend.narrowing_refusal("runc")
        assert why is not None and ANNOTATION_PROXY_ACKS in why and "upgrade the chart" in why, why
        for rules in (("pypi.internal",), NO_NETWORK):
            with pytest.raises(errors.FailedPrecondition, match="upgrade the chart"):
                await backend.narrow_egress("no-such-pod", rules)
    finally:
        await backend.close()


async def test_a_restarted_control_plane_puts_an_adopted_lease_under_its_narrower_rules_again(
    tmp_path: Path, kubeconfig: str, namespace: str, kube: KubeClient
) -> None:
    settings = kube_settings(tmp_path, kubeconfig, namespace, backend={"egress_proxy_service": PROXY})
    async with (
        proxy_stand_in(kube, namespace, PROXY_LABELS, "127.0.0.1") as uid,
        host_proxy(kubeconfig, namespace, ack_as=uid) as (port, dns),
    ):
        await proxy_service(kube, namespace, port, dns, acks=True)
        app = build_app(settings)
        await app.start()
        try:
            async with AsyncClient(app.address) as client:
                await client.create_pool("net", IMAGE, min_ready=0, max_size=2, network=RULES)
                lease = await client.lease("net", timeout=60, lease_ttl=120, network=["pypi.internal"])
                (sandbox_id,) = [sb.id for sb in lease]
                assert lease.network == ["pypi.internal"]
                # Changed while it runs: acknowledged by the proxy when the call answers.
                changed = await client.lease("net", timeout=60, lease_ttl=120)
                (changed_id,) = [sb.id for sb in changed]
                await changed.set_network(["*.corp.example:443"])
                await changed.set_network(no_network=True)
                assert changed.no_network and changed.network == []
                (pod,) = await pods(kube, namespace, f"{LABEL_SANDBOX}={changed_id}")
                now = pod["metadata"]["annotations"]
                assert json.loads(now[ANNOTATION_LEASE_NETWORK]) == [NO_EGRESS]
                assert now[ACK_PREFIX + uid] == now[ANNOTATION_NETWORK_REV]
                with pytest.raises(errors.InvalidArgument, match="lies outside the pool's rules"):
                    await changed.set_network(["evil.example"])
        finally:
            await app.stop(grace=1)
        (pod,) = await pods(kube, namespace, f"{LABEL_SANDBOX}={sandbox_id}")
        before = pod["metadata"]["annotations"]
        assert json.loads(before[ANNOTATION_LEASE_NETWORK]) == ["pypi.internal"]
        assert before[ACK_PREFIX + uid] == before[ANNOTATION_NETWORK_REV]
        app = build_app(settings)
        await app.start()
        try:
            async with AsyncClient(app.address) as client:
                again = await client.heartbeat(lease.id)
                assert list(again.network) == ["pypi.internal"] and list(again.sandbox_ids) == [sandbox_id]
                (pod,) = await pods(kube, namespace, f"{LABEL_SANDBOX}={sandbox_id}")
                after = pod["metadata"]["annotations"]
                # Written again by the adoption, and acknowledged before it went on.
                assert after[ANNOTATION_NETWORK_REV] != before[ANNOTATION_NETWORK_REV]
                assert after[ACK_PREFIX + uid] == after[ANNOTATION_NETWORK_REV]
                assert json.loads(after[ANNOTATION_LEASE_NETWORK]) == ["pypi.internal"]
                # The latest rules of the lease changed while it ran, from its mark.
                cut = await client.heartbeat(changed.id)
                assert cut.no_network and list(cut.network) == []
                (pod,) = await pods(kube, namespace, f"{LABEL_SANDBOX}={changed_id}")
                assert json.loads(pod["metadata"]["annotations"][ANNOTATION_LEASE_NETWORK]) == [NO_EGRESS]
                # Widened back to the pool's own: the lease's rules leave the Pod, acknowledged.
                await client.set_lease_network(changed.id)
                (pod,) = await pods(kube, namespace, f"{LABEL_SANDBOX}={changed_id}")
                annotations = pod["metadata"]["annotations"]
                assert ANNOTATION_LEASE_NETWORK not in annotations
                assert annotations[ACK_PREFIX + uid] == annotations[ANNOTATION_NETWORK_REV]
                await client.release(lease.id)
                await client.release(changed.id)
                await client.delete_pool("net", force=True)
        finally:
            await app.stop(grace=1)


async def test_a_narrowed_lease_is_refused_what_its_pool_allows_and_an_other_lease_reaches_it(
    tmp_path: Path, kubeconfig: str, namespace: str, kube: KubeClient, upstream: int
) -> None:
    require_real_node()
    gateway = await asyncio.to_thread(bridge_address)
    backend = {**REAL_NODE_BACKEND, "egress_proxy_service": PROXY}
    app = build_app(kube_settings(tmp_path, kubeconfig, namespace, backend=backend))
    await app.start()
    other = free_port(socket.SOCK_STREAM)
    try:
        async with (
            proxy_stand_in(kube, namespace, PROXY_LABELS, gateway) as uid,
            host_proxy(kubeconfig, namespace, listen=gateway, ack_as=uid) as (port, dns),
            AsyncClient(app.address) as client,
        ):
            await proxy_service(kube, namespace, port, dns, acks=True)
            image = os.environ.get("SANDBOXD_KUBE_IMAGE", "") or default_image_tag()
            target = f"127.0.0.1:{upstream}"
            await client.create_pool(
                "net",
                image,
                min_ready=2,  # kept warm: the recycled sandboxes are the ones leased next
                max_size=2,
                network=[target, f"127.0.0.1:{other}"],
                recycle="same-tenant",
                max_uses=3,
            )
            via = f"http://{gateway}:{port}"
            fetch = ["python3", "-c", FETCH, via, f"http://{target}/"]
            async with (
                client.acquire("net", timeout=120, network=[f"127.0.0.1:{other}"]) as narrowed,
                client.acquire("net", timeout=120) as plain,
            ):
                refused = await narrowed.exec(fetch, timeout=30)
                assert refused.stdout.startswith(b"403 sandboxd egress denied"), refused
                assert b"the lease's rules" in refused.stdout, refused
                reached = await plain.exec(fetch, timeout=30)
                assert reached.ok and reached.stdout == b"upstream ok\n", reached
                # Cut to no network while it runs: refused from the moment the call answers.
                await client.set_lease_network(plain.lease_id, no_network=True)
                cut = await plain.exec(fetch, timeout=30)
                assert cut.stdout.startswith(b"403 sandboxd egress denied"), cut
                assert b"no network at all" in cut.stdout, cut
                await client.set_lease_network(plain.lease_id)
                back = await plain.exec(fetch, timeout=30)
                assert back.ok and back.stdout == b"upstream ok\n", back
            # Recycled, the narrowed sandbox is its pool's again for its next lease.
            pool = app.control.pools["net"]
            await poll(lambda: pool.recycled_total == 2, timeout=120, what="both resets")
            async with client.acquire_group("net", 2, timeout=120) as group:
                assert narrowed.id in [sb.id for sb in group]
                for sb in group:
                    again = await sb.exec(fetch, timeout=30)
                    assert again.ok and again.stdout == b"upstream ok\n", (sb.id, again)
            await client.delete_pool("net", force=True)
    finally:
        await app.stop(grace=1)
        with contextlib.suppress(KubeError):
            await kube.request("DELETE", f"/api/v1/namespaces/{namespace}/services/{PROXY}")
