"""The metered model route on Kubernetes, on the real kubelet node: commands
in sandbox Pods call the run's model through the control plane's gateway
listener, each call told apart by the Pod it came from, and the trainer gets
what they generated on the rollout queue's trajectories.

A fake OpenAI-compatible server (tests.fake_model) listens on this host's
loopback, where no Pod reaches it; the gateway listens on the real node's Pod
bridge, where Pods do (the test cluster has no kube-proxy for a Service's
address). A key of another lease, a key after its lease, and a call from a
source that is no sandbox Pod are refused; the pool's NetworkPolicy lets its
Pods reach the listener and nothing else."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from sandboxd import errors
from sandboxd.app import build_app
from sandboxd.backends.kubernetes.client import KubeClient
from sandboxd.backends.kubernetes.egress import pool_policy_name
from sandboxd.backends.kubernetes.model_gateway import GatewayOptions
from sandboxd.client import AsyncClient
from sandboxd.client.rollouts import RolloutClient, trajectory
from sandboxd.images.build import default_image_tag
from tests.fake_model import PROMPT_IDS, REPLY_IDS, REPLY_LOGPROBS, fake_model
from tests.integration.test_model_gateway_docker import CHAT, URLLIB_CALL
from tests.kube.conftest import IMAGE, create_service, kube_settings, real_node_app
from tests.kube.egress_proxy import bridge_address
from tests.kube.test_network import _policies

pytestmark = [pytest.mark.kube, pytest.mark.timeout(240)]


def _call_from_host(url: str, key: str) -> tuple[int, str]:
    """A call to the gateway from this host (no sandbox Pod's address)."""
    request = urllib.request.Request(
        url + "/chat/completions",
        data=CHAT.encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


async def test_commands_in_pods_reach_the_model_only_through_the_metered_gateway(
    tmp_path: Path, kubeconfig: str, namespace: str, kube: KubeClient
) -> None:
    bridge = await asyncio.to_thread(bridge_address)
    async with (
        fake_model("127.0.0.1") as model,
        real_node_app(
            tmp_path, kubeconfig, namespace, backend={"model_gateway_listen": f"{bridge}:0"}
        ) as app,
        AsyncClient(app.address) as client,
    ):
        await client.create_pool("agents", default_image_tag(), max_size=2, model_endpoint=model.url)
        rollouts = RolloutClient(client)
        await rollouts.configure("rl", batch_groups=1, group_size=1, pool="agents")
        (slot,) = await rollouts.request_slots("rl", 1)
        group = await client.lease("agents", lease_ttl=600, timeout=180)
        other = await client.lease("agents", lease_ttl=600, timeout=180)
        (a,), (c,) = group.sandboxes, other.sandboxes
        await rollouts.report_progress("rl", slot.group_id, lease_ids=[group.id])

        env = dict(line.split("=", 1) for line in (await a.exec("env")).text.splitlines() if "=" in line)
        url = env["OPENAI_BASE_URL"]
        assert url.startswith(f"http://{bridge}:") and url.endswith("/v1"), env
        assert env["OPENAI_API_KEY"].startswith("sbxk."), env
        key_a, key_c = env["OPENAI_API_KEY"], (await c.exec('printf %s "$OPENAI_API_KEY"')).text

        result = await a.exec(["python3", "-c", URLLIB_CALL, "/chat/completions", CHAT, ""], timeout=60)
        assert result.text.startswith("200\n"), result.text
        assert all(s.authorization == "" for s in model.seen), "the lease's key never reaches the server"
        seen = len(model.seen)
        # Another lease's key from this Pod; this Pod's key from this host (no Pod at all).
        result = await a.exec(["python3", "-c", URLLIB_CALL, "/chat/completions", CHAT, key_c], timeout=60)
        assert result.text.startswith("403\n") and "not this sandbox's" in result.text, result.text
        status, body = await asyncio.to_thread(_call_from_host, url, key_a)
        assert status == 403 and "not_a_sandbox" in body, body
        # Released, a lease's key stops working at once.
        await client.release(other.id)
        result = await a.exec(["python3", "-c", URLLIB_CALL, "/models", "", key_c], timeout=60)
        assert result.text.startswith("401\n") and f"lease {other.id} has ended" in result.text, result.text
        assert len(model.seen) == seen

        # The pool's Pods may reach the listener, and nothing else.
        (policy,) = [
            p
            for name, p in (await _policies(kube, namespace)).items()
            if name == pool_policy_name(app.settings.instance_id, "agents")
        ]
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        assert policy["spec"]["egress"] == [
            {"to": [{"ipBlock": {"cidr": f"{bridge}/32"}}], "ports": [{"protocol": "TCP", "port": port}]}
        ]

        await rollouts.submit("rl", slot.group_id, [trajectory("t-a", sandbox_id=a.id, reward=1.0)])
        await client.release(group.id)
        async for batch in rollouts.pull("rl", max_batches=1):
            (got,) = batch.groups[0].trajectories
            await rollouts.ack("rl", batch.batch_id)
        (call,) = got.model_calls
        assert (call.lease_id, call.sandbox_id, call.status, call.path) == (
            group.id,
            a.id,
            200,
            "/chat/completions",
        )
        assert list(call.choices[0].token_ids) == REPLY_IDS
        assert list(call.choices[0].logprobs) == REPLY_LOGPROBS
        assert list(call.prompt_token_ids) == PROMPT_IDS
        await client.delete_pool("agents", force=True)


async def test_a_model_pool_is_refused_without_the_gateway_listener_or_the_cluster_state(
    tmp_path: Path, kubeconfig: str, namespace: str
) -> None:
    for backend, refused in (
        ({}, "model_gateway_listen"),
        ({"model_gateway_listen": "127.0.0.1:0", "state": "sqlite"}, "cluster"),
    ):
        app = build_app(kube_settings(tmp_path, kubeconfig, namespace, backend=backend))
        await app.start()
        try:
            async with AsyncClient(app.address) as client:
                with pytest.raises(errors.FailedPrecondition, match=refused):
                    await client.create_pool("m", IMAGE, max_size=1, model_endpoint="http://10.0.0.5:8000/v1")
                assert not await client.list_pools()
        finally:
            await app.stop(grace=1)


@pytest.mark.parametrize(
    ("options", "field"),
    [
        (GatewayOptions("0.0.0.0:8091"), "model_gateway_address"),
        (GatewayOptions("gateway.local:8091"), "model_gateway_listen"),
        (GatewayOptions("10.0.0.1"), "model_gateway_listen"),
        (GatewayOptions("10.0.0.1:99999"), "model_gateway_listen"),
        (GatewayOptions("0.0.0.0:8091", address="sandboxd.svc:8091"), "model_gateway_address"),
    ],
)
def test_bad_gateway_settings_are_named(options: GatewayOptions, field: str) -> None:
    with pytest.raises(errors.InvalidArgument) as caught:
        options.check()
    assert caught.value.field == f"backend.{field}"


def test_good_gateway_settings_pass() -> None:
    for options in (
        GatewayOptions("0.0.0.0:8091", service="sandboxd", service_namespace="sandboxd"),
        GatewayOptions("0.0.0.0:8091", address="10.96.0.10:8091"),
        GatewayOptions("10.89.0.1:0"),
    ):
        assert options.check() is options


async def test_the_gateway_answers_at_the_services_address_and_policies_name_its_pods(
    tmp_path: Path, kubeconfig: str, namespace: str, kube: KubeClient
) -> None:
    """With the chart's Service: Pods are given its cluster IP and port, and
    the pool's NetworkPolicy allows the Service's Pods on its target port."""
    selector = {"app.kubernetes.io/name": "sandboxd", "app.kubernetes.io/component": "control-plane"}
    ports = [
        {"name": "grpc", "port": 50051, "targetPort": 50051},
        {"name": "model-gateway", "port": 80, "targetPort": 8091},
    ]
    cluster_ip = await create_service(kube, namespace, "sandboxd-cp", selector, ports)
    backend = {"model_gateway_listen": "127.0.0.1:0", "model_gateway_service": "sandboxd-cp"}
    app = build_app(kube_settings(tmp_path, kubeconfig, namespace, backend=backend))
    await app.start()
    try:
        async with AsyncClient(app.address) as client:
            await client.create_pool(
                "m", IMAGE, min_ready=1, max_size=1, model_endpoint="http://10.0.0.5:8000/v1"
            )
            async with client.acquire("m", timeout=60) as sb:
                # kwok Pods run nothing: the environment a command gets is what the core sets.
                rec = app.control._index[sb.id]
                env = app.control.operations._model_env(rec)
            assert env["OPENAI_BASE_URL"] == f"http://{cluster_ip}:80/v1", env
            policy = (await _policies(kube, namespace))[pool_policy_name(app.settings.instance_id, "m")]
            assert policy["spec"]["egress"] == [
                {
                    "to": [
                        {
                            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                            "podSelector": {"matchLabels": selector},
                        }
                    ],
                    "ports": [{"protocol": "TCP", "port": 8091}],
                }
            ]
            await client.delete_pool("m", force=True)
    finally:
        await app.stop(grace=1)
