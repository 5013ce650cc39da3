"""Proto <-> core conversions."""

from __future__ import annotations

from google.protobuf.timestamp_pb2 import Timestamp

from sandboxd.backends.base import RUNC, ExecResult, Limits
from sandboxd.backends.network.policy import is_no_network
from sandboxd.core.leases import Lease
from sandboxd.core.lifecycle import SandboxRecord, State
from sandboxd.core.live_setting import LIVE_OFF, LIVE_ON, keeps_sessions
from sandboxd.core.pools import PoolConfig, WarmPool
from sandboxd.core.root_setting import ROOT_READ_ONLY
from sandboxd.core.tenancy import split_pool_key
from sandboxd.errors import printable
from sandboxd.v1 import common_pb2, exec_pb2, pools_pb2, sandboxes_pb2


def ts(seconds: float) -> Timestamp:
    """A Timestamp of epoch ``seconds``; 0 stays the unset (zero) Timestamp."""
    t = Timestamp()
    if seconds:
        t.FromNanoseconds(int(seconds * 1e9))
    return t


def limits_from(msg: common_pb2.Limits) -> Limits:
    """Limits as sent, unresolved: a 0 field stays 0 for the core to fill in."""
    return Limits(
        memory_bytes=msg.memory_bytes,
        cpu_millis=msg.cpu_millis,
        pids=msg.pids,
        disk_bytes=msg.disk_bytes,
        max_files=msg.max_files,
        output_bytes=msg.output_bytes,
        lifetime_seconds=msg.lifetime_seconds,
    )


def limits_to(limits: Limits) -> common_pb2.Limits:
    """The wire form of ``limits``, field for field; the inverse of ``limits_from``."""
    return common_pb2.Limits(
        memory_bytes=limits.memory_bytes,
        cpu_millis=limits.cpu_millis,
        pids=limits.pids,
        disk_bytes=limits.disk_bytes,
        max_files=limits.max_files,
        output_bytes=limits.output_bytes,
        lifetime_seconds=limits.lifetime_seconds,
    )


def pool_config_from(spec: pools_pb2.PoolSpec) -> PoolConfig:
    """A PoolConfig as the spec says, unvalidated and under the bare (not tenant-keyed) name."""
    return PoolConfig(
        name=spec.name,
        image=spec.image,
        min_ready=spec.min_ready,
        max_size=spec.max_size,
        limits=limits_from(spec.limits),
        env=dict(spec.env),
        labels=dict(spec.labels),
        max_ready=spec.max_ready,
        idle_seconds=spec.idle_seconds,
        runtime=spec.runtime or RUNC,
        images=list(spec.images),
        network=list(spec.network),
        model_endpoint=spec.model_endpoint,
        image_pull_secrets=list(spec.image_pull_secrets),
        live_snapshots=spec.live_snapshots,
        recycle=spec.recycle or "off",
        recycle_label=spec.recycle_label,
        max_uses=spec.max_uses,
        root=spec.root,
    )


def pool_to(pool: WarmPool) -> pools_pb2.Pool:
    """A pool's spec and live counts, named as its tenant knows it (without the tenant prefix)."""
    c = pool.config
    return pools_pb2.Pool(
        spec=pools_pb2.PoolSpec(
            name=split_pool_key(c.name)[1],
            image=c.image,
            min_ready=c.min_ready,
            max_size=c.max_size,
            limits=limits_to(c.limits),
            env=c.env,
            labels=c.labels,
            max_ready=c.max_ready,
            idle_seconds=c.idle_seconds,
            runtime=c.runtime,
            images=c.images,
            network=c.network,
            model_endpoint=c.model_endpoint,
            image_pull_secrets=c.image_pull_secrets,
            live_snapshots=c.live_snapshots or (LIVE_ON if keeps_sessions(c) else LIVE_OFF),
            recycle=c.recycle,
            recycle_label=c.recycle_label,
            max_uses=c.max_uses,
            root=c.root or ROOT_READ_ONLY,
        ),
        status=pools_pb2.PoolStatus(
            ready=pool.ready,
            creating=pool.creating,
            leased=pool.count(State.LEASED),
            releasing=pool.count(State.RELEASING),
            failed_total=pool.failed_total,
            waiting=pool.waiting,
            last_error=pool.permanent_error or pool.last_error,
            warm_target=pool.warm_target,
            recycled_total=pool.recycled_total,
            reset_p50_seconds=pool.reset_p50_seconds,
            create_p50_seconds=pool.create_p50_seconds,
        ),
        created_at=ts(c.created_at),
    )


def sandbox_to(rec: SandboxRecord, lease: Lease | None) -> common_pb2.Sandbox:
    """A sandbox's wire form; the lease id and expiry are shown only while it is LEASED."""
    return common_pb2.Sandbox(
        id=rec.sandbox_id,
        pool=split_pool_key(rec.pool)[1],
        image=rec.image,
        state=int(rec.state),  # type: ignore[arg-type]
        lease_id=rec.lease_id if rec.state is State.LEASED else "",
        labels=rec.labels,
        limits=limits_to(rec.limits),
        created_at=ts(rec.entered.get(State.CREATING, 0.0)),
        ready_at=ts(rec.entered.get(State.READY, 0.0)),
        leased_at=ts(rec.entered.get(State.LEASED, 0.0)),
        lease_expires_at=ts(lease.expires_wall if lease and rec.state is State.LEASED else 0.0),
        failure_reason=printable(rec.failure_reason),
        paused=rec.paused,
        network=list(rec.network) if rec.state is State.LEASED and not is_no_network(rec.network) else [],
        no_network=rec.state is State.LEASED and is_no_network(rec.network),
    )


def lease_to(lease: Lease) -> sandboxes_pb2.Lease:
    """A lease's wire form, its expiry in wall-clock time."""
    return sandboxes_pb2.Lease(
        id=lease.lease_id,
        sandbox_ids=lease.sandbox_ids,
        ttl_seconds=lease.ttl,
        expires_at=ts(lease.expires_wall),
        network=[] if is_no_network(lease.network) else list(lease.network),
        no_network=is_no_network(lease.network),
    )


def exec_result_to(result: ExecResult, stdout: bytes = b"", stderr: bytes = b"") -> exec_pb2.ExecResult:
    """An exec's result on the wire; output rides along only when the caller passes it (unary Exec)."""
    return exec_pb2.ExecResult(
        outcome=int(result.outcome),  # type: ignore[arg-type]
        exit_code=result.exit_code,
        signal=result.signal,
        stdout=stdout,
        stderr=stderr,
        duration_seconds=result.duration,
        output_truncated=result.output_truncated,
        # It may quote what a sandbox printed or named, in bytes that are not UTF-8.
        detail=printable(result.detail),
    )
