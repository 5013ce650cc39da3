"""The gvisor RuntimeClass on the real kubelet node: pools of runtime
"gvisor" run their Pods under gVisor's containerd shim (runsc, systrap, no
network; deploy/testcluster/node-up.sh configures the handler and applies
deploy/node/runtimeclass-gvisor.yaml). What sandboxd promises holds there or
is refused: exec, sessions, files, timeouts, the process limit (RLIMIT_NPROC
inside gVisor, set by the node's runsc wrapper from the Pod's annotation),
a memory hog (the whole sandbox stops, OOM_KILLED), a file-count limit
(refused: gVisor does not enforce one), and a released sandbox leaves no
process of gVisor behind on the node."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from sandboxd.backends.base import GVISOR
from sandboxd.backends.kubernetes.client import KubeClient, KubeError
from sandboxd.backends.kubernetes.podspec import pod_name
from sandboxd.client import AsyncClient, Sandbox
from sandboxd.errors import FailedPrecondition
from tests.kube.conftest import pods, poll, real_node_app
from tests.kube.test_exec import _real_image
from tests.probing import while_probing

pytestmark = [pytest.mark.kube, pytest.mark.kube_node, pytest.mark.timeout(300)]

PIDS = 48
LIMITS = {"memory_bytes": 128 << 20, "cpu_millis": 500, "pids": PIDS}


@pytest.fixture
async def client(tmp_path: Path, kubeconfig: str, namespace: str) -> AsyncIterator[AsyncClient]:
    async with (
        real_node_app(tmp_path, kubeconfig, namespace) as app,
        AsyncClient(app.address) as client,
    ):
        await client.create_pool("gv", _real_image(), min_ready=2, max_size=3, limits=LIMITS, runtime=GVISOR)
        yield client


@pytest.fixture
async def pair(client: AsyncClient) -> AsyncIterator[tuple[Sandbox, Sandbox]]:
    async with client.acquire_group("gv", n=2, timeout=120) as group:
        victim, bystander = group[0], group[1]
        assert (await bystander.exec("true", session="probe")).ok
        yield victim, bystander


async def _pod(kube: KubeClient, namespace: str, sandbox_id: str) -> dict[str, Any] | None:
    try:
        return await kube.request("GET", f"/api/v1/namespaces/{namespace}/pods/{pod_name(sandbox_id)}")
    except KubeError as e:
        if e.status == 404:
            return None
        raise


def _host_processes_naming(marks: list[str]) -> list[str]:
    """Command lines of this host's processes that name any of ``marks``
    (gVisor's sandbox and gofer name the Pod's uid, a shim its container's id)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            args = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if any(mark in args for mark in marks):
                found.append(args)
    return found


async def test_exec_sessions_files_timeout_and_release_leave_nothing(
    client: AsyncClient, kube: KubeClient, namespace: str
) -> None:
    async with client.acquire("gv", timeout=120) as sb:
        pod = await _pod(kube, namespace, sb.id)
        assert pod is not None and pod["spec"]["runtimeClassName"] == "gvisor"
        marks = [pod["metadata"]["uid"]] + [
            s["containerID"].split("://", 1)[-1] for s in pod["status"]["containerStatuses"]
        ]
        if not _host_processes_naming(marks):
            pytest.skip("the node's processes are not visible from here (the node runs elsewhere)")
        assert any(p.startswith("runsc-sandbox ") for p in _host_processes_naming(marks))
        first = await sb.exec("id -u; pwd; awk '/^Max processes/ {print $3}' /proc/self/limits")
        runs_as = pod["spec"]["securityContext"]["runAsUser"]
        assert runs_as != 1000, "a uid of its own"
        assert first.ok and first.text.splitlines() == [str(runs_as), "/workspace", str(PIDS)], first
        assert (await sb.exec("cd /tmp && export Q=7", session="s")).ok
        assert (await sb.exec("echo $Q; pwd", session="s")).text == "7\n/tmp\n"
        await sb.write_file("sub/a.txt", "hi")
        assert (await sb.exec("cat sub/a.txt")).text == "hi"
        assert await sb.read_file("sub/a.txt") == b"hi"
        timed = await sb.exec("sleep 100 & sleep 101", timeout=1)
        assert timed.outcome == "TIMED_OUT", timed
        left = await sb.exec("ps -eo args | grep -c '^sleep 10[01]' || true")
        assert left.text == "0\n", "the background child died with the tree"
        usage = await client.usage(sb.id)
        assert usage.memory_bytes > 0 and usage.pids > 0 and usage.files >= 2
        released = sb.id
    await poll(lambda: _gone(kube, namespace, released), timeout=60, what="the released sandbox's Pod gone")
    await poll(
        lambda: not _host_processes_naming(marks), timeout=60, what="gVisor's processes of the Pod gone"
    )
    await client.delete_pool("gv", force=True)

    async def none_left() -> bool:
        return not await pods(kube, namespace, "sandboxd.managed=true")

    await poll(none_left, timeout=60, what="every Pod of the pool gone")


async def _gone(kube: KubeClient, namespace: str, sandbox_id: str) -> bool:
    return await _pod(kube, namespace, sandbox_id) is None


async def test_memory_hog_stops_the_whole_sandbox_as_oom_killed(pair: tuple[Sandbox, Sandbox]) -> None:
    victim, bystander = pair
    attack = victim.exec(["python3", "-c", "x = bytearray(512 << 20); print(len(x))"], timeout=60)
    result, answered = await while_probing(bystander, attack)
    assert result.outcome == "OOM_KILLED", result
    # gVisor has no per-process OOM killer: the whole sandbox stops.
    assert "whole sandbox" in result.detail, result
    assert answered
    assert (await bystander.exec("echo still here")).text == "still here\n"


async def test_fork_bomb_is_pids_exhausted_and_stopped(pair: tuple[Sandbox, Sandbox]) -> None:
    victim, bystander = pair
    attack = victim.exec("bomb() { bomb | bomb & }; bomb; sleep 30", timeout=5)
    result, answered = await while_probing(bystander, attack)
    assert result.outcome == "PIDS_EXHAUSTED", result
    assert "killed" in result.detail, result
    assert answered
    after = await victim.exec("ps -e --no-headers | wc -l")
    assert after.ok and int(after.text) < 10, "the bomb's processes were all killed"
    assert (await victim.exec("echo still here")).text == "still here\n"


async def test_a_file_count_limit_is_refused_naming_the_runtime(client: AsyncClient) -> None:
    with pytest.raises(FailedPrecondition, match="'gvisor' does not enforce a file-count limit"):
        await client.create_pool(
            "gv-files",
            _real_image(),
            min_ready=0,
            max_size=1,
            limits={**LIMITS, "max_files": 64},
            runtime=GVISOR,
        )
    # The pool without one runs (the server's default file limit is dropped).
    async with client.acquire("gv", timeout=120) as sb:
        usage = await client.usage(sb.id)
        assert usage.files_limit == 0


async def test_the_pids_limit_cannot_change_per_acquire(client: AsyncClient) -> None:
    with pytest.raises(FailedPrecondition, match="fixes the pids limit"):
        async with client.acquire("gv", limits={"pids": 16}, timeout=120):
            pass
