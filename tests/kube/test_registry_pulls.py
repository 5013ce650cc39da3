"""Per-task images on Kubernetes from a real registry, on the real kubelet
node: the node's kubelet pulls a pool's image from the test registry (behind
basic auth) with the pool's own image pull secret; a pool without it is
refused by the registry, and its acquire fails with the pull's error at
once, not after a time-out."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path

import docker
import pytest

from sandboxd import errors
from sandboxd.app import build_app
from sandboxd.backends.kubernetes.client import KubeClient
from sandboxd.client import AsyncClient
from sandboxd.images.build import default_image_tag
from tests.kube.conftest import IMAGE, kube_settings, real_node_app, require_real_node
from tests.registry import Registry, registry_missing, run_registry

pytestmark = [
    pytest.mark.kube,
    pytest.mark.timeout(300),
]

SECRET = "task-registry"


def _push_default_image(registry: Registry, name: str) -> str:
    """The default sandbox image pushed to ``registry`` as ``name``; its reference."""
    engine = docker.from_env(timeout=300)
    try:
        image = engine.images.get(default_image_tag())
        repo, tag = registry.reference(name).rsplit(":", 1)
        image.tag(repo, tag)
        auth = {"username": registry.username, "password": registry.password}
        for event in engine.api.push(repo, tag, stream=True, decode=True, auth_config=auth):
            assert "error" not in event, event
        engine.images.remove(f"{repo}:{tag}")
        return f"{repo}:{tag}"
    finally:
        engine.close()


@pytest.fixture
async def registry(tmp_path: Path) -> AsyncIterator[Registry]:
    require_real_node()
    if registry_missing():
        pytest.skip(registry_missing())
    with run_registry(tmp_path / "registry", username="rl", password="pull-s3cret") as running:
        yield running


async def test_the_node_pulls_a_pools_image_with_the_pools_own_secret(
    tmp_path: Path, kubeconfig: str, namespace: str, kube: KubeClient, registry: Registry
) -> None:
    reference = await asyncio.to_thread(_push_default_image, registry, "tasks/swe-1:v1")
    login = base64.b64encode(f"{registry.username}:{registry.password}".encode()).decode()
    config = {"auths": {registry.address: {"auth": login}}}
    await kube.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/secrets",
        body={
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": SECRET},
            "type": "kubernetes.io/dockerconfigjson",
            "data": {".dockerconfigjson": base64.b64encode(json.dumps(config).encode()).decode()},
        },
    )
    async with (
        real_node_app(tmp_path, kubeconfig, namespace, backend={"image_pull_policy": "IfNotPresent"}) as app,
        AsyncClient(app.address) as client,
    ):
        # Without the secret the registry refuses the node: the acquire fails with the pull's error.
        await client.create_pool("open", reference, max_size=1)
        with pytest.raises(errors.FailedPrecondition, match="(?i)unauthorized|401") as refused:
            async with client.acquire("open", timeout=120):
                pass
        assert reference in str(refused.value), refused.value
        await client.delete_pool("open", force=True)

        await client.create_pool("tasks", reference, max_size=1, image_pull_secrets=[SECRET])
        assert list((await client.get_pool("tasks")).spec.image_pull_secrets) == [SECRET]
        async with client.acquire("tasks", timeout=180) as sb:
            pod = await kube.request(
                "GET", f"/api/v1/namespaces/{namespace}/pods/{app.control._index[sb.id].handle}"
            )
            assert pod["spec"]["imagePullSecrets"] == [{"name": SECRET}]
            assert pod["spec"]["containers"][0]["image"] == reference
            assert (await sb.exec("echo pulled")).text == "pulled\n"
        await client.delete_pool("tasks", force=True)


async def test_bad_pull_secrets_are_named(tmp_path: Path, kubeconfig: str, namespace: str) -> None:
    app = build_app(kube_settings(tmp_path, kubeconfig, namespace))
    await app.start()
    try:
        async with AsyncClient(app.address) as client:
            for secrets, field in (
                (["Not_A_Name"], "spec.image_pull_secrets[0]"),
                (["a", "a"], "spec.image_pull_secrets[1]"),
                ([f"s{i}" for i in range(17)], "spec.image_pull_secrets"),
            ):
                with pytest.raises(errors.InvalidArgument) as caught:
                    await client.create_pool("p", IMAGE, max_size=1, image_pull_secrets=secrets)
                assert caught.value.field == field
            assert not await client.list_pools()
    finally:
        await app.stop(grace=1)
