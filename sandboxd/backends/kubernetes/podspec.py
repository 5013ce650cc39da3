"""Pure builders for what the Kubernetes backend sends to the API server:
the sandbox Pod, the namespace's deny-all NetworkPolicy, and label values.

Disk and file-count limits on Kubernetes
----------------------------------------
Kubernetes has no per-pod inode quota. What each workspace volume kind
enforces:

- ``emptydir`` (default): ``sizeLimit`` is enforced by the kubelet's
  eviction manager (it measures the directory periodically and evicts the
  Pod), not by the kernel; a burst can overshoot until the next measurement.
  The file count is *not* limited.
- ``memory``: an ``emptyDir`` with ``medium: Memory`` is a tmpfs the kubelet
  mounts with ``size=<sizeLimit>`` (SizeMemoryBackedVolumes, GA in 1.32), so
  the kernel enforces the byte limit (ENOSPC) and the bytes count against the
  Pod's memory limit. The kubelet does not pass ``nr_inodes``, so the tmpfs
  gets the kernel default (half the node's RAM pages): the file count is not
  capped per sandbox.
- ``ephemeral``: a generic ephemeral volume (a PVC made with the Pod and
  deleted with it) from ``workspace_storage_class``. The kernel enforces
  whatever that class's provisioner formats: a CSI driver that creates a
  per-volume loop-mounted or LVM-backed ext4/XFS filesystem with a fixed
  inode count (e.g. ``mkfs.ext4 -N <max_files>`` via the class's fs
  parameters, or an XFS project quota with an inode limit) enforces both
  bytes and files in the kernel. This is the mode to use when ``max_files``
  must hold against a hostile workload.

A writable root (SandboxSpec.writable_root) is the container's own layer on
the node, bounded only by the Pod's ``ephemeral-storage`` limit, which grows
by ``disk_bytes`` for it: the kubelet evicts a Pod past it (no ENOSPC, no
file count), which the backend reports as DISK_FULL (cache.disk_eviction).

``max_files`` and ``disk_bytes`` are recorded on the Pod as annotations
either way. With the ``sandboxd`` RuntimeClass (deploy/node: runc behind a
small wrapper, containerd passing ``sandboxd.io/*`` Pod annotations through),
any of the kinds above becomes a tmpfs mounted inside the container with
``size=`` and ``nr_inodes=`` from those annotations: the kernel enforces both,
and the pages count against the container's memory, with no CSI driver.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from sandboxd.backends.base import (
    GVISOR,
    LABEL_INSTANCE,
    LABEL_MANAGED,
    LABEL_POOL,
    LABEL_SANDBOX,
    WORKSPACE,
    Limits,
    SandboxSpec,
)
from sandboxd.backends.kubernetes.nodeimages import prefer_nodes
from sandboxd.backends.uids import DEFAULT_UIDS, SANDBOX_NAME, UidRange, group_for, passwd_for

LABEL_TENANT = "sandboxd.tenant"
ANNOTATION_POOL = "sandboxd.io/pool"
"""The pool's exact key ("tenant/name" is not a valid label value)."""
ANNOTATION_LABELS = "sandboxd.io/labels"
"""The sandbox's own labels, JSON (values need not be valid label values)."""
ANNOTATION_MAX_FILES = "sandboxd.io/max-files"
ANNOTATION_DISK_BYTES = "sandboxd.io/disk-bytes"
ANNOTATION_RUNTIME = "sandboxd.io/runtime"
"""The pool's isolation runtime, on gVisor Pods only (runc is the default)."""
ANNOTATION_PIDS = "sandboxd.io/pids"
"""A gVisor Pod's process limit: the node's runsc wrapper makes it RLIMIT_NPROC
inside gVisor, which counts the sandbox's own processes (the host's pids
cgroup counts gVisor's threads instead, see deploy/node/sandboxd-runc)."""
ANNOTATION_PASSWD = "sandboxd.io/passwd"
ANNOTATION_GROUP = "sandboxd.io/group"
"""The /etc/passwd and /etc/group a Pod's sandbox user is found in."""
# The image's own tables are not known to the API server: the system users
# of the images sandboxd builds (Debian's base-passwd), root first.
BASE_PASSWD = b"""root:x:0:0:root:/root:/bin/bash
daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin
bin:x:2:2:bin:/bin:/usr/sbin/nologin
sys:x:3:3:sys:/dev:/usr/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin
"""
BASE_GROUP = b"""root:x:0:
daemon:x:1:
bin:x:2:
sys:x:3:
adm:x:4:
tty:x:5:
nogroup:x:65534:
"""
NETWORK_POLICY_NAME = "sandboxd-sandboxes-deny-all"
CONTAINER = "sandbox"
DEFAULT_TENANT = "default"
_TMP_BYTES = 64 << 20

WorkspaceKind = Literal["emptydir", "memory", "ephemeral"]

# The container's PID 1: keeps it alive and reaps orphans. Commands come by
# exec, and whatever they leave behind (a daemonised child that exits, a fork
# bomb's processes once killed) is reparented to PID 1; ``sleep infinity``
# never waits, so their zombies would hold the Pod's process slots forever.
# A shell's ``wait`` reaps any child (wait3 on -1) while its own job runs.
KEEPALIVE = ("sh", "-c", "while :; do sleep 86400 & wait; done")


@dataclass(frozen=True)
class PodOptions:
    """How every sandbox Pod of one instance is built, whatever its pool (from the backend settings)."""

    namespace: str
    instance: str
    uid: int = 1000
    gid: int = 1000
    """Every Pod's user when ``uids`` is shared (count 0)."""
    uids: UidRange = field(default_factory=lambda: DEFAULT_UIDS)
    """The uids Pods are given one each (sandboxd.backends.uids)."""
    command: tuple[str, ...] = ()
    """What the container runs; () = KEEPALIVE."""
    runtime_class: str | None = None
    """RuntimeClass of runc pools' Pods; None = the node default."""
    gvisor_runtime_class: str = "gvisor"
    """RuntimeClass of pools of runtime GVISOR; "" = none (such pools are refused)."""
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    priority_class: str | None = None
    tenant_quotas: bool = False
    """Pods name their tenant's PriorityClass, which scopes its ResourceQuota
    (quotas.py); replaces ``priority_class``."""
    image_pull_policy: str = "IfNotPresent"
    image_pull_secrets: tuple[str, ...] = ()
    """Secrets (in the namespace) every Pod pulls its image with."""
    cpu_request_ratio: float = 1.0
    memory_request_ratio: float = 1.0
    workspace: WorkspaceKind = "emptydir"
    workspace_storage_class: str | None = None


_LABEL_VALUE_BAD = re.compile(r"[^A-Za-z0-9_.-]")


def label_value(text: str) -> str:
    """A valid label value for ``text``: at most 63 characters of [A-Za-z0-9_.-],
    starting and ending alphanumeric ('/' becomes '.'). Not injective: the
    exact value goes in an annotation next to it."""
    value = _LABEL_VALUE_BAD.sub("_", text.replace("/", "."))[:63]
    return value.strip("_.-") or "x"


def pull_secrets_of(opts: PodOptions, pool: tuple[str, ...]) -> list[dict[str, str]]:
    """A Pod's imagePullSecrets: the backend's, then the pool's (each once)."""
    return [{"name": name} for name in dict.fromkeys((*opts.image_pull_secrets, *pool))]


def pod_name(sandbox_id: str) -> str:
    """A DNS-1123 name for the sandbox's Pod."""
    name = re.sub(r"[^a-z0-9-]", "-", f"sandboxd-{sandbox_id}".lower())[:63]
    return name.rstrip("-")


def tenant_class(tenant: str) -> str:
    """The PriorityClass (and ResourceQuota) of ``tenant`` with tenant quotas
    on (quotas.py): a DNS name, distinct per tenant even when two names
    sanitise alike."""
    slug = re.sub(r"[^a-z0-9-]", "-", tenant.lower()).strip("-")[:40] or "x"
    return f"sandboxd-tenant-{slug}-{hashlib.sha256(tenant.encode()).hexdigest()[:8]}"


def tenant_of(pool: str) -> str:
    """The tenant of an internal pool key ("tenant/name", or a bare name for the default tenant)."""
    tenant, sep, _ = pool.partition("/")
    return tenant if sep else DEFAULT_TENANT


def selector(instance: str) -> str:
    """The label selector for every Pod one control-plane instance owns."""
    return f"{LABEL_MANAGED}=true,{LABEL_INSTANCE}={label_value(instance)}"


def _resources(limits: Limits, opts: PodOptions, writable_root: bool = False) -> dict[str, dict[str, str]]:
    requests: dict[str, str] = {}
    lims: dict[str, str] = {}
    if limits.memory_bytes:
        lims["memory"] = str(limits.memory_bytes)
        requests["memory"] = str(max(1, int(limits.memory_bytes * opts.memory_request_ratio)))
    if limits.cpu_millis:
        lims["cpu"] = f"{limits.cpu_millis}m"
        requests["cpu"] = f"{max(1, int(limits.cpu_millis * opts.cpu_request_ratio))}m"
    if limits.disk_bytes:
        # Workspace + /tmp + the container's writable layer and logs; a
        # writable root's writes (that layer) get disk_bytes of their own.
        root = limits.disk_bytes if writable_root else 0
        storage = str(limits.disk_bytes + root + _TMP_BYTES + (64 << 20))
        lims["ephemeral-storage"] = storage
    out: dict[str, dict[str, str]] = {}
    if requests:
        out["requests"] = requests
    if lims:
        out["limits"] = lims
    return out


def _workspace_volume(limits: Limits, opts: PodOptions) -> dict[str, Any]:
    if opts.workspace == "ephemeral":
        size = limits.disk_bytes or (1 << 30)
        claim: dict[str, Any] = {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": str(size)}},
        }
        if opts.workspace_storage_class:
            claim["storageClassName"] = opts.workspace_storage_class
        return {
            "name": "workspace",
            "ephemeral": {
                "volumeClaimTemplate": {
                    "metadata": {"labels": {LABEL_MANAGED: "true"}},
                    "spec": claim,
                }
            },
        }
    empty: dict[str, Any] = {}
    if opts.workspace == "memory":
        empty["medium"] = "Memory"
    if limits.disk_bytes:
        empty["sizeLimit"] = str(limits.disk_bytes)
    return {"name": "workspace", "emptyDir": empty}


def build_pod(
    spec: SandboxSpec,
    opts: PodOptions,
    user: tuple[int, int] | None = None,
    image_nodes: Sequence[str] = (),
) -> dict[str, Any]:
    """The Pod manifest of one sandbox running as ``user`` (None: the shared
    ``opts.uid``), hardened, labelled for adoption; it prefers the nodes
    ``image_nodes`` (they hold its image: no pull)."""
    uid, gid = user if user is not None else (opts.uid, opts.gid)
    labels = {
        LABEL_MANAGED: "true",
        LABEL_INSTANCE: label_value(opts.instance),
        LABEL_POOL: label_value(spec.pool),
        LABEL_SANDBOX: label_value(spec.sandbox_id),
        LABEL_TENANT: label_value(tenant_of(spec.pool)),
    }
    annotations = {
        ANNOTATION_POOL: spec.pool,
        ANNOTATION_LABELS: json.dumps(dict(spec.labels), sort_keys=True),
    }
    if spec.limits.max_files:
        annotations[ANNOTATION_MAX_FILES] = str(spec.limits.max_files)
    if spec.limits.disk_bytes:
        annotations[ANNOTATION_DISK_BYTES] = str(spec.limits.disk_bytes)
    if spec.runtime == GVISOR:
        annotations[ANNOTATION_RUNTIME] = GVISOR
        if spec.limits.pids:
            annotations[ANNOTATION_PIDS] = str(spec.limits.pids)
    own = {"HOME": WORKSPACE, "USER": SANDBOX_NAME, "LOGNAME": SANDBOX_NAME}
    env = [{"name": k, "value": v} for k, v in own.items() if k == "HOME" or k not in spec.env]
    env += [{"name": k, "value": v} for k, v in spec.env.items() if k != "HOME"]
    mounts: list[dict[str, Any]] = [
        {"name": "workspace", "mountPath": WORKSPACE},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "mnt", "mountPath": "/mnt"},
    ]
    volumes = [
        _workspace_volume(spec.limits, opts),
        {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": str(_TMP_BYTES)}},
        # Scratch outside the workspace where programs expect to write (SandboxFusion's
        # own tests write /mnt), as on Docker: a tmpfs bounded like /tmp, gone with the Pod.
        {"name": "mnt", "emptyDir": {"medium": "Memory", "sizeLimit": str(_TMP_BYTES)}},
    ]
    if user is not None:
        # The user tables travel as annotations, projected read-only over
        # the image's by the downward API: no object of their own to make.
        annotations[ANNOTATION_PASSWD] = passwd_for(BASE_PASSWD, uid, gid, WORKSPACE).decode()
        annotations[ANNOTATION_GROUP] = group_for(BASE_GROUP, gid).decode()
        items = [
            {"path": name, "fieldRef": {"fieldPath": f"metadata.annotations['{key}']"}}
            for name, key in (("passwd", ANNOTATION_PASSWD), ("group", ANNOTATION_GROUP))
        ]
        volumes.append({"name": "users", "downwardAPI": {"items": items, "defaultMode": 0o444}})
        mounts += [
            {"name": "users", "mountPath": f"/etc/{name}", "subPath": name, "readOnly": True}
            for name in ("passwd", "group")
        ]
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": spec.image,
        "imagePullPolicy": opts.image_pull_policy,
        "command": list(opts.command or KEEPALIVE),
        "workingDir": WORKSPACE,
        "env": env,
        "resources": _resources(spec.limits, opts, spec.writable_root),
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": uid,
            "runAsGroup": gid,
            "allowPrivilegeEscalation": False,
            "privileged": False,
            # A writable root's writes go to the container's layer on the
            # node, bounded by the ephemeral-storage limit (the kubelet
            # evicts a Pod past it: a typed disk-limit loss, evicted_for_disk).
            "readOnlyRootFilesystem": not spec.writable_root,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": mounts,
        "stdin": False,
        "tty": False,
    }
    pod_spec: dict[str, Any] = {
        "containers": [container],
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 0,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "hostname": "sandbox",
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": uid,
            "runAsGroup": gid,
            "fsGroup": gid,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumes": volumes,
    }
    if spec.runtime == GVISOR:
        pod_spec["runtimeClassName"] = opts.gvisor_runtime_class
    elif opts.runtime_class:
        pod_spec["runtimeClassName"] = opts.runtime_class
    if opts.node_selector:
        pod_spec["nodeSelector"] = dict(opts.node_selector)
    if opts.tolerations:
        pod_spec["tolerations"] = [dict(t) for t in opts.tolerations]
    if opts.tenant_quotas:
        pod_spec["priorityClassName"] = tenant_class(tenant_of(spec.pool))
    elif opts.priority_class:
        pod_spec["priorityClassName"] = opts.priority_class
    secrets = pull_secrets_of(opts, spec.pull_secrets)
    if secrets:
        pod_spec["imagePullSecrets"] = secrets
    if image_nodes:
        pod_spec["affinity"] = prefer_nodes(image_nodes)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(spec.sandbox_id),
            "namespace": opts.namespace,
            "labels": labels,
            "annotations": annotations,
        },
        "spec": pod_spec,
    }


def resize_body(limits: Limits, opts: PodOptions) -> dict[str, Any]:
    """The patch for the ``pods/resize`` subresource (in-place resize)."""
    resources = _resources(Limits(memory_bytes=limits.memory_bytes, cpu_millis=limits.cpu_millis), opts)
    return {"spec": {"containers": [{"name": CONTAINER, "resources": resources}]}}


def deny_all_policy(namespace: str) -> dict[str, Any]:
    """No ingress and no egress for any sandbox Pod in the namespace (needs a
    NetworkPolicy-enforcing CNI; the API server only stores it)."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": NETWORK_POLICY_NAME,
            "namespace": namespace,
            "labels": {LABEL_MANAGED: "true"},
        },
        "spec": {
            "podSelector": {"matchLabels": {LABEL_MANAGED: "true"}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [],
            "egress": [],
        },
    }


_SUFFIX = {
    "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "Pi": 1 << 50, "Ei": 1 << 60,
    "n": 1e-9, "u": 1e-6, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
}  # fmt: skip


def parse_quantity(text: str | int | float) -> float:
    """A Kubernetes resource quantity ("1500m", "2Gi", "1e3") as a number."""
    if isinstance(text, int | float):
        return float(text)
    text = text.strip()
    for suffix in ("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * _SUFFIX[suffix]
    if text and text[-1] in "numkMGTPE" and not re.fullmatch(r"[0-9.]+[eE][0-9]+", text):
        return float(text[:-1]) * _SUFFIX[text[-1]]
    return float(text)
