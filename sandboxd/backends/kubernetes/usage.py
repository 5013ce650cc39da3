"""What a sandbox's Pod uses now, read from inside it.

The control plane does not run on the nodes, so one exec reads the
container's own cgroup counters (v2 or v1) and the workspace's use.
"""

from __future__ import annotations

import contextlib

from sandboxd.backends.base import SandboxUsage
from sandboxd.backends.kubernetes.cache import PodCache
from sandboxd.backends.kubernetes.client import KubeClient, KubeError
from sandboxd.backends.kubernetes.podspec import CONTAINER
from sandboxd.backends.kubernetes.wsexec import ExecStream
from sandboxd.errors import SandboxLost

# Reads cgroup v2 counters and workspace use inside the sandbox (usage()).
_USAGE = r"""
c=/sys/fs/cgroup
if [ -f $c/memory.current ]; then  # cgroup v2
  printf 'mem %s\npeak %s\npids %s\n' "$(cat $c/memory.current)" \
    "$(cat $c/memory.peak 2>/dev/null || echo 0)" "$(cat $c/pids.current 2>/dev/null || echo 0)"
  printf 'cpu %s\n' "$(sed -n 's/^usage_usec //p' $c/cpu.stat 2>/dev/null || echo 0)"
else  # cgroup v1
  printf 'mem %s\n' "$(cat $c/memory/memory.usage_in_bytes 2>/dev/null || echo 0)"
  printf 'peak %s\n' "$(cat $c/memory/memory.max_usage_in_bytes 2>/dev/null || echo 0)"
  printf 'pids %s\n' "$(cat $c/pids/pids.current 2>/dev/null || echo 0)"
  printf 'cpu %s\n' "$(( $(cat $c/cpuacct/cpuacct.usage 2>/dev/null || echo 0) / 1000 ))"
fi
# Used bytes and files of the workspace itself (an emptyDir shares the node's
# filesystem, so df would show the node's); totals from df when it is its own.
printf 'disk %s %s\n' "$(du -s -B1 -x /workspace 2>/dev/null | cut -f1)" \
  "$(df -P -B1 /workspace 2>/dev/null | awk 'NR==2{print $2}')"
printf 'files %s %s\n' "$(find /workspace -xdev 2>/dev/null | wc -l)" \
  "$(df -P -i /workspace 2>/dev/null | awk 'NR==2{print $2}')"
"""


def parse_usage(text: str) -> SandboxUsage:
    """The usage script's output as a SandboxUsage (missing values are 0)."""
    values: dict[str, list[int]] = {}
    for line in text.splitlines():
        key, *nums = line.split()
        with contextlib.suppress(ValueError):
            values[key] = [int(n) for n in nums]

    def first(key: str, i: int = 0) -> int:
        v = values.get(key) or []
        return v[i] if len(v) > i else 0

    return SandboxUsage(
        memory_bytes=first("mem"),
        memory_peak_bytes=first("peak"),
        pids=first("pids"),
        disk_bytes=first("disk"),
        disk_total_bytes=first("disk", 1),
        files=first("files"),
        files_total=first("files", 1),
        cpu_seconds=first("cpu") / 1e6,
    )


async def read_usage(client: KubeClient, cache: PodCache, namespace: str, handle: str) -> SandboxUsage:
    """The Pod's usage now; empty when the exec fails, SandboxLost when the Pod is gone."""
    if cache.get(handle) is None:
        raise SandboxLost("the sandbox's Pod is gone")
    out = bytearray()
    try:
        argv = ["sh", "-c", _USAGE]
        stream = await ExecStream.open(client, namespace, handle, CONTAINER, argv, stdin=False)
        try:
            while isinstance(frame := await stream.next_frame(10.0), tuple):
                if frame[0] == 1:
                    out += frame[1]
        finally:
            await stream.close()
    except KubeError:
        return SandboxUsage()
    return parse_usage(out.decode(errors="replace"))
