"""The Kubernetes API as the control plane's durable record (the backend's
``Ledger``), so leases survive a failover to a standby replica whose disk is
empty: every replica reads the same API server, and the objects the record
lives on are the ones it describes.

- A lease is an annotation on each Pod it holds (one JSON value, written
  with a merge patch: idempotent, so a retry is safe, and no read first).
  A deleted Pod takes its record with it.
- Pool specs are keys of one ConfigMap per control-plane instance in the
  sandbox namespace (a pool with no Pods must survive too).
"""

from __future__ import annotations

import json
import re
from typing import Any

from sandboxd.backends.base import LABEL_INSTANCE, LABEL_SANDBOX, LeaseMark
from sandboxd.backends.kubernetes.client import KubeClient, KubeError, idempotent, wrap
from sandboxd.backends.kubernetes.podspec import label_value
from sandboxd.errors import SandboxLost

ANNOTATION_LEASE = "sandboxd.io/lease"
_MERGE = "application/merge-patch+json"


def pools_configmap(instance: str) -> str:
    """The ConfigMap holding ``instance``'s pool specs (the chart grants
    exactly this name)."""
    return re.sub(r"[^a-z0-9-]", "-", f"sandboxd-pools-{instance}".lower())[:253].strip("-")


def _data_key(pool_key: str) -> str:
    # ConfigMap keys allow [-._a-zA-Z0-9]; pool keys are "tenant/name" with
    # DNS-label names, so "/" is the only character to replace, by "_".
    return pool_key.replace("/", "_")


def encode_mark(mark: LeaseMark) -> str:
    """The annotation value of ``mark``: compact JSON, keys sorted, so one
    lease always reads the same; "network" only for a narrowed lease."""
    record: dict[str, Any] = {
        "id": mark.lease_id,
        "pool": mark.pool,
        "ttl": mark.ttl,
        "expires": round(mark.expires_wall, 3),
        "labels": dict(mark.labels),
    }
    if mark.network:
        record["network"] = list(mark.network)
    return json.dumps(record, sort_keys=True, separators=(",", ":"))


def decode_mark(text: str) -> LeaseMark | None:
    """The lease an annotation records; None for an unreadable one, so its Pod counts as not leased."""
    try:
        d: dict[str, Any] = json.loads(text)
        network = d.get("network") or []
        if not isinstance(network, list):
            return None
        return LeaseMark(
            str(d["id"]),
            str(d["pool"]),
            float(d["ttl"]),
            float(d["expires"]),
            dict(d.get("labels") or {}),
            tuple(str(r) for r in network),
        )
    except (ValueError, KeyError, TypeError):
        return None  # unreadable: treated as not leased (the Pod is reclaimed)


class KubeLedger:
    """The Ledger on the API server: leases as Pod annotations, pool specs in one ConfigMap."""

    def __init__(self, client: KubeClient, namespace: str, instance: str, label_selector: str) -> None:
        self._client = client
        self._ns = namespace
        self._instance = instance
        self._selector = label_selector
        self._pods = f"/api/v1/namespaces/{namespace}/pods"
        self._cm_name = pools_configmap(instance)
        self._cm = f"/api/v1/namespaces/{namespace}/configmaps/{self._cm_name}"

    # -- leases ---------------------------------------------------------------

    async def mark_leased(self, handle: str, mark: LeaseMark) -> None:
        """Merge-patches the lease onto the Pod (urgent lane, retried for about 4 s); SandboxLost on 404."""
        body = {"metadata": {"annotations": {ANNOTATION_LEASE: encode_mark(mark)}}}
        try:
            await idempotent(
                lambda: self._client.request(
                    "PATCH", f"{self._pods}/{handle}", body=body, content_type=_MERGE, timeout=5, urgent=True
                ),
                within=4.0,  # an Acquire waits on this: answer it while its caller waits
            )
        except KubeError as e:
            if e.status == 404:
                raise SandboxLost(f"the sandbox's Pod {handle} is gone") from e
            raise wrap(e, f"cannot record the lease on Pod {handle}") from e

    async def lease_marks(self) -> list[tuple[str, str, LeaseMark]]:
        """(sandbox id, Pod name, lease) of each of the instance's Pods with a readable lease;
        Pods being deleted are left out."""
        try:
            body = await idempotent(
                lambda: self._client.request(
                    "GET", self._pods, query={"labelSelector": self._selector}, timeout=120
                )
            )
        except KubeError as e:
            raise wrap(e, "cannot list Pods") from e
        out = []
        for pod in body.get("items") or []:
            meta = pod.get("metadata") or {}
            text = (meta.get("annotations") or {}).get(ANNOTATION_LEASE)
            mark = decode_mark(text) if text else None
            if mark is not None and not meta.get("deletionTimestamp"):
                sandbox_id = str((meta.get("labels") or {}).get(LABEL_SANDBOX, ""))
                out.append((sandbox_id, str(meta.get("name", "")), mark))
        return out

    # -- pool specs -------------------------------------------------------------

    async def load_pool_specs(self) -> dict[str, str]:
        """Pool specs by pool key, read from the ConfigMap; none when it does not exist yet."""
        try:
            cm = await idempotent(lambda: self._client.request("GET", self._cm))
        except KubeError as e:
            if e.status == 404:
                return {}
            raise wrap(e, f"cannot read ConfigMap {self._cm_name}") from e
        out = {}
        for text in (cm.get("data") or {}).values():
            with_name = json.loads(text)
            out[str(with_name["name"])] = text
        return out

    async def save_pool_spec(self, key: str, spec: str) -> None:
        """Sets the pool's key in the ConfigMap, creating the ConfigMap on first use."""
        await self._patch_pools({_data_key(key): spec})

    async def delete_pool_spec(self, key: str) -> None:
        """Removes the pool's key; a missing key or ConfigMap is not an error."""
        await self._patch_pools({_data_key(key): None})

    async def _patch_pools(self, data: dict[str, str | None]) -> None:
        body = {"data": data}
        try:
            try:
                await idempotent(
                    lambda: self._client.request("PATCH", self._cm, body=body, content_type=_MERGE)
                )
                return
            except KubeError as e:
                if e.status != 404:
                    raise
            if all(v is None for v in data.values()):
                return
            created = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": self._cm_name,
                    "namespace": self._ns,
                    "labels": {LABEL_INSTANCE: label_value(self._instance)},
                },
                "data": {k: v for k, v in data.items() if v is not None},
            }
            try:
                await self._client.request("POST", self._cm.rsplit("/", 1)[0], body=created)
            except KubeError as e:
                if e.status != 409:  # created meanwhile: patch that one
                    raise
                await idempotent(
                    lambda: self._client.request("PATCH", self._cm, body=body, content_type=_MERGE)
                )
        except KubeError as e:
            raise wrap(e, f"cannot write pool specs to ConfigMap {self._cm_name}") from e
