"""The Kubernetes backend's Deployment half against a real API server."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator

import pytest

from sandboxd.backends.base import (
    LABEL_INSTANCE,
    LABEL_MANAGED,
    LABEL_POOL,
    LABEL_SANDBOX,
    Limits,
    SandboxSpec,
)
from sandboxd.backends.kubernetes import KubernetesBackend, KubernetesOptions, PodOptions
from sandboxd.backends.kubernetes.client import KubeClient, load_configuration
from sandboxd.backends.kubernetes.podspec import LABEL_TENANT, NETWORK_POLICY_NAME, selector
from sandboxd.errors import PermanentBackendError, TransientBackendError
from tests.kube.conftest import IMAGE, pods, poll

pytestmark = [pytest.mark.kube, pytest.mark.timeout(120)]


def make_backend(
    kubeconfig: str, namespace: str, ready_timeout: float = 60, **pod: object
) -> KubernetesBackend:
    instance = "kt-" + secrets.token_hex(4)
    opts = KubernetesOptions(
        instance=instance,
        namespace=namespace,
        kubeconfig=kubeconfig,
        threads=4,
        ready_timeout=ready_timeout,
        pod=PodOptions(namespace=namespace, instance=instance, **pod),  # type: ignore[arg-type]
    )
    return KubernetesBackend(opts, KubeClient(load_configuration(kubeconfig, None), threads=4))


@pytest.fixture
async def backend(kubeconfig: str, namespace: str) -> AsyncIterator[KubernetesBackend]:
    b = make_backend(kubeconfig, namespace)
    await b.ping()
    try:
        yield b
    finally:
        for s in await b.list():
            await b.destroy(s.handle)
        await b.close()


def spec(pool: str = "team-a/py", **limits: int) -> SandboxSpec:
    return SandboxSpec(
        sandbox_id="sb-" + secrets.token_hex(6),
        pool=pool,
        image=IMAGE,
        limits=Limits(**{"memory_bytes": 64 << 20, "cpu_millis": 100, "disk_bytes": 32 << 20, **limits}),
        env={"A": "1"},
        labels={"run": "r/1 with spaces"},
    )


async def test_create_makes_a_hardened_labelled_running_pod(
    backend: KubernetesBackend, kube: KubeClient, namespace: str
) -> None:
    s = spec(max_files=1000)
    handle = await backend.create(s)
    pod = await kube.request("GET", f"/api/v1/namespaces/{namespace}/pods/{handle}")
    assert pod["status"]["phase"] == "Running"
    labels = pod["metadata"]["labels"]
    assert labels[LABEL_MANAGED] == "true"
    assert labels[LABEL_SANDBOX] == s.sandbox_id
    assert labels[LABEL_POOL] == "team-a.py"
    assert labels[LABEL_TENANT] == "team-a"
    assert LABEL_INSTANCE in labels
    podspec = pod["spec"]
    assert podspec["automountServiceAccountToken"] is False
    assert podspec["securityContext"]["runAsNonRoot"] is True
    # A uid of its own, which a listing adopts.
    uid, gid = backend.sandbox_user(handle)
    context = podspec["securityContext"]
    assert uid != 1000 and (context["runAsUser"], context["fsGroup"]) == (uid, gid)
    assert podspec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    c = podspec["containers"][0]
    sc = c["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert c["resources"]["limits"]["memory"] == str(64 << 20)
    assert c["resources"]["limits"]["cpu"] == "100m"
    assert c["resources"]["requests"]["cpu"] == "100m"
    workspace = next(v for v in podspec["volumes"] if v["name"] == "workspace")
    assert workspace["emptyDir"]["sizeLimit"] == str(32 << 20)
    assert pod["metadata"]["annotations"]["sandboxd.io/max-files"] == "1000"
    # The namespace enforces Pod Security "restricted": the API server admitted it.
    listed = await backend.list()
    assert [(x.sandbox_id, x.pool, x.handle, x.running) for x in listed] == [
        (s.sandbox_id, "team-a/py", handle, True)
    ]
    assert listed[0].labels["run"] == "r/1 with spaces"
    assert await backend.alive([handle, "sandboxd-sb-nothere"]) == {handle}


async def test_each_pod_runs_as_its_own_uid_which_a_new_control_plane_adopts(
    backend: KubernetesBackend, kubeconfig: str, namespace: str
) -> None:
    first, second = await backend.create(spec()), await backend.create(spec())
    uids = {backend.sandbox_user(first), backend.sandbox_user(second)}
    assert len(uids) == 2
    for handle in (first, second):
        pod = await backend.client.request("GET", f"/api/v1/namespaces/{namespace}/pods/{handle}")
        (container,) = pod["spec"]["containers"]
        assert (container["securityContext"]["runAsUser"], pod["spec"]["securityContext"]["fsGroup"]) == (
            backend.sandbox_user(handle)
        )
    # A control plane started again (same instance) finds each Pod's uid and
    # gives neither to a new Pod.
    again = KubernetesBackend(backend._options, KubeClient(load_configuration(kubeconfig, None), threads=4))
    try:
        assert {s.handle for s in await again.list()} == {first, second}
        assert {again.sandbox_user(first), again.sandbox_user(second)} == uids
        third = await again.create(spec())
        assert again.sandbox_user(third) not in uids
        await again.destroy(third)
    finally:
        await again.close()


async def test_deny_all_network_policy_exists(
    backend: KubernetesBackend, kube: KubeClient, namespace: str
) -> None:
    policy = await kube.request(
        "GET", f"/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies/{NETWORK_POLICY_NAME}"
    )
    assert policy["spec"]["podSelector"] == {"matchLabels": {LABEL_MANAGED: "true"}}
    assert sorted(policy["spec"]["policyTypes"]) == ["Egress", "Ingress"]
    assert not policy["spec"].get("ingress") and not policy["spec"].get("egress")
    # A second backend in the same namespace finds it and carries on.
    await backend.ping()


async def test_destroy_deletes_the_pod_and_is_idempotent(
    backend: KubernetesBackend, kube: KubeClient, namespace: str
) -> None:
    handle = await backend.create(spec())
    await backend.destroy(handle)
    await backend.destroy(handle)

    async def gone() -> bool:
        return not [p for p in await pods(kube, namespace, selector(backend._options.instance))]

    await poll(gone, timeout=30, what="Pod deleted")
    await poll(lambda: backend.cache.get(handle) is None, timeout=30, what="watch cache to drop the Pod")


async def test_unschedulable_create_fails_and_leaves_nothing(
    kubeconfig: str, kube: KubeClient, namespace: str
) -> None:
    b = make_backend(kubeconfig, namespace, ready_timeout=2, node_selector={"no-such-label": "x"})
    try:
        with pytest.raises(TransientBackendError, match="Unschedulable"):
            await b.create(spec())

        async def none_left() -> bool:
            return not await pods(kube, namespace, selector(b._options.instance))

        await poll(none_left, timeout=30, what="failed create to clean up")
    finally:
        await b.close()


async def test_capacity_reads_node_allocatable(backend: KubernetesBackend) -> None:
    memory, cpus = await backend.capacity()
    # up.sh's kwok nodes: 64 CPUs and 256 GiB each.
    assert cpus >= 64 and cpus % 64 == 0
    assert memory >= 256 << 30


async def test_capacity_is_capped_by_resource_quota(
    backend: KubernetesBackend, kube: KubeClient, namespace: str
) -> None:
    await kube.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/resourcequotas",
        body={"metadata": {"name": "q"}, "spec": {"hard": {"limits.memory": "8Gi", "limits.cpu": "6"}}},
    )
    assert await backend.capacity() == (8 << 30, 6)


async def test_image_exists_semantics(kubeconfig: str, namespace: str) -> None:
    b = make_backend(kubeconfig, namespace)
    assert await b.image_exists("anything:1")  # no allow-list: every image
    await b.close()
    allow = KubernetesBackend(
        KubernetesOptions(instance="x", namespace=namespace, kubeconfig=kubeconfig, allowed_images=(IMAGE,))
    )
    assert await allow.image_exists(IMAGE)
    assert not await allow.image_exists("other:1")
    await allow.close()
    nodes = KubernetesBackend(
        KubernetesOptions(instance="x", namespace=namespace, kubeconfig=kubeconfig, check_node_images=True)
    )
    # kwok nodes report no images.
    assert not await nodes.image_exists(IMAGE)
    await nodes.close()


async def test_update_limits_resizes_in_place_or_says_why(
    backend: KubernetesBackend, kube: KubeClient, namespace: str
) -> None:
    handle = await backend.create(spec())
    try:
        await backend.update_limits(handle, Limits(memory_bytes=128 << 20, cpu_millis=200))
    except PermanentBackendError as e:
        assert "resize" in str(e)
        return
    pod = await kube.request("GET", f"/api/v1/namespaces/{namespace}/pods/{handle}")
    assert pod["spec"]["containers"][0]["resources"]["limits"]["memory"] == str(128 << 20)
