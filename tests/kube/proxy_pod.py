"""The chart's egress proxy Pod as NetworkPolicies see it, for tests whose
proxy runs on this host.

A pool's NetworkPolicy lets its Pods reach the Pods its proxy Service
selects, on their own ports: an enforcing firewall resolves that to the
addresses those Pods have. The tests run ``sandboxd egress-proxy`` as a
process on this host (the test cluster has no kube-proxy to carry a Service's
address, and a proxy Pod could not reach the loopback API server), so a
stand-in Pod with the proxy's labels and the proxy's address stands for it:
never scheduled (no scheduler has its name, so no node runs it and nothing
collects it as an orphan), its status said by hand.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from sandboxd.backends.kubernetes.client import KubeClient, KubeError

__all__ = ["proxy_stand_in"]


@contextlib.asynccontextmanager
async def proxy_stand_in(
    kube: KubeClient, namespace: str, labels: dict[str, str], address: str
) -> AsyncIterator[str]:
    """A Running Pod with ``labels`` at ``address`` that nothing runs; its name. Deleted at the end."""
    name = "egress-proxy-stand-in"
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "schedulerName": "sandboxd-test-none",
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
    await kube.request("POST", f"/api/v1/namespaces/{namespace}/pods", body=body)
    try:
        await kube.request(
            "PATCH",
            f"/api/v1/namespaces/{namespace}/pods/{name}/status",
            body={"status": {"phase": "Running", "podIP": address, "podIPs": [{"ip": address}]}},
            content_type="application/merge-patch+json",
        )
        yield name
    finally:
        with contextlib.suppress(KubeError):
            await kube.request(
                "DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}", body={"gracePeriodSeconds": 0}
            )
