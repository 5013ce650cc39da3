"""On the test cluster: a sandbox's Pod prefers the node whose
status.images lists its image, and the scheduler puts it there."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from sandboxd.app import build_app
from sandboxd.backends.kubernetes.client import KubeClient
from sandboxd.backends.kubernetes.podspec import selector
from sandboxd.client import AsyncClient
from tests.kube.conftest import IMAGE, kube_settings, pods, poll

pytestmark = [pytest.mark.kube, pytest.mark.timeout(180)]


async def _open_nodes(kube: KubeClient) -> list[str]:
    """The nodes a sandbox Pod of default settings may land on: those without
    a NoSchedule or NoExecute taint (the real kubelet node carries one)."""
    items = (await kube.request("GET", "/api/v1/nodes"))["items"]
    return sorted(
        n["metadata"]["name"]
        for n in items
        if not any(
            t.get("effect") in ("NoSchedule", "NoExecute") for t in (n.get("spec") or {}).get("taints") or []
        )
    )


async def _set_images(kube: KubeClient, node: str, names: list[str]) -> None:
    body = {"status": {"images": [{"names": names, "sizeBytes": 800 << 20}] if names else []}}
    await kube.request(
        "PATCH", f"/api/v1/nodes/{node}/status", body=body, content_type="application/merge-patch+json"
    )


async def test_a_pod_goes_where_its_image_already_is(
    tmp_path: Path, kubeconfig: str, namespace: str, kube: KubeClient
) -> None:
    nodes = await _open_nodes(kube)
    holder = nodes[-1]
    image = f"127.0.0.1:5000/task-{secrets.token_hex(4)}:v1"
    await _set_images(kube, holder, [image])
    settings = kube_settings(tmp_path, kubeconfig, namespace)
    app = build_app(settings)
    await app.start()
    try:
        async with AsyncClient(app.address) as client:
            await client.create_pool("per-task", image, min_ready=2, max_size=2)

            async def placed() -> bool:
                return (
                    sum(
                        bool(p["spec"].get("nodeName"))
                        for p in await pods(kube, namespace, selector(settings.instance_id))
                    )
                    >= 2
                )

            await poll(placed, timeout=90, what="two Pods scheduled")
            for pod in await pods(kube, namespace, selector(settings.instance_id)):
                [term] = pod["spec"]["affinity"]["nodeAffinity"][
                    "preferredDuringSchedulingIgnoredDuringExecution"
                ]
                assert term["preference"]["matchExpressions"][0]["values"] == [holder]
                assert pod["spec"]["nodeName"] == holder
    finally:
        await app.stop()
        await _set_images(kube, holder, [])


async def test_announced_images_are_pulled_onto_the_nodes_lacking_them(
    tmp_path: Path, kubeconfig: str, namespace: str, kube: KubeClient
) -> None:
    from sandboxd.backends.kubernetes.prepull import LABEL_PREPULL

    nodes = await _open_nodes(kube)
    holder = nodes[0]
    image = f"127.0.0.1:5000/task-{secrets.token_hex(4)}:v1"
    await _set_images(kube, holder, [image])
    settings = kube_settings(tmp_path, kubeconfig, namespace, backend={"image_pull_secrets": ["regcred"]})
    app = build_app(settings)
    await app.start()
    seen: dict[str, dict[str, object]] = {}
    try:
        # Announced for a template pool with a pull secret of its own.
        async with AsyncClient(app.address) as client:
            await client.create_pool(
                "swe", IMAGE, max_size=8, max_ready=8, images=["*"], image_pull_secrets=["task-reg"]
            )
            await client.set_demand("swe", 8, in_seconds=60, ttl=300, images={image: 8})

        async def prepulls() -> list[dict[str, object]]:
            found = await pods(kube, namespace, f"{LABEL_PREPULL}={settings.instance_id}")
            for pod in found:
                seen[pod["metadata"]["name"]] = pod
            return found

        async def all_started() -> bool:
            await prepulls()
            return len(seen) == len(nodes) - 1

        await poll(all_started, timeout=60, what="a pre-pull Pod on each node lacking the image")
        assert {p["spec"]["nodeName"] for p in seen.values()} == set(nodes) - {holder}  # type: ignore[index]
        for pod in seen.values():
            spec = pod["spec"]
            assert spec["containers"][0]["image"] == image  # type: ignore[index]
            assert spec["imagePullSecrets"] == [{"name": "regcred"}, {"name": "task-reg"}]  # type: ignore[index]

        async def reaped() -> bool:
            return not await prepulls()

        # kwok starts their containers at once: each counts as pulled and goes.
        await poll(reaped, timeout=60, what="pre-pull Pods deleted once pulled")
        assert await pods(kube, namespace, selector(settings.instance_id)) == []  # none taken for a sandbox
    finally:
        await app.stop()
        await _set_images(kube, holder, [])
