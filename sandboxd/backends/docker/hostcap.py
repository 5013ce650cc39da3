"""What bounds how many sandboxes one Docker host holds: the engine's memory
and CPUs, the kernel's process and thread limit, and what each container
costs beyond its own processes (the engine's shim), measured on live
sandboxes where this process sees the host's /proc, else assumed.

The engine figures come from ENGINE-LIMITS: on a 2-core host the engine
served ~744 containers at ~5.5 starts/s before its calls passed 60 s and it
wedged; the per-core figures below keep a margin under that.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from sandboxd.backends.base import HostFacts

ENGINE_CONTAINERS_PER_CPU = 300
"""Containers one core of the engine's host serves before its calls slow down."""
ENGINE_STARTS_PER_CPU = 2.5
"""Starts per second one core sustains (create, start, health check)."""
# Without a measurement: a runc shim (~10 threads, a few MiB) plus the
# sandbox's init, its sleep and the shells the backend keeps in it.
_DEFAULT_OVERHEAD_BYTES = 16 << 20
_DEFAULT_OVERHEAD_THREADS = 16
# The sandbox's own baseline (init, sleep, shells) on top of a measured shim.
_INSIDE_BYTES = 6 << 20
_INSIDE_THREADS = 6
_PROC = Path("/proc")


def _read(path: Path) -> str:
    with contextlib.suppress(OSError):
        return path.read_text()
    return ""


def _status_field(text: str, name: str) -> int:
    for line in text.splitlines():
        if line.startswith(name + ":"):
            with contextlib.suppress(ValueError, IndexError):
                return int(line.split()[1])
    return 0


def _kernel_threads() -> tuple[int, int]:
    """(most threads the kernel allows, threads now); zeros when unreadable."""
    limits = [
        int(v)
        for v in (
            _read(_PROC / "sys/kernel/threads-max").strip(),
            _read(_PROC / "sys/kernel/pid_max").strip(),
        )
        if v.isdigit()
    ]
    loadavg = _read(_PROC / "loadavg").split()
    in_use = 0
    if len(loadavg) >= 4 and "/" in loadavg[3]:
        with contextlib.suppress(ValueError):
            in_use = int(loadavg[3].split("/")[1])
    return (min(limits) if limits else 0), in_use


def _shim_cost(pid: int) -> tuple[int, int] | None:
    """(bytes, threads) of the engine shim that is ``pid``'s parent."""
    stat = _read(_PROC / str(pid) / "stat")
    if not stat:
        return None
    with contextlib.suppress(ValueError, IndexError):
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        status = _read(_PROC / str(ppid) / "status")
        if status:
            return _status_field(status, "VmRSS") * 1024, _status_field(status, "Threads")
    return None


def host_facts(info: Mapping[str, Any], local: bool, init_pids: Iterable[int]) -> HostFacts:
    """The facts for an engine whose ``info`` is given; ``local``: this
    process sees the engine's host (its /proc), and ``init_pids`` are the
    host pids of the live sandboxes' init processes (up to 8 are measured)."""
    pids = list(init_pids)
    memory = int(info.get("MemTotal") or 0)
    cpus = int(info.get("NCPU") or 0)
    threads_max, in_use = _kernel_threads() if local else (0, 0)
    costs = [c for c in (_shim_cost(p) for p in pids[:8]) if c is not None] if local else []
    if costs:
        overhead_bytes = sum(b for b, _ in costs) // len(costs) + _INSIDE_BYTES
        overhead_threads = sum(t for _, t in costs) // len(costs) + _INSIDE_THREADS
    else:
        overhead_bytes, overhead_threads = _DEFAULT_OVERHEAD_BYTES, _DEFAULT_OVERHEAD_THREADS
    return HostFacts(
        memory_bytes=memory,
        cpus=cpus,
        threads_max=threads_max,
        threads_in_use=in_use,
        overhead_memory_bytes=overhead_bytes,
        overhead_threads=overhead_threads,
        measured=bool(costs),
        sandboxes_present=len(pids) if local else 0,
        engine_max=cpus * ENGINE_CONTAINERS_PER_CPU,
        engine_starts_per_second=cpus * ENGINE_STARTS_PER_CPU,
    )
