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

import asyncio
import io
import os
import re
import secrets
import tarfile
from collections.abc import AsyncIterator, Awaitable
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

import pytest

from sandboxd.backends.base import ExecOutcome, ExecResult, ExecSpec, Limits, OutputChunk, SandboxSpec
from sandboxd.backends.kubernetes import KubernetesBackend, KubernetesOptions, PodOptions
from sandboxd.backends.kubernetes.client import KubeClient, KubeError
from sandboxd.client import AsyncClient
from sandboxd.errors import NotFound
from sandboxd.images.build import default_image_tag
from tests.kube.conftest import (
    IMAGE,
    REAL_NODE_NAME,
    poll,
    real_node_app,
    require_real_node,
)

pytestmark = [pytest.mark.kube, pytest.mark.timeout(120)]

LOCAL_EXEC_NS = "sandboxd-local-exec"
T = TypeVar("T")


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
    # The default image: the node imports the cached rootfs of every image as
    # it starts, and others (a code-judge image) may be cached after that.
    return os.environ.get("SANDBOXD_KUBE_IMAGE", "") or default_image_tag()


def _real_backend(kubeconfig: str, namespace: str) -> KubernetesBackend:
    instance = "rn-" + secrets.token_hex(3)
    pod = PodOptions(
        namespace=namespace,
        instance=instance,
        node_selector={"kubernetes.io/hostname": REAL_NODE_NAME},
        tolerations=({"key": "sandboxd.io/real-node", "operator": "Exists", "effect": "NoSchedule"},),
        image_pull_policy="Never",
    )
    return KubernetesBackend(
        KubernetesOptions(
            instance=instance, namespace=namespace, kubeconfig=kubeconfig, pod=pod, ready_timeout=90,
            exec_health_check=True,
        )
    )  # fmt: skip


async def _real_create(backend: KubernetesBackend, disk_bytes: int = 64 << 20) -> str:
    return await backend.create(
        SandboxSpec(
            "sb-" + secrets.token_hex(6), "p", _real_image(),
            Limits(memory_bytes=256 << 20, cpu_millis=500, disk_bytes=disk_bytes),
        )
    )  # fmt: skip


@pytest.fixture
async def real_sandbox(kubeconfig: str, namespace: str) -> AsyncIterator[tuple[KubernetesBackend, str]]:
    """A sandbox on the real kubelet node of deploy/testcluster/node-up.sh, in
    a namespace that enforces Pod Security "restricted"."""
    require_real_node()
    backend = _real_backend(kubeconfig, namespace)
    await backend.ping()
    handle = await _real_create(backend)
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
        str(backend.sandbox_user(handle)[0]).encode(),
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


# -- Containment on the real node -------------------------------------------
# What a command does to leave its tree (setsid, a cleared environment, a
# double fork that execs with an empty environment) does not save it from a
# time-out, an output cap or an abandoned stream; another exec of the same
# sandbox is untouched; a Pod deleted under a command makes it SANDBOX_LOST.
# A bystander sandbox keeps answering throughout, and the fixture's Pods go.

# Four ways out of a command's process tree, each sleeper named by its argv;
# the command goes on only once all four run, then says so.
DETACH = (
    "env -i setsid sleep 1001 & disown; "
    "(unset SANDBOXD_EXEC SANDBOXD_SESSION; setsid sleep 1002 &); "
    "(env -i sh -c 'sleep 1003 &' &); "
    "python3 -c 'import os\n"
    "if os.fork() == 0:\n"
    "    os.setsid()\n"
    "    if os.fork() == 0:\n"
    '        os.execve("/bin/sleep", ["sleep", "1004"], {})\n'
    "    os._exit(0)\n"
    "os.wait()'; "
    "until [ \"$(pgrep -c -x -f 'sleep 100[1-4]')\" = 4 ]; do sleep 0.05; done; "
    "echo started; "
)
DETACHED = r"^sleep 100[0-4]$"
WRAPPER_LINE = re.compile(rb"line \d+:|cd --|exec bash|exec env|SANDBOXD|__SBXD|sandboxd")

Pair = tuple[KubernetesBackend, str, str]


@pytest.fixture
async def real_pair(kubeconfig: str, namespace: str) -> AsyncIterator[Pair]:
    """A victim and a bystander sandbox on the real kubelet node; both Pods
    are gone at the end. No disk limit: its ephemeral-storage limit counts
    the container's root filesystem where the node's snapshotter copies the
    image (the test node's does), which evicts a Pod that lives this long."""
    require_real_node()
    backend = _real_backend(kubeconfig, namespace)
    await backend.ping()
    handles = await asyncio.gather(_real_create(backend, 0), _real_create(backend, 0))
    try:
        yield backend, handles[0], handles[1]
    finally:
        for handle in handles:
            await backend.destroy(handle)
        for handle in handles:

            def deleted(h: str = handle) -> bool:
                return backend.cache.get(h) is None

            await poll(deleted, timeout=60, what=f"Pod {handle} gone")
        await backend.close()


async def probed(backend: KubernetesBackend, bystander: str, attack: Awaitable[T]) -> T:
    """``attack``'s result, while the bystander keeps running ``true`` in a
    session and answering."""
    answered = 0
    done = asyncio.Event()

    async def probe() -> None:
        nonlocal answered
        while not done.is_set():
            _, _, r = await run(backend, bystander, ExecSpec(shell="true", session="probe", timeout=60))
            assert r.outcome is ExecOutcome.EXITED and r.exit_code == 0, r
            answered += 1

    prober = asyncio.create_task(probe())
    try:
        result = await attack
    finally:
        done.set()
        await prober
    assert answered, "the bystander's commands were answered during the attack"
    return result


async def count(backend: KubernetesBackend, handle: str, pattern: str) -> int:
    """How many of the sandbox's processes have an argv matching ``pattern``."""
    out, _, r = await run(
        backend, handle, ExecSpec(shell=f"ps -eo args --no-headers | grep -cE '{pattern}' || true")
    )
    assert r.outcome is ExecOutcome.EXITED and r.exit_code == 0, r
    return int(out)


async def gone(backend: KubernetesBackend, handle: str, pattern: str = DETACHED) -> None:
    async def none_left() -> bool:
        return await count(backend, handle, pattern) == 0

    await poll(none_left, timeout=30, what=f"no process matching {pattern} left")


async def _keep_state(backend: KubernetesBackend, handle: str, session: str) -> None:
    if session:
        _, _, r = await run(
            backend, handle, ExecSpec(shell="cd /tmp && export KEEP=kept", session=session, cwd="")
        )
        assert r.exit_code == 0, r


async def _state_kept(backend: KubernetesBackend, handle: str, session: str) -> None:
    if session:
        out, _, _ = await run(backend, handle, ExecSpec(shell="pwd; echo $KEEP", session=session, cwd=""))
        assert out == b"/tmp\nkept\n", "the session's shell survived with its state"


@pytest.mark.kube_node
@pytest.mark.timeout(240)
@pytest.mark.parametrize("session", ["", "s"], ids=["oneshot", "session"])
async def test_real_node_detached_processes_die_at_timeout_and_output_cap(
    real_pair: Pair, session: str
) -> None:
    backend, sb, bystander = real_pair
    await _keep_state(backend, sb, session)
    spec = ExecSpec(shell=DETACH + "sleep 1000", timeout=5, session=session, cwd="")
    out, _, r = await probed(backend, bystander, run(backend, sb, spec))
    assert r.outcome is ExecOutcome.TIMED_OUT and out == b"started\n", (out, r)
    await gone(backend, sb)
    spec = ExecSpec(shell=DETACH + "yes", timeout=60, output_limit=100_000, session=session, cwd="")
    out, _, r = await probed(backend, bystander, run(backend, sb, spec))
    assert r.outcome is ExecOutcome.OUTPUT_TRUNCATED and out.startswith(b"started\n"), r
    await gone(backend, sb, r"^sleep 100[0-4]$|^yes$")
    await _state_kept(backend, sb, session)


@pytest.mark.kube_node
@pytest.mark.timeout(240)
@pytest.mark.parametrize("session", ["", "s"], ids=["oneshot", "session"])
async def test_real_node_abandoned_command_dies_whole(real_pair: Pair, session: str) -> None:
    backend, sb, bystander = real_pair
    await _keep_state(backend, sb, session)

    async def abandon() -> None:
        events = backend.exec(sb, ExecSpec(shell=DETACH + "sleep 1000", timeout=600, session=session, cwd=""))
        async for event in events:
            if isinstance(event, OutputChunk) and b"started" in event.data:
                break
        await events.aclose()  # type: ignore[attr-defined]
        await gone(backend, sb)

    await probed(backend, bystander, abandon())
    await _state_kept(backend, sb, session)


@pytest.mark.kube_node
@pytest.mark.timeout(240)
async def test_real_node_a_concurrent_exec_is_unaffected(real_pair: Pair) -> None:
    backend, sb, bystander = real_pair
    # Another one-shot, running all along (until told to end) with a
    # detached child of its own; and a daemon an earlier command of the
    # session left.
    hold = "setsid sleep 2001 >/dev/null 2>&1 & until [ -e /tmp/go ]; do sleep 0.05; done; echo survived"
    other = asyncio.create_task(run(backend, sb, ExecSpec(shell=hold, timeout=120)))
    _, _, r = await run(
        backend,
        sb,
        ExecSpec(shell="cd /tmp && export KEEP=kept && (env -i setsid sleep 2002 &)", session="s"),
    )
    assert r.exit_code == 0, r

    async def both_up() -> bool:
        return await count(backend, sb, "^sleep 200[12]$") == 2

    await poll(both_up, timeout=30, what="the other exec's processes up")
    for session in ("", "s"):
        spec = ExecSpec(shell=DETACH + "sleep 1000", timeout=5, session=session, cwd="")
        out, _, r = await probed(backend, bystander, run(backend, sb, spec))
        assert r.outcome is ExecOutcome.TIMED_OUT and out == b"started\n", r
        await gone(backend, sb)
        assert await count(backend, sb, "^sleep 200[12]$") == 2, (
            "the other exec's and the earlier command's live on"
        )
        assert not other.done()
    await run(backend, sb, ExecSpec(shell="touch /tmp/go"))
    out, _, r = await asyncio.wait_for(other, 60)
    assert (out, r.exit_code) == (b"survived\n", 0), r
    await _state_kept(backend, sb, "s")


@pytest.mark.kube_node
@pytest.mark.timeout(240)
@pytest.mark.parametrize("session", ["", "s"], ids=["oneshot", "session"])
async def test_real_node_pod_deleted_under_a_command_is_sandbox_lost(
    real_pair: Pair, namespace: str, session: str
) -> None:
    backend, sb, bystander = real_pair

    async def attack() -> tuple[ExecResult, bytes]:
        result, err = None, b""
        async for event in backend.exec(
            sb, ExecSpec(shell="echo started; sleep 30", timeout=120, session=session)
        ):
            if isinstance(event, OutputChunk):
                if event.data == b"started\n":
                    await backend.client.request(
                        "DELETE", f"/api/v1/namespaces/{namespace}/pods/{sb}",
                        body={"gracePeriodSeconds": 0},
                    )  # fmt: skip
                elif event.stream == 2:
                    err += event.data
            else:
                result = event
        assert result is not None
        return result, err

    result, err = await probed(backend, bystander, attack())
    assert result.outcome is ExecOutcome.SANDBOX_LOST, result
    assert not WRAPPER_LINE.search(err), err


@pytest.mark.kube_node
@pytest.mark.timeout(240)
async def test_real_node_exit_in_a_session_is_exited_and_no_wrapper_line(real_pair: Pair) -> None:
    backend, sb, bystander = real_pair
    hog = ("python3", "-c", "x = bytearray(512 << 20)")
    cases: list[tuple[ExecSpec, ExecOutcome, int]] = [
        (ExecSpec(shell="exit 5", session="s", cwd=""), ExecOutcome.EXITED, 5),
        (ExecSpec(shell="kill -9 $$"), ExecOutcome.EXITED, 137),
        (ExecSpec(shell="sleep 100", timeout=2), ExecOutcome.TIMED_OUT, -1),
        (ExecSpec(argv=hog, timeout=60), ExecOutcome.OOM_KILLED, -1),
        (ExecSpec(shell="sleep 100", timeout=2, session="s", cwd=""), ExecOutcome.TIMED_OUT, -1),
        (ExecSpec(argv=hog, timeout=60, session="s", cwd=""), ExecOutcome.OOM_KILLED, -1),
        (ExecSpec(shell="kill -9 $$", session="s", cwd=""), ExecOutcome.EXITED, 137),
    ]

    async def attack() -> None:
        for spec, outcome, code in cases:
            _, err, r = await run(backend, sb, spec)
            assert r.outcome is outcome, (spec, r)
            if code >= 0:
                assert r.exit_code == code, (spec, r)
            assert not WRAPPER_LINE.search(err), (spec, err)
            after = replace(spec, shell="echo next", argv=(), timeout=30)
            out, err, r = await run(backend, sb, after)
            assert (out, err, r.exit_code) == (b"next\n", b"", 0), (spec, r)

    await probed(backend, bystander, attack())
    out, _, _ = await run(backend, sb, ExecSpec(shell="pwd", session="s", cwd=""))
    assert out == b"/workspace\n", "a new session after the shell exited"
