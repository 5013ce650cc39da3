"""Kubernetes image placement, without a cluster: Pods prefer the nodes
whose status.images list their image, pull with the configured secrets, and
a node list that cannot be read leaves the Pod placed as before."""

from __future__ import annotations

from typing import Any

from sandboxd.backends.base import Limits, SandboxSpec
from sandboxd.backends.kubernetes.nodeimages import REFRESH_SECONDS, NodeImages, nodes_holding, spellings
from sandboxd.backends.kubernetes.podspec import PodOptions, build_pod
from sandboxd.errors import TransientBackendError
from sandboxd.settings import load_settings
from tests.unit.conftest import wait_for


def node(name: str, *images: list[str]) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {"images": [{"names": names} for names in images]}}


NODES = [
    node("n1", ["docker.io/library/python:3.11", "docker.io/library/python@sha256:aa"]),
    node("n2", ["127.0.0.1:5000/task-1:v1"], ["docker.io/library/python:3.11"]),
    node("n3"),
]


def test_nodes_holding_an_image_under_any_of_its_names() -> None:
    assert nodes_holding(NODES, "python:3.11") == ["n1", "n2"]
    assert nodes_holding(NODES, "docker.io/library/python:3.11") == ["n1", "n2"]
    assert nodes_holding(NODES, "127.0.0.1:5000/task-1:v1") == ["n2"]
    assert nodes_holding(NODES, "127.0.0.1:5000/task-2:v1") == []
    assert "docker.io/library/ubuntu:latest" in spellings("ubuntu")
    assert spellings("127.0.0.1:5000/x") == {"127.0.0.1:5000/x", "127.0.0.1:5000/x:latest"}


def test_the_pod_prefers_those_nodes_and_pulls_with_the_secrets() -> None:
    spec = SandboxSpec("sb-1", "pool", "127.0.0.1:5000/task-1:v1", Limits(memory_bytes=1 << 30))
    opts = PodOptions(namespace="ns", instance="i", image_pull_secrets=("regcred",))
    pod = build_pod(spec, opts, image_nodes=["n2"])["spec"]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    [term] = pod["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["preference"]["matchExpressions"] == [
        {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n2"]}
    ]
    plain = build_pod(spec, PodOptions(namespace="ns", instance="i"))["spec"]
    assert "affinity" not in plain and "imagePullSecrets" not in plain
    # A pool's own secrets come after the server's, each once.
    pooled = SandboxSpec(
        "sb-2", "pool", "127.0.0.1:5000/task-1:v1", Limits(), pull_secrets=("task-reg", "regcred")
    )
    assert build_pod(pooled, opts)["spec"]["imagePullSecrets"] == [{"name": "regcred"}, {"name": "task-reg"}]


async def test_node_lists_are_read_at_most_every_refresh_and_a_failure_means_no_preference() -> None:
    now = [0.0]
    reads = [0]
    fail = [False]

    async def list_nodes() -> list[dict[str, Any]]:
        reads[0] += 1
        if fail[0]:
            raise TransientBackendError("cannot list nodes: 403")
        return NODES

    images = NodeImages(list_nodes, lambda: now[0])
    assert await images.holding("python:3.11") == ["n1", "n2"]
    assert await images.holding("127.0.0.1:5000/task-1:v1") == ["n2"]
    assert reads[0] == 1
    now[0] += REFRESH_SECONDS
    fail[0] = True
    assert await images.holding("python:3.11") == []
    assert reads[0] == 2
    assert await images.holding("python:3.11") == []
    assert reads[0] == 2  # a failed read is not retried on every create


def test_settings_reach_the_backend() -> None:
    settings = load_settings(
        overrides={
            "backend.kind": "kubernetes",
            "backend.image_pull_secrets": ["regcred"],
            "backend.prefer_image_nodes": False,
        }
    )
    assert settings.backend.image_pull_secrets == ["regcred"]  # type: ignore[union-attr]
    assert settings.backend.prefer_image_nodes is False  # type: ignore[union-attr]


async def test_creates_at_once_share_one_read_and_all_see_it() -> None:
    import asyncio

    gate = asyncio.Event()
    reads = [0]

    async def list_nodes() -> list[dict[str, Any]]:
        reads[0] += 1
        await gate.wait()
        return NODES

    images = NodeImages(list_nodes, lambda: 0.0)
    waiting = [asyncio.create_task(images.holding("python:3.11")) for _ in range(4)]
    await wait_for(lambda: reads[0] == 1, what="the first create reading the nodes")
    gate.set()
    assert await asyncio.gather(*waiting) == [["n1", "n2"]] * 4
    assert reads[0] == 1


async def test_wanted_images_are_pulled_onto_nodes_once_per_while() -> None:
    from sandboxd.backends.base import ImagePrefetch
    from sandboxd.clock import FakeClock
    from sandboxd.core.images import ImageCache
    from sandboxd.core.images.prefetch import PREFETCH_AGAIN_SECONDS
    from sandboxd.settings import ImageSettings

    class Nodes:
        def __init__(self) -> None:
            self.calls: list[tuple[str, int]] = []
            self.secrets: list[tuple[str, ...]] = []
            self.fail = True

        async def image_exists(self, image: str) -> bool:
            return True

        async def prefetch_image(self, image: str, copies: int, pull_secrets: tuple[str, ...] = ()) -> int:
            self.calls.append((image, copies))
            self.secrets.append(pull_secrets)
            if self.fail:
                raise TransientBackendError("cannot list nodes")
            return copies

    backend = Nodes()
    assert isinstance(backend, ImagePrefetch)
    clock = FakeClock()
    cache = ImageCache(backend, clock, ImageSettings(evict_interval_seconds=0))
    await cache.start()
    try:
        cache.want("queue", {"reg/a:1": 3})
        await wait_for(lambda: len(backend.calls) == 1, what="first pre-pull")
        backend.fail = False
        # It failed: the next announcement tries again.
        await wait_for(
            lambda: cache._nodes is not None and "reg/a:1" not in cache._nodes.last, what="failure noted"
        )
        cache.want("queue", {"reg/a:1": 3, "reg/b:1": 1})
        await wait_for(lambda: len(backend.calls) == 3, what="retried and b")
        await wait_for(lambda: not cache._background, what="pre-pulls answered")
        cache.want("queue", {"reg/a:1": 5})
        clock.advance(PREFETCH_AGAIN_SECONDS / 2)
        cache.want("queue", {"reg/a:1": 5})
        assert not cache._background  # nothing started: pulled onto nodes a moment ago
        assert len(backend.calls) == 3
        clock.advance(PREFETCH_AGAIN_SECONDS)
        cache.want("queue", {"reg/a:1": 5})
        await wait_for(lambda: len(backend.calls) == 4, what="again after a while")
        assert backend.calls == [("reg/a:1", 3), ("reg/a:1", 3), ("reg/b:1", 1), ("reg/a:1", 5)]
        # An announcing pool's own pull secrets go with its pre-pulls.
        cache.want("pool:t/swe", {"reg/c:1": 2}, ("task-reg",))
        await wait_for(lambda: len(backend.calls) == 5, what="c")
        assert backend.secrets[-1] == ("task-reg",) and backend.secrets[0] == ()
    finally:
        await cache.stop()


def test_prepull_pods_are_hardened_bound_to_their_node_and_not_sandboxes() -> None:
    from sandboxd.backends.base import LABEL_INSTANCE, LABEL_MANAGED
    from sandboxd.backends.kubernetes.prepull import LABEL_PREPULL, prepull_pod, pulled

    opts = PodOptions(namespace="ns", instance="i", image_pull_secrets=("regcred",))
    pod = prepull_pod("reg/a:1", "n2", opts)
    assert pod["metadata"]["labels"] == {LABEL_PREPULL: "i"}
    assert LABEL_MANAGED not in pod["metadata"]["labels"] and LABEL_INSTANCE not in pod["metadata"]["labels"]
    spec = pod["spec"]
    assert spec["nodeName"] == "n2" and spec["restartPolicy"] == "Never"
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert prepull_pod("reg/a:1", "n2", opts)["metadata"]["name"] == pod["metadata"]["name"]
    assert prepull_pod("reg/a:1", "n3", opts)["metadata"]["name"] != pod["metadata"]["name"]
    pooled = prepull_pod("reg/a:1", "n2", opts, ("task-reg",))["spec"]["imagePullSecrets"]
    assert pooled == [{"name": "regcred"}, {"name": "task-reg"}]
    waiting = {"phase": "Pending", "containerStatuses": [{"state": {"waiting": {"reason": "ErrImagePull"}}}]}
    assert not pulled({"status": waiting})
    assert pulled({"status": {"phase": "Pending", "containerStatuses": [{"state": {"terminated": {}}}]}})
    assert pulled({"status": {"phase": "Failed"}})


async def test_a_node_busy_pulling_gets_no_more_pre_pulls_and_the_least_busy_go_first() -> None:
    from sandboxd.backends.kubernetes.prepull import PrePulls

    def pulling(node: str, n: int) -> dict[str, Any]:
        waiting = {"state": {"waiting": {"reason": "ContainerCreating"}}}
        return {"metadata": {"name": f"p-{node}-{n}"}, "spec": {"nodeName": node},
                "status": {"phase": "Pending", "containerStatuses": [waiting]}}  # fmt: skip

    class Client:
        def __init__(self) -> None:
            self.posted: list[str] = []
            self.in_flight = [pulling("n1", 1), pulling("n1", 2), pulling("n2", 1)]

        async def request(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
            if method == "GET":
                return {"items": self.in_flight}
            if method == "POST":
                self.posted.append(kw["body"]["spec"]["nodeName"])
            return {}

    async def nodes() -> list[dict[str, Any]]:
        return [{"metadata": {"name": n}} for n in ("n1", "n2", "n3", "n4")]

    async def holding(image: str) -> list[str]:
        return ["n4"]

    client = Client()
    prepulls = PrePulls(client, PodOptions(namespace="ns", instance="i"), nodes, holding, per_node=2)  # type: ignore[arg-type]
    prepulls._swept = True
    try:
        # n4 holds it; n1 runs two pre-pulls already (busy: not free); n3 is idle, then n2.
        assert await prepulls.prefetch("reg/a:1", 3) == 2
        assert client.posted == ["n3", "n2"]
    finally:
        await prepulls.close()
