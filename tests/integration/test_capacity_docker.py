"""Honest capacity on the real engine.

- The host's *estimated* capacity is the ceiling (no max_total_sandboxes set:
  the default memory limit is made large enough that the estimate is 3).
  Past it, acquires end in typed answers: RESOURCE_EXHAUSTED at once for what
  can never fit, DEADLINE_EXCEEDED naming the host's capacity before the
  deadline for what must wait; nothing stays leased.
- A wedged engine (dockerd stopped with SIGSTOP, so calls are accepted and
  never answered, as ENGINE-LIMITS saw it) is marked degraded where operators
  look (health, metrics), acquires end typed naming it, and the create that got
  no answer stays in doubt. Once the engine answers again, the engine is healthy
  again, the doubt is settled by a listing (the orphan sweep is off, so it is
  what finds the container the engine made late), and nothing is left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import docker
import grpc.aio
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sandboxd import errors
from sandboxd.app import ENGINE_SERVICE
from sandboxd.client import AsyncClient
from sandboxd.core.lifecycle import State
from tests.integration.conftest import instance_containers, make_settings, poll, running_app

pytestmark = [pytest.mark.docker, pytest.mark.timeout(180)]

DOCKERD_PIDFILE = Path("/var/run/docker.pid")


def _estimate_of_three(engine: docker.DockerClient) -> dict[str, object]:
    """Settings under which the host's memory bound is 3 sandboxes: each one's
    limit a little under a third of 90% of the engine's memory, shared 1 way."""
    memory = int(engine.info()["MemTotal"])
    return {"limits.memory_bytes": int(memory * 0.9 / 3.5), "pools.memory_overcommit": 1.0}


async def test_past_the_estimated_host_capacity_acquires_end_typed_and_bounded(
    tmp_path: Path, engine: docker.DockerClient, image: str
) -> None:
    settings = make_settings(tmp_path, **_estimate_of_three(engine), **{"pools.max_starting": 2})
    assert settings.pools.max_total_sandboxes == 0
    async with running_app(settings, engine) as app, AsyncClient(app.address) as client:
        reconciler = app.control.reconciler
        assert (reconciler.capacity.sandboxes, reconciler.capacity.bound_by) == (3, "memory")
        assert reconciler.budget.max_total == 3  # the estimate is the ceiling
        await client.create_pool("cap", image, min_ready=0, max_size=8)
        with pytest.raises(errors.ResourceExhausted, match="host holds at most 3"):
            await client.lease("cap", n=4, timeout=30)
        held = await client.lease("cap", n=3, timeout=60)
        # The server answers before the client's deadline, naming the cause
        # (a client-side deadline would carry no such message).
        with pytest.raises(errors.DeadlineExceeded, match="host capacity: 3 of 3"):
            await client.lease("cap", n=1, timeout=1.5)
        pool = app.control.pools[next(k for k in app.control.pools if k.endswith("cap"))]
        assert pool.waiting == 0 and len(app.control.leases.all()) == 1
        await held.release()
        await poll(lambda: not pool.records, what="released sandboxes to go")
        assert len(reconciler.in_doubt) == 0
        assert not instance_containers(engine, settings.instance_id)


def _dockerd() -> int:
    try:
        pid = int(DOCKERD_PIDFILE.read_text().strip())
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except (OSError, ValueError):
        pytest.skip("the engine is not a local dockerd with a pidfile this test can stop")
    if comm != "dockerd":
        pytest.skip(f"{DOCKERD_PIDFILE} names {comm!r}, not dockerd")
    return pid


@contextlib.contextmanager
def _engine_stopped(pid: int, at_most: float) -> Iterator[None]:
    """dockerd stopped (it accepts connections, answers nothing) until the
    block ends; a detached watchdog resumes it after ``at_most`` seconds even
    if this process dies, since every later test needs the engine."""
    watchdog = subprocess.Popen(
        ["sh", "-c", f"sleep {at_most:g}; kill -CONT {pid}"],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)
        watchdog.kill()
        watchdog.wait()


async def test_a_wedged_engine_is_degraded_then_recovered_and_nothing_is_lost(
    tmp_path: Path, engine: docker.DockerClient, image: str
) -> None:
    pid = _dockerd()
    settings = make_settings(
        tmp_path,
        **{
            "pools.create_timeout_seconds": 3.0,
            "pools.create_attempts": 1,
            "pools.liveness_interval_seconds": 0.0,
            "leases.orphan_sweep_seconds": 0.0,
        },
    )
    async with (
        running_app(settings, engine) as app,
        AsyncClient(app.address) as client,
        grpc.aio.insecure_channel(app.address) as channel,
    ):
        reconciler = app.control.reconciler
        health = health_pb2_grpc.HealthStub(channel)

        async def engine_status() -> int:
            answer = await health.Check(health_pb2.HealthCheckRequest(service=ENGINE_SERVICE))
            return int(answer.status)

        await client.create_pool("wedge", image, min_ready=0, max_size=4)
        pool = app.control.pools[next(k for k in app.control.pools if k.endswith("wedge"))]
        assert await engine_status() == health_pb2.HealthCheckResponse.SERVING
        with _engine_stopped(pid, at_most=60.0):
            # The acquire asks for a create the engine takes and never answers;
            # the listings that try to settle it then time out too.
            cause = r"engine degraded for \d+s: (create|list) calls time out"
            with pytest.raises(errors.DeadlineExceeded, match=cause):
                await client.lease("wedge", n=1, timeout=15.0)
            assert reconciler.health.degraded
            assert await engine_status() == health_pb2.HealthCheckResponse.NOT_SERVING
            assert app.telemetry is not None
            metrics = app.telemetry.prometheus_text()
            assert re.search(r'^sandboxd_engine_degraded\{call="(create|list)"\} 1$', metrics, re.M)
            assert len(reconciler.in_doubt) >= 1  # booked, counted, not forgotten
            assert pool.count(State.LEASED) == 0 and not app.control.leases.all()
        # The engine answers again: the doubt is settled by a listing and the
        # engine is healthy again, with no sweep for orphans running.
        await poll(lambda: len(reconciler.in_doubt) == 0, timeout=60.0, what="doubts settled")
        lease = await client.lease("wedge", n=1, timeout=60.0)
        await poll(lambda: not reconciler.health.degraded, timeout=60.0, what="engine recovered")
        assert await engine_status() == health_pb2.HealthCheckResponse.SERVING
        assert "sandboxd_engine_degraded 0" in app.telemetry.prometheus_text()
        tracked = {r.handle for r in pool.records.values()}
        found = await asyncio.to_thread(instance_containers, engine, settings.instance_id)
        assert {c.id for c in found} == tracked  # what the engine made late was removed
        await lease.release()
        await poll(lambda: not pool.records, what="released sandboxes to go")
