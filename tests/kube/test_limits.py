"""Typed limit outcomes on Pods, read from inside the sandbox (its cgroup
counters), on the real kubelet node: a memory hog answers OOM_KILLED, a
fork bomb PIDS_EXHAUSTED (and is stopped), while a bystander sandbox keeps
answering. (DISK_FULL is not tested here: a sized memory workspace that
fills up is also what the kubelet's eviction manager evicts the Pod for, so
the answer races between DISK_FULL and SANDBOX_LOST.)

Kubernetes has no per-Pod pids limit in the Pod spec; clusters set the
kubelet's podPidsLimit, which the kubelet writes to each Pod's pids cgroup.
The test cluster's kubelet has none (and is shared), so the test writes the
victim Pod's pids.max on the node itself, as that setting would."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sandboxd.backends.kubernetes.client import KubeClient
from sandboxd.backends.kubernetes.podspec import pod_name
from sandboxd.client import AsyncClient, Sandbox
from tests.kube.conftest import real_node_app
from tests.kube.test_exec import _real_image
from tests.probing import while_probing

pytestmark = [pytest.mark.kube, pytest.mark.kube_node, pytest.mark.timeout(300)]

POD_PIDS_LIMIT = 64
LIMITS = {"memory_bytes": 128 << 20, "cpu_millis": 500}


@pytest.fixture
async def pair(
    tmp_path: Path, kubeconfig: str, namespace: str, kube: KubeClient
) -> AsyncIterator[tuple[Sandbox, Sandbox]]:
    async with (
        real_node_app(tmp_path, kubeconfig, namespace) as app,
        AsyncClient(app.address) as client,
    ):
        await client.create_pool("lim", _real_image(), min_ready=2, max_size=3, limits=LIMITS)
        async with client.acquire_group("lim", n=2, timeout=120) as group:
            victim, bystander = group[0], group[1]
            await _limit_pids(kube, namespace, victim.id, POD_PIDS_LIMIT)
            assert (await bystander.exec("true", session="probe")).ok
            yield victim, bystander


async def _limit_pids(kube: KubeClient, namespace: str, sandbox_id: str, limit: int) -> None:
    pod = await kube.request("GET", f"/api/v1/namespaces/{namespace}/pods/{pod_name(sandbox_id)}")
    uid = pod["metadata"]["uid"]

    def write() -> None:
        found = list(Path("/sys/fs/cgroup/pids/kubepods").glob(f"**/pod{uid}")) or list(
            Path("/sys/fs/cgroup/kubepods").glob(f"**/pod{uid}")
        )
        if not found:
            pytest.skip("the node's Pod cgroups are not visible from here (the node runs elsewhere)")
        try:
            (found[0] / "pids.max").write_text(str(limit))
        except OSError as e:
            pytest.skip(f"cannot set the Pod's pids limit as podPidsLimit would: {e}")

    await asyncio.to_thread(write)


async def test_memory_hog_is_oom_killed(pair: tuple[Sandbox, Sandbox]) -> None:
    victim, bystander = pair
    attack = victim.exec(["python3", "-c", "x = bytearray(512 << 20); print(len(x))"], timeout=60)
    result, answered = await while_probing(bystander, attack)
    assert result.outcome == "OOM_KILLED", result
    assert answered
    assert (await victim.exec("echo still here")).text == "still here\n"


async def test_fork_bomb_is_pids_exhausted_and_stopped(pair: tuple[Sandbox, Sandbox]) -> None:
    victim, bystander = pair
    attack = victim.exec("bomb() { bomb | bomb & }; bomb; sleep 30", timeout=5)
    result, answered = await while_probing(bystander, attack)
    assert result.outcome == "PIDS_EXHAUSTED", result
    assert "killed" in result.detail, result
    assert answered
    after = await victim.exec("ps -e --no-headers | wc -l")
    assert after.ok and int(after.text) < 10, "the bomb's processes were all killed"
