"""Leases survive a failover: two control-plane replicas with their own,
separate disks elect a leader; the leader (a real ``sandboxd serve``
process) creates a pool and leases Pods, then dies by SIGKILL. The standby
takes over and, from what the API server holds (the pool spec in a
ConfigMap, each lease as an annotation on its Pods), keeps the live leases
(same ids; their sandboxes answer exec through it), reclaims the expired
one and the dead leader's warm Pods, and warms the pool back to its target.
Nothing is left behind."""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from sandboxd.app import build_app
from sandboxd.backends.kubernetes.client import KubeClient
from sandboxd.backends.kubernetes.ledger import ANNOTATION_LEASE, pools_configmap
from sandboxd.backends.kubernetes.podspec import pod_name, selector
from sandboxd.client import AsyncClient
from sandboxd.errors import NotFound
from sandboxd.v1 import common_pb2
from tests.kube.conftest import IMAGE, kube_settings, pods, poll
from tests.kube.test_exec import LOCAL_EXEC_NS, _ensure_namespace

pytestmark = [pytest.mark.kube, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]


def _toml(settings: dict[str, Any]) -> str:
    lines = []
    for section, values in settings.items():
        lines.append(f"[{section}]" if section else "")
        lines += [f"{k} = {json.dumps(v)}" for k, v in values.items()]
    return "\n".join(lines) + "\n"


async def _start_leader(config: Path, log: Path) -> tuple[asyncio.subprocess.Process, str]:
    """``sandboxd serve`` in its own process; returns it and its address."""
    out = log.open("wb")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sandboxd.cli", "serve", "--config", str(config),
        stdout=asyncio.subprocess.PIPE, stderr=out, cwd=str(ROOT),
    )  # fmt: skip
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(60):
            while line := (await proc.stdout.readline()).decode():
                if line.startswith("sandboxd listening on "):
                    return proc, line.split()[-1]
    except TimeoutError:
        pass
    proc.kill()
    await proc.wait()
    text = await asyncio.to_thread(log.read_text)
    raise AssertionError(f"the leader did not start: {text[-2000:]}")


async def _lease_annotation(kube: KubeClient, namespace: str, sandbox_id: str) -> dict[str, Any]:
    pod = await kube.request("GET", f"/api/v1/namespaces/{namespace}/pods/{pod_name(sandbox_id)}")
    return dict(json.loads(pod["metadata"]["annotations"][ANNOTATION_LEASE]))


async def test_a_standby_adopts_the_dead_leaders_leases(
    tmp_path: Path, kubeconfig: str, kube: KubeClient
) -> None:
    # kwok runs exec in this namespace as local processes: the adopted
    # sandboxes must answer commands through the new leader.
    await _ensure_namespace(kube)
    namespace = LOCAL_EXEC_NS
    instance = "fo-" + secrets.token_hex(4)
    lease_name = "sandboxd-" + secrets.token_hex(3)
    backend = {
        "kind": "kubernetes",
        "namespace": namespace,
        "kubeconfig": kubeconfig,
        "threads": 8,
        "ready_timeout_seconds": 60.0,
        "leader_election": True,
        "lease_name": lease_name,
        "lease_duration_seconds": 3.0,
    }
    # The leader: its own state_dir, in its own process.
    config = tmp_path / "leader.toml"
    config.write_text(
        _toml(
            {
                "": {"instance_id": instance, "state_dir": str(tmp_path / "leader")},
                "server": {"host": "127.0.0.1", "port": 0},
                "leases": {"reap_interval_seconds": 0.1},
                "limits": {"cpu_millis": 100, "memory_bytes": 64 << 20},
                "backend": backend,
            }
        )
    )
    leader, address = await _start_leader(config, tmp_path / "leader.log")
    # The standby: same instance and Lease, another (empty) state_dir.
    standby_settings = kube_settings(
        tmp_path, kubeconfig, namespace, instance_id=instance, state_dir=str(tmp_path / "standby"),
        backend=backend,
    )  # fmt: skip
    standby = build_app(standby_settings)
    taking_over = asyncio.create_task(standby.start())
    sel = selector(instance)
    try:
        async with AsyncClient(address) as client:
            await client.create_pool("fo", IMAGE, min_ready=2, max_size=8)
            kept = await client.lease("fo", n=2, labels={"run": "r1"}, lease_ttl=60, timeout=60)
            short = await client.lease("fo", n=1, lease_ttl=2, timeout=60)
            kept_ids = {s.id for s in kept.sandboxes}
            first_kept = next(iter(kept_ids))
            assert (await client.exec(first_kept, ["echo", "leader"], cwd="/tmp")).stdout == b"leader\n"
            short_id = short.sandboxes[0].id

            async def warm() -> bool:
                return (await client.get_pool("fo")).status.ready >= 2

            await poll(warm, timeout=90, what="the leader's pool to warm")
            leaders_warm = {
                s.id for s in await client.list_sandboxes("fo", state=common_pb2.SANDBOX_STATE_READY)
            }
            # Heartbeats are coalesced: one right after the acquire moves the
            # expiry by less than the recorded slack and writes nothing.
            first = await _lease_annotation(kube, namespace, next(iter(kept_ids)))
            assert first["id"] == kept.id and first["labels"] == {"run": "r1"}
            await client.heartbeat(kept.id)
            assert await _lease_annotation(kube, namespace, next(iter(kept_ids))) == first
            await client.heartbeat(kept.id, ttl=90)  # a new TTL is written
            assert (await _lease_annotation(kube, namespace, next(iter(kept_ids))))["ttl"] == 90

        assert not taking_over.done()
        leader.send_signal(signal.SIGKILL)  # no clean-up, no Lease release
        await leader.wait()
        await asyncio.wait_for(taking_over, 60)

        async with AsyncClient(standby.address) as client:
            # The live lease is kept, under the same id, with its labels.
            for sid in kept_ids:
                sb = await client.get_sandbox(sid)
                assert sb.state == common_pb2.SANDBOX_STATE_LEASED and sb.lease_id == kept.id
                assert sb.labels["run"] == "r1"
            await client.heartbeat(kept.id)
            assert (await client.exec(first_kept, ["echo", "standby"], cwd="/tmp")).stdout == b"standby\n"
            # The expired one and the dead leader's warm Pods are reclaimed.
            with pytest.raises(NotFound):
                await client.heartbeat(short.id)

            async def reclaimed() -> bool:
                live = {
                    p["metadata"]["labels"]["sandboxd.sandbox"]
                    for p in await pods(kube, namespace, sel)
                    if not p["metadata"].get("deletionTimestamp")
                }
                return kept_ids <= live and not ({short_id} | leaders_warm) & live

            await poll(reclaimed, timeout=60, what="expired and warm Pods of the old leader to go")

            async def rewarmed() -> bool:
                return (await client.get_pool("fo")).status.ready >= 2

            await poll(rewarmed, timeout=90, what="the pool to return to its target")
            assert await client.release(kept.id)

            async def released() -> bool:
                live = {p["metadata"]["labels"]["sandboxd.sandbox"] for p in await pods(kube, namespace, sel)}
                return not kept_ids & live

            await poll(released, timeout=60, what="the released Pods to go")
    finally:
        if leader.returncode is None:
            leader.kill()
            await leader.wait()
        if not taking_over.done():
            taking_over.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await taking_over
        await standby.stop(grace=1)
    # A clean stop leaves leased Pods only (none here): no orphans.
    await poll(
        lambda: _none_left(kube, namespace, sel), timeout=60, what="every Pod of the instance to be gone"
    )
    cm_path = f"/api/v1/namespaces/{namespace}/configmaps/{pools_configmap(instance)}"
    cm = await kube.request("GET", cm_path)
    assert [json.loads(v)["name"] for v in cm["data"].values()] == ["fo"]
    await kube.request("DELETE", cm_path)  # the namespace is shared with other tests


async def _none_left(kube: KubeClient, namespace: str, sel: str) -> bool:
    return not await pods(kube, namespace, sel)
