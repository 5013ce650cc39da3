"""The Runtime half (exec, tar out) over the API server's exec stream.

kwok nodes have no containers. The test cluster's kwok controller instead
runs exec requests for Pods in the namespace ``sandboxd-local-exec`` as local
processes on this host (deploy/testcluster/up.sh, KWOK_LOCAL_EXEC), behind a
real API server: this proves the transport end to end (WebSocket v5 channel
protocol, stdout/stderr framing, exit statuses, kill by tag through a second
exec, tar streaming), not container isolation. Two things kwok's local exec
does not do, so they are ``kube_node`` tests that need a real kubelet
(SANDBOXD_KUBE_REAL_NODE=1): closing a command's stdin when the v5 CLOSE frame
comes (put_tar), and a /workspace directory (persistent sessions start there).
"""

from __future__ import annotations

import io
import os
import secrets
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sandboxd.backends.base import ExecOutcome, ExecResult, ExecSpec, Limits, OutputChunk, SandboxSpec
from sandboxd.backends.kubernetes import KubernetesBackend, KubernetesOptions, PodOptions
from sandboxd.backends.kubernetes.client import KubeClient, KubeError
from sandboxd.client import AsyncClient
from sandboxd.errors import NotFound
from tests.kube.conftest import (
    IMAGE,
    REAL_NODE_NAME,
    poll,
    real_node_app,
    require_real_node,
)

pytestmark = [pytest.mark.kube, pytest.mark.timeout(120)]

LOCAL_EXEC_NS = "sandboxd-local-exec"


async def _ensure_namespace(kube: KubeClient) -> None:
    try:
        await kube.request("POST", "/api/v1/namespaces", body={"metadata": {"name": LOCAL_EXEC_NS}})
    except KubeError as e:
        if e.status != 409:
            raise

    async def has_sa() -> bool:
        try:
            await kube.request("GET", f"/api/v1/namespaces/{LOCAL_EXEC_NS}/serviceaccounts/default")
            return True
        except KubeError:
            return False

    await poll(has_sa, timeout=30, what="default ServiceAccount")


@pytest.fixture
async def sandbox(kubeconfig: str, kube: KubeClient) -> AsyncIterator[tuple[KubernetesBackend, str]]:
    await _ensure_namespace(kube)
    backend = KubernetesBackend(
        KubernetesOptions(
            instance="ex-" + secrets.token_hex(3), namespace=LOCAL_EXEC_NS, kubeconfig=kubeconfig
        )
    )
    await backend.ping()
    handle = await backend.create(
        SandboxSpec("sb-" + secrets.token_hex(6), "p", IMAGE, Limits(memory_bytes=64 << 20, cpu_millis=100))
    )
    try:
        yield backend, handle
    finally:
        await backend.destroy(handle)
        await backend.close()


async def run(backend: KubernetesBackend, handle: str, spec: ExecSpec) -> tuple[bytes, bytes, ExecResult]:
    out, err, result = b"", b"", None
    async for event in backend.exec(handle, spec):
        if isinstance(event, OutputChunk):
            if event.stream == 1:
                out += event.data
            else:
                err += event.data
        else:
            result = event
    assert result is not None
    return out, err, result


async def test_exit_codes_streams_env_and_cwd(sandbox: tuple[KubernetesBackend, str]) -> None:
    backend, handle = sandbox
    out, err, result = await run(
        backend, handle, ExecSpec(argv=("sh", "-c", "echo out; echo err >&2; exit 3"), cwd="/tmp")
    )
    assert (out, err, result.outcome, result.exit_code) == (b"out\n", b"err\n", ExecOutcome.EXITED, 3)
    out, _, result = await run(
        backend, handle, ExecSpec(shell='echo "$A"; pwd', cwd="/tmp", env={"A": "x y"})
    )
    assert out == b"x y\n/tmp\n" and result.exit_code == 0


async def test_timeout_kills_the_tree_and_output_cap_truncates(
    sandbox: tuple[KubernetesBackend, str],
) -> None:
    backend, handle = sandbox
    tag = secrets.token_hex(4)
    # A background child must die with its parent (kill by environment tag).
    _, _, result = await run(
        backend, handle, ExecSpec(shell=f"sleep 300 & sleep 301 # {tag}", cwd="/tmp", timeout=1)
    )
    assert result.outcome is ExecOutcome.TIMED_OUT
    out, _, result = await run(
        backend, handle, ExecSpec(shell="yes | head -c 1000000", cwd="/tmp", output_limit=1000)
    )
    assert result.outcome is ExecOutcome.OUTPUT_TRUNCATED and len(out) == 1000


async def test_get_tar_streams_files_and_names_the_missing_one(
    sandbox: tuple[KubernetesBackend, str], tmp_path: Path
) -> None:
    backend, handle = sandbox
    (tmp_path / "f.txt").write_text("hello")
    data = b"".join([c async for c in backend.get_tar(handle, str(tmp_path), ("f.txt",))])
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        member = tar.extractfile("f.txt")
        assert member is not None and member.read() == b"hello"
    with pytest.raises(NotFound, match="nope"):
        async for _ in backend.get_tar(handle, str(tmp_path), ("nope",)):
            pass


async def test_exec_into_a_deleted_pod_is_sandbox_lost(sandbox: tuple[KubernetesBackend, str]) -> None:
    backend, handle = sandbox
    await backend.destroy(handle)
    await poll(lambda: backend.cache.get(handle) is None, timeout=30, what="Pod gone from the cache")
    _, _, result = await run(backend, handle, ExecSpec(shell="true", cwd="/tmp"))
    assert result.outcome is ExecOutcome.SANDBOX_LOST and result.sandbox_gone


def _real_image() -> str:
    image = os.environ.get("SANDBOXD_KUBE_IMAGE", "")
    if not image:
        cached = sorted((Path.home() / ".cache/sandboxd/images").glob("*.tar"))
        image = f"sandboxd/rollout:{cached[-1].stem}" if cached else ""
    return image


@pytest.fixture
async def real_sandbox(kubeconfig: str, namespace: str) -> AsyncIterator[tuple[KubernetesBackend, str]]:
    """A sandbox on the real kubelet node of deploy/testcluster/node-up.sh, in
    a namespace that enforces Pod Security "restricted"."""
    require_real_node()
    instance = "rn-" + secrets.token_hex(3)
    pod = PodOptions(
        namespace=namespace,
        instance=instance,
        node_selector={"kubernetes.io/hostname": REAL_NODE_NAME},
        tolerations=({"key": "sandboxd.io/real-node", "operator": "Exists", "effect": "NoSchedule"},),
        image_pull_policy="Never",
    )
    backend = KubernetesBackend(
        KubernetesOptions(
            instance=instance, namespace=namespace, kubeconfig=kubeconfig, pod=pod, ready_timeout=90,
            exec_health_check=True,
        )
    )  # fmt: skip
    await backend.ping()
    handle = await backend.create(
        SandboxSpec(
            "sb-" + secrets.token_hex(6), "p", _real_image(),
            Limits(memory_bytes=256 << 20, cpu_millis=500, disk_bytes=64 << 20),
        )
    )  # fmt: skip
    try:
        yield backend, handle
    finally:
        await backend.destroy(handle)
        await backend.close()


@pytest.mark.kube_node
async def test_real_node_hardening_stdin_files_sessions_and_kills(
    real_sandbox: tuple[KubernetesBackend, str],
) -> None:
    backend, handle = real_sandbox
    out, _, result = await run(
        backend, handle, ExecSpec(shell="id -u; pwd; touch /x 2>&1; python3 -c 'print(6*7)'")
    )
    assert out.splitlines() == [
        b"1000",
        b"/workspace",
        b"touch: cannot touch '/x': Read-only file system",
        b"42",
    ]
    # What runs by exec goes to the OOM killer before the container's PID 1.
    out, _, _ = await run(backend, handle, ExecSpec(argv=("cat", "/proc/self/oom_score_adj")))
    assert out == b"1000\n"
    # stdin reaches the command and closes (v5.channel.k8s.io CLOSE frame).
    out, _, result = await run(backend, handle, ExecSpec(argv=("cat",), stdin=b"to stdin"))
    assert out == b"to stdin" and result.exit_code == 0
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("sub/a.txt")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))

    async def chunks() -> AsyncIterator[bytes]:
        yield buf.getvalue()

    await backend.put_tar(handle, "/workspace", chunks())
    out, _, _ = await run(backend, handle, ExecSpec(shell="cat sub/a.txt"))
    assert out == b"hi"
    await run(backend, handle, ExecSpec(shell="cd /tmp && export Q=7", session="s", cwd=""))
    out, _, _ = await run(backend, handle, ExecSpec(shell="echo $Q; pwd", session="s", cwd=""))
    assert out == b"7\n/tmp\n"
    _, _, result = await run(backend, handle, ExecSpec(shell="sleep 100 & sleep 101", timeout=1))
    assert result.outcome is ExecOutcome.TIMED_OUT
    out, _, _ = await run(backend, handle, ExecSpec(shell="ps -eo args | grep -c '^sleep 10[01]' || true"))
    assert out == b"0\n", "the background child died with the tree"
    usage = await backend.usage(handle)
    assert usage.memory_bytes > 0 and usage.pids > 0 and usage.files >= 2


@pytest.mark.kube_node
@pytest.mark.timeout(240)
async def test_control_plane_on_the_real_node_files_sessions_snapshot_restore(
    tmp_path: Path, kubeconfig: str, namespace: str
) -> None:
    """The whole server on Kubernetes with real containers: a pool, files,
    a persistent session, and a snapshot restored into a fresh Pod (through
    the same snapshot store and exec path as the Docker backend)."""
    limits = {"limits.memory_bytes": 256 << 20, "limits.cpu_millis": 500}
    async with (
        real_node_app(tmp_path, kubeconfig, namespace, **limits) as app,
        AsyncClient(app.address) as client,
    ):
        await client.create_pool("rn", _real_image(), min_ready=1, max_size=3)
        async with client.acquire("rn", timeout=120) as sb:
            await sb.write_files({"src/main.py": "print(6 * 7)\n"})
            assert (await sb.exec(["python3", "src/main.py"])).stdout == b"42\n"
            await sb.exec("cd src && export STAGE=two", session="agent")
            snap = await sb.snapshot(session="agent")
        lease = await client.restore(snap.id, timeout=120)
        try:
            restored = lease.sandboxes[0]
            files = await client.read_files(restored.id, ["src/main.py"])
            assert files["src/main.py"] == b"print(6 * 7)\n"
            result = await restored.exec("pwd; echo $STAGE", session="agent")
            assert result.stdout == b"/workspace/src\ntwo\n"
        finally:
            await client.release(lease.id)
        await client.delete_pool("rn")
