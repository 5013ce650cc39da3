"""Pods that nothing runs, their status said by hand, for tests whose egress
proxy runs on this host: the chart's proxy Pod as NetworkPolicies see it, and
a sandbox Pod at an address the proxy serves.

A pool's NetworkPolicy lets its Pods reach the Pods its proxy Service
selects, on their own ports: an enforcing firewall resolves that to the
addresses those Pods have. The tests run ``sandboxd egress-proxy`` as a
process on this host (the test cluster has no kube-proxy to carry a Service's
address, and a proxy Pod could not reach the loopback API server), so a
stand-in Pod with the proxy's labels and the proxy's address stands for it.
Both kinds are never scheduled: no scheduler has their scheduler's name, so
no node runs them, and, bound to no node, the controller-manager's Pod
garbage collector does not delete them mid-test as orphans.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from sandboxd.backends.base import Limits, SandboxSpec
from sandboxd.backends.kubernetes.client import KubeClient, KubeError
from sandboxd.backends.kubernetes.egress import ANNOTATION_NETWORK
from sandboxd.backends.kubernetes.podspec import PodOptions, build_pod
from tests.kube.conftest import IMAGE

__all__ = ["PODS_INSTANCE", "proxy_stand_in", "sandbox_pod_at"]

NO_SCHEDULER = "sandboxd-test-none"
# The control-plane instance the sandbox Pods here belong to.
PODS_INSTANCE = "egress-test"


async def _create_running(kube: KubeClient, namespace: str, body: dict[str, Any], address: str) -> str:
    """Creates the Pod ``body`` and says it is Running at ``address``; its uid."""
    made = await kube.request("POST", f"/api/v1/namespaces/{namespace}/pods", body=body)
    await kube.request(
        "PATCH",
        f"/api/v1/namespaces/{namespace}/pods/{body['metadata']['name']}/status",
        body={"status": {"phase": "Running", "podIP": address, "podIPs": [{"ip": address}]}},
        content_type="application/merge-patch+json",
    )
    return str(made["metadata"]["uid"])


async def _delete(kube: KubeClient, namespace: str, name: str) -> None:
    await kube.request(
        "DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}", body={"gracePeriodSeconds": 0}
    )


@contextlib.asynccontextmanager
async def proxy_stand_in(
    kube: KubeClient, namespace: str, labels: dict[str, str], address: str
) -> AsyncIterator[str]:
    """A Running Pod with ``labels`` at ``address`` that nothing runs; its uid
    (what the proxy acknowledges changes as). Deleted at the end."""
    name = "egress-proxy-stand-in"
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "schedulerName": NO_SCHEDULER,
            "automountServiceAccountToken": False,
            # What the namespace's ``restricted`` Pod Security Standard asks.
            "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {
                    "name": "proxy",
                    "image": "sandboxd/none:stand-in",
                    "securityContext": {
                        "runAsUser": 65534,
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ],
        },
    }
    try:
        yield await _create_running(kube, namespace, body, address)
    finally:
        with contextlib.suppress(KubeError):
            await _delete(kube, namespace, name)


async def sandbox_pod_at(
    kube: KubeClient, namespace: str, sandbox_id: str, address: str, rules: list[str]
) -> str:
    """The Pod of sandbox ``sandbox_id`` (pool "p", instance ``PODS_INSTANCE``)
    under the network ``rules``, that nothing runs, Running at ``address``;
    its name. The caller deletes it."""
    spec = SandboxSpec(
        sandbox_id, "p", IMAGE, Limits(memory_bytes=64 << 20, cpu_millis=100), network=tuple(rules)
    )
    body = build_pod(spec, PodOptions(namespace=namespace, instance=PODS_INSTANCE))
    body["metadata"]["annotations"][ANNOTATION_NETWORK] = json.dumps(rules)
    body["spec"]["schedulerName"] = NO_SCHEDULER
    await _create_running(kube, namespace, body, address)
    return str(body["metadata"]["name"])
