"""A Docker sandbox's container as the engine is asked to create it: the
options of the Docker backend (DockerOptions) and the SDK's create arguments
(container_spec). The hardening, limits, scratch mounts, labels and inbox
mounts are described in sandboxd.backends.docker.containers, which creates
what this module specifies."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker.types

from sandboxd.backends.base import (
    GVISOR,
    KEEP_VAR,
    LABEL_IMAGE,
    LABEL_INSTANCE,
    LABEL_MANAGED,
    LABEL_POOL,
    LABEL_SANDBOX,
    WORKSPACE,
    SandboxSpec,
)
from sandboxd.backends.docker.keeper import KEEP_FIFO, KEEPER_COMMAND
from sandboxd.backends.docker.users import LABEL_USER, USER_TABLES
from sandboxd.backends.gvisor_pids import engine_pids
from sandboxd.backends.network.netns import EGRESS_ADDRESS
from sandboxd.backends.uids import DEFAULT_UIDS, SANDBOX_NAME, UidRange

_TMP_BYTES = 64 << 20
# /dev/shm gets Docker's own default size; both scratch mounts get a file
# (inode) limit, or a loop creating empty files there would be stopped only
# by the memory cgroup, after taking kernel memory from the host.
_SHM_BYTES = 64 << 20
_SCRATCH_FILES = 4096
INBOX = "/.sandboxd/inbox"
"""Where a sandbox sees its inbox (read-only)."""
LABEL_RUNTIME = "sandboxd.runtime"
"""The sandbox's isolation runtime, for a restarted control plane."""
LABEL_ROOT = "sandboxd.root"
"""On a sandbox with a writable root: "writable" (its limits are then named
for the root too, sandboxd.backends.docker.cgroups)."""
LABEL_KEEPER = "sandboxd.keeper"
"""On a gVisor sandbox: "true" when it runs the keeper (its shells are kept
for live snapshots), "false" when its shells run straight on ``runsc exec``."""


@dataclass(frozen=True)
class DockerOptions:
    """How the Docker backend reaches its engine and shapes its containers."""

    instance: str
    base_url: str | None = None
    user: str = "1000:1000"
    """uid:gid of every sandbox when ``uids`` is shared (count 0)."""
    uids: UidRange = field(default_factory=lambda: DEFAULT_UIDS)
    """The host uids sandboxes are given one each."""
    threads: int = 16
    runtime: str | None = None
    """The engine's runtime for runc pools (None: the engine default)."""
    gvisor_runtime: str = "runsc"
    """The engine's name for gVisor's runtime, for pools of runtime GVISOR."""
    inbox_dir: Path | None = None
    """Host directory for the sandboxes' inboxes (None: no inboxes; archives
    are streamed). Must be a path on the engine's host."""
    host_workspaces: bool = True
    """Read workspaces in place (sandboxd.backends.hostfs) where this process
    can see the containers' processes; False: always through the sandbox."""
    session_pipes: bool = True
    """Shells' stdio on FIFOs in the inbox where the host sees the sandbox's
    processes (sandboxd.backends.docker.pipes); False: the engine's stream."""
    egress_hosts: Mapping[str, str] = field(default_factory=dict)
    """Host names a network policy's proxy resolves from this table (name ->
    address) rather than with the host's resolver."""
    egress_max_connections: int = 64
    egress_bytes_per_second: int = 64 << 20


def container_name(sandbox_id: str) -> str:
    """The container's name: unique per sandbox, so a retried create collides."""
    return f"sandboxd-{sandbox_id}"


def container_spec(
    spec: SandboxSpec, options: DockerOptions, inbox: Path | None, user: tuple[int, int] | None = None
) -> dict[str, Any]:
    """The SDK's create arguments for a sandbox running as ``user`` (None:
    ``options.user`` as given): hardened, limited, and labelled so that a
    restarted control plane finds and adopts it."""
    limits = spec.limits
    engine_user = f"{user[0]}:{user[1]}" if user is not None else options.user
    uid, _, gid = engine_user.partition(":")
    owner = f",uid={uid},gid={gid or uid}" if uid.isdigit() else ""
    workspace = "rw,exec,nosuid,nodev,mode=0755" + owner
    if limits.disk_bytes:
        workspace += f",size={limits.disk_bytes}"
    if limits.max_files:
        workspace += f",nr_inodes={limits.max_files}"
    labels = {
        **{k: v for k, v in spec.labels.items()},
        LABEL_MANAGED: "true",
        LABEL_INSTANCE: options.instance,
        LABEL_POOL: spec.pool,
        LABEL_SANDBOX: spec.sandbox_id,
        LABEL_IMAGE: spec.image,
        LABEL_RUNTIME: spec.runtime,
        LABEL_USER: engine_user,
    }
    if spec.runtime == GVISOR:
        labels[LABEL_KEEPER] = "true" if spec.live_snapshots else "false"
    if spec.writable_root:
        labels[LABEL_ROOT] = "writable"
    kwargs: dict[str, Any] = dict(
        image=spec.image,
        command=["sleep", "infinity"],
        name=container_name(spec.sandbox_id),
        labels=labels,
        detach=True,
        init=True,
        network_mode="none",
        cap_drop=["ALL"],
        security_opt=["no-new-privileges"],
        # A writable root is bounded by a tmpfs under its layer (rootfs.py).
        read_only=not spec.writable_root,
        tmpfs={
            WORKSPACE: workspace,
            "/tmp": f"rw,exec,nosuid,nodev,mode=1777,size={_TMP_BYTES},nr_inodes={_SCRATCH_FILES}",
            # Replaces the engine's unlimited-inode /dev/shm (same flags).
            "/dev/shm": f"rw,noexec,nosuid,nodev,mode=1777,size={_SHM_BYTES},nr_inodes={_SCRATCH_FILES}",
            # Scratch outside the workspace where SandboxFusion's programs write
            # (its own tests write /mnt), bounded like /tmp and gone with the sandbox.
            # The engine gives the mount the image directory's mode (root's 0755
            # in most images), so it is the sandbox user's own, as the workspace is.
            "/mnt": f"rw,noexec,nosuid,nodev,mode=1777,size={_TMP_BYTES},nr_inodes={_SCRATCH_FILES}{owner}",
        },
        user=engine_user,
        working_dir=WORKSPACE,
        environment={"HOME": WORKSPACE, "USER": SANDBOX_NAME, "LOGNAME": SANDBOX_NAME, **spec.env},
        hostname="sandbox",
        stop_signal="SIGKILL",
    )
    if spec.network:
        # The sandbox's resolver is its egress resolver, which names only what the policy allows.
        kwargs["dns"] = [EGRESS_ADDRESS]
        kwargs["dns_search"] = ["."]
    if limits.memory_bytes:
        kwargs["mem_limit"] = limits.memory_bytes
        kwargs["memswap_limit"] = limits.memory_bytes
    if limits.cpu_millis:
        kwargs["nano_cpus"] = limits.cpu_millis * 1_000_000
    if spec.runtime == GVISOR:
        kwargs["runtime"] = options.gvisor_runtime
        if spec.live_snapshots:
            # A live snapshot carries the init tree only: the keeper puts processes there.
            kwargs["command"] = KEEPER_COMMAND
            kwargs["environment"][KEEP_VAR] = KEEP_FIFO
        if limits.pids:
            kwargs["pids_limit"] = engine_pids(GVISOR, limits.pids)
            kwargs["ulimits"] = [docker.types.Ulimit(name="nproc", soft=limits.pids, hard=limits.pids)]
    else:
        if limits.pids:
            kwargs["pids_limit"] = limits.pids
        if options.runtime:
            kwargs["runtime"] = options.runtime
    if inbox is not None:
        kwargs["mounts"] = [docker.types.Mount(target=INBOX, source=str(inbox), type="bind", read_only=True)]
        if user is not None:
            kwargs["mounts"] += [
                docker.types.Mount(target=target, source=str(inbox / name), type="bind", read_only=True)
                for target, name in USER_TABLES
            ]
    return kwargs
