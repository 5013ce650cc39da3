"""Narrowing per acquire on real containers: what a lease narrowed to one of
its pool's hosts still reaches of another (nothing, as it must), and what
narrowing costs an acquire.

Run by benchmarks.network while its upstream namespace serves both of its
pool's hosts: a sandboxd on Docker started here, whose sandboxes' egress
resolves those names to that upstream, with one pool under the benchmark's
rules (min_ready 2). Measured:

- ``acquire_p50_ms`` / ``narrowed_acquire_p50_ms``: warm Acquire RPCs of
  that pool without and with ``network`` (narrowed to ``NARROWED``), taking
  turns (the first of each pair alternates), each on a quiet pool with two
  sandboxes ready, the lease released untimed;
- the bypasses, each from inside a leased container's network namespace:
  ``narrowed_connect`` (an HTTPS CONNECT to ``OTHER``), ``narrowed_http_by_host``
  (plain HTTP naming ``OTHER`` by its Host header), ``narrowed_dns`` (a lookup
  of ``OTHER``) and ``narrowed_held_connection`` (a download from ``OTHER``
  opened in a warm sandbox under its pool's rules, half read when the
  sandbox is leased narrowed). Each counts as blocked only if the same probe
  reaches ``OTHER`` from a lease of the same pool that asked for nothing
  (``details.narrowing_controls``), so a probe that cannot reach anything
  never passes for a block;
- no network and a live cut: ``none_connect``, ``none_http_by_host`` and
  ``none_dns`` (the same probes, to the narrowed rules' own host and to
  ``OTHER``, from a lease acquired with ``no_network``), and
  ``cut_held_connection`` / ``cut_connect`` (a lease of the pool's rules
  cut to no network by SetLeaseNetwork while a download from ``OTHER`` is
  held open in it, then a fresh CONNECT). Each counts as blocked only if the
  same probe got through from that un-narrowed lease before the cut.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import secrets
import socket
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import docker

from benchmarks.egress_probes import dns_rcode, proxy_status
from sandboxd.app import build_app
from sandboxd.backends.base import LABEL_INSTANCE
from sandboxd.backends.network import netns
from sandboxd.client import AsyncClient
from sandboxd.core.lifecycle import State
from sandboxd.settings import load_settings

T = TypeVar("T")

NARROWED = ["tls.bench:443"]
OTHER = "index.bench"
POOL = "bench-narrowing"
# Far more than every socket buffer between the upstream and the sandbox holds,
# so a cut download ends short of it.
BIG_BYTES = 32 << 20
BIG_PATH = "big"


def reaches_other() -> dict[str, bool]:
    """Whether each probe reaches ``OTHER`` through the sandbox's egress (run inside it)."""
    connect = f"CONNECT {OTHER}:443 HTTP/1.1\r\nHost: {OTHER}:443\r\n\r\n".encode()
    by_host = f"GET /small HTTP/1.1\r\nHost: {OTHER}\r\n\r\n".encode()
    return {
        "narrowed_connect": proxy_status(connect) == 200,
        "narrowed_http_by_host": proxy_status(by_host) == 200,
        "narrowed_dns": dns_rcode(OTHER) == 0,
    }


def reaches_any() -> dict[str, bool]:
    """Whether each probe reaches either host: ``OTHER`` or the narrowed rules' own (run inside it)."""
    own = NARROWED[0].split(":")[0]
    found = {name: False for name in ("connect", "http_by_host", "dns")}
    for host in (own, OTHER):
        found["connect"] |= (
            proxy_status(f"CONNECT {host}:443 HTTP/1.1\r\nHost: {host}:443\r\n\r\n".encode()) == 200
        )
        found["http_by_host"] |= proxy_status(f"GET /small HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()) == 200
        found["dns"] |= dns_rcode(host) == 0
    return found


def reaches_own() -> bool:
    """Whether the narrowed rules still let a CONNECT to their own host through (run inside it)."""
    host = NARROWED[0]
    return proxy_status(f"CONNECT {host} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()) == 200


class Held:
    """A download of ``OTHER``'s big file through the proxy, read only in part."""

    def __init__(self) -> None:
        self.sock = socket.create_connection((netns.EGRESS_ADDRESS, netns.PROXY_PORT), timeout=10)
        self.sock.sendall(f"GET http://{OTHER}/{BIG_PATH} HTTP/1.1\r\nHost: {OTHER}\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise RuntimeError(f"the download of {OTHER} ended before its head: {head[:200]!r}")
            head += chunk
        header, _, body = head.partition(b"\r\n\r\n")
        if b" 200 " not in header.split(b"\r\n", 1)[0]:
            raise RuntimeError(f"the download of {OTHER} was not let through: {header[:200]!r}")
        self.got = len(body)

    def rest_arrives(self) -> bool:
        """Whether the whole file comes through from here on (False: cut, or stalled for 10 s)."""
        self.sock.settimeout(10)
        try:
            while self.got < BIG_BYTES:
                chunk = self.sock.recv(1 << 20)
                if not chunk:
                    return False
                self.got += len(chunk)
        except OSError:
            return False
        finally:
            self.sock.close()
        return self.got == BIG_BYTES


async def in_sandbox(engine: docker.DockerClient, handle: str, fn: Callable[[], T]) -> T:
    """``fn()`` on a thread inside the network namespace of container ``handle``."""
    container = await asyncio.to_thread(engine.containers.get, handle)
    pid = int(container.attrs["State"]["Pid"])
    return await asyncio.to_thread(netns.in_netns, Path(f"/proc/{pid}/ns/net"), fn)


async def quiet(client: AsyncClient, ready: int, timeout: float = 120.0) -> None:
    """Waits until the pool has ``ready`` sandboxes and starts or stops nothing."""
    deadline = time.monotonic() + timeout
    while True:
        status = (await client.get_pool(POOL)).status
        if status.ready >= ready and status.creating == 0 and status.releasing == 0:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"pool {POOL} did not settle with {ready} ready in {timeout:.0f}s")
        await asyncio.sleep(0.1)  # a benchmark's poll interval


async def acquire_turns(client: AsyncClient, rounds: int) -> tuple[list[float], list[float]]:
    """Warm Acquire times in ms, (pool's rules, narrowed), taking turns."""
    wide: list[float] = []
    narrowed: list[float] = []
    for i in range(rounds):
        for narrow in (False, True) if i % 2 == 0 else (True, False):
            await quiet(client, 2)
            began = time.perf_counter()
            lease = await client.lease(POOL, network=NARROWED if narrow else (), timeout=60)
            (narrowed if narrow else wide).append((time.perf_counter() - began) * 1000)
            await lease.release()
    return wide, narrowed


async def bypasses(app: Any, client: AsyncClient, engine: docker.DockerClient) -> dict[str, Any]:
    """The narrowing bypasses (True = blocked) and their controls."""
    await quiet(client, 2)
    records = app.control.registry.records
    ready = [r for r in records.values() if r.pool == POOL and r.state == State.READY]
    # A download held open in each warm sandbox: whichever the narrowed lease takes.
    held = {r.sandbox_id: await in_sandbox(engine, r.handle, Held) for r in ready}
    try:
        async with (
            client.acquire(POOL, network=NARROWED, timeout=60) as narrow,
            client.acquire(POOL, timeout=60) as wide,
        ):
            narrow_handle, wide_handle = records[narrow.id].handle, records[wide.id].handle
            held_cut = not await asyncio.to_thread(held.pop(narrow.id).rest_arrives)
            held_control = await asyncio.to_thread(held.pop(wide.id).rest_arrives)
            control = await in_sandbox(engine, wide_handle, reaches_other)
            reached = await in_sandbox(engine, narrow_handle, reaches_other)
            own = await in_sandbox(engine, narrow_handle, reaches_own)
    finally:
        for left in held.values():
            left.sock.close()
    control["narrowed_held_connection"] = held_control
    blocked = {name: control[name] and not got for name, got in reached.items()}
    blocked["narrowed_held_connection"] = held_control and held_cut
    cut, cut_control = await no_network_bypasses(app, client, engine)
    blocked.update(cut)
    control.update(cut_control)
    return {"blocked": blocked, "controls": control, "narrowed_reaches_own_host": own}


async def no_network_bypasses(
    app: Any, client: AsyncClient, engine: docker.DockerClient
) -> tuple[dict[str, bool], dict[str, bool]]:
    """A lease acquired with no network, and one cut to none while it runs
    (True = blocked); their controls, taken from the second lease before its cut."""
    await quiet(client, 2)
    records = app.control.registry.records
    async with (
        client.acquire(POOL, no_network=True, timeout=60) as none,
        client.acquire(POOL, timeout=60) as live,
    ):
        live_handle = records[live.id].handle
        control = {f"none_{k}": v for k, v in (await in_sandbox(engine, live_handle, reaches_any)).items()}
        reached = {
            f"none_{k}": v
            for k, v in (await in_sandbox(engine, records[none.id].handle, reaches_any)).items()
        }
        held = await in_sandbox(engine, live_handle, Held)
        try:
            await client.set_lease_network(live.lease_id, no_network=True)
            held_cut = not await asyncio.to_thread(held.rest_arrives)
        finally:
            held.sock.close()
        connect_after = (await in_sandbox(engine, live_handle, reaches_any))["connect"]
    blocked = {name: control[name] and not got for name, got in reached.items()}
    # The held download and the CONNECT both got through before the cut: the
    # download was let through (Held raises otherwise), the CONNECT is the control's.
    control["cut_held_connection"] = True
    control["cut_connect"] = control["none_connect"]
    blocked["cut_held_connection"] = held_cut
    blocked["cut_connect"] = control["cut_connect"] and not connect_after
    return blocked, control


async def measure_narrowing(up: str, root: Path, pool_rules: Sequence[str], rounds: int) -> dict[str, Any]:
    """Acquire times and narrowing bypasses against the upstream at ``up``
    serving ``root`` (given the big file here)."""
    from sandboxd.images.build import ensure_default_image

    (root / BIG_PATH).write_bytes(b"n" * BIG_BYTES)
    image = await asyncio.to_thread(functools.partial(ensure_default_image, log=lambda _: None))
    instance = "bnarrow-" + secrets.token_hex(4)
    engine = docker.from_env()
    leaked = 0
    with tempfile.TemporaryDirectory() as state:
        settings = load_settings(
            None,
            {
                "instance_id": instance,
                "state_dir": state,
                "server.port": 0,
                "backend.egress_hosts": {name.split(":")[0]: up for name in pool_rules},
            },
        )
        app = build_app(settings)
        await app.start()
        try:
            async with AsyncClient(app.address) as client:
                await client.create_pool(POOL, image, min_ready=2, max_size=3, network=list(pool_rules))
                wide, narrowed = await acquire_turns(client, rounds)
                found = await bypasses(app, client, engine)
                await client.delete_pool(POOL, force=True)
        finally:
            await app.stop(grace=1)
            left = await asyncio.to_thread(
                engine.containers.list, all=True, filters={"label": f"{LABEL_INSTANCE}={instance}"}
            )
            leaked = len(left)
            for c in left:
                with contextlib.suppress(docker.errors.NotFound):
                    await asyncio.to_thread(c.remove, force=True)
            engine.close()
    return {
        "acquire_p50_ms": round(statistics.median(wide), 2),
        "narrowed_acquire_p50_ms": round(statistics.median(narrowed), 2),
        "bypasses": found["blocked"],
        "details": {
            "acquires_each": rounds,
            "acquire_ms": [round(x, 2) for x in wide],
            "narrowed_acquire_ms": [round(x, 2) for x in narrowed],
            "narrowed_rules": NARROWED,
            "narrowing_controls": found["controls"],
            "narrowed_reaches_own_host": found["narrowed_reaches_own_host"],
            "leaked": leaked,
        },
    }
