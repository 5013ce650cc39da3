"""Pure parts of the Kubernetes backend (no cluster): Pod manifests, label
values, quantities, watch summaries, exec status frames."""

from __future__ import annotations

from sandboxd.backends.base import GVISOR, Limits, SandboxSpec
from sandboxd.backends.execstream import MarkerSplitter
from sandboxd.backends.kubernetes.cache import summarize
from sandboxd.backends.kubernetes.podspec import (
    ANNOTATION_PIDS,
    ANNOTATION_RUNTIME,
    PodOptions,
    build_pod,
    label_value,
    parse_quantity,
    pod_name,
    resize_body,
)
from sandboxd.backends.kubernetes.wsexec import ExecStream, wrap_argv


def test_label_values_are_valid() -> None:
    assert label_value("team/py") == "team.py"
    assert label_value("-x y-") == "x_y"
    assert len(label_value("a" * 100)) == 63
    assert label_value("///") == "x"
    assert pod_name("sb-ABC_def") == "sandboxd-sb-abc-def"


def test_quantities() -> None:
    assert parse_quantity("1500m") == 1.5
    assert parse_quantity("2Gi") == 2 << 30
    assert parse_quantity("64") == 64
    assert parse_quantity("1e3") == 1000
    assert parse_quantity("3k") == 3000


def test_pod_options_map_to_the_spec() -> None:
    opts = PodOptions(
        namespace="ns",
        instance="i",
        runtime_class="gvisor",
        node_selector={"pool": "sandboxes"},
        tolerations=({"key": "sandbox", "operator": "Exists", "effect": "NoSchedule"},),
        cpu_request_ratio=0.5,
        workspace="memory",
    )
    spec = SandboxSpec(
        "sb-1", "p", "img:1", Limits(memory_bytes=1 << 30, cpu_millis=2000, disk_bytes=1 << 20)
    )
    pod = build_pod(spec, opts)
    ps = pod["spec"]
    assert ps["runtimeClassName"] == "gvisor"
    assert ps["nodeSelector"] == {"pool": "sandboxes"}
    assert ps["tolerations"][0]["key"] == "sandbox"
    assert ps["containers"][0]["resources"]["requests"]["cpu"] == "1000m"
    assert ps["volumes"][0]["emptyDir"] == {"medium": "Memory", "sizeLimit": str(1 << 20)}
    assert ps["restartPolicy"] == "Never"
    assert ps["enableServiceLinks"] is False
    eph = build_pod(
        spec, PodOptions(namespace="ns", instance="i", workspace="ephemeral", workspace_storage_class="x")
    )
    claim = eph["spec"]["volumes"][0]["ephemeral"]["volumeClaimTemplate"]["spec"]
    assert claim["storageClassName"] == "x"
    assert resize_body(Limits(memory_bytes=1 << 20), opts)["spec"]["containers"][0]["resources"] == {
        "requests": {"memory": str(1 << 20)},
        "limits": {"memory": str(1 << 20)},
    }


def test_gvisor_pods_name_their_runtime_class_and_process_limit() -> None:
    opts = PodOptions(namespace="ns", instance="i", runtime_class="sandboxd", gvisor_runtime_class="gv")
    limits = Limits(memory_bytes=1 << 30, pids=64)
    gvisor = build_pod(SandboxSpec("sb-1", "p", "img:1", limits, runtime=GVISOR), opts)
    assert gvisor["spec"]["runtimeClassName"] == "gv"
    assert gvisor["metadata"]["annotations"][ANNOTATION_RUNTIME] == GVISOR
    assert gvisor["metadata"]["annotations"][ANNOTATION_PIDS] == "64"
    runc = build_pod(SandboxSpec("sb-2", "p", "img:1", limits), opts)
    assert runc["spec"]["runtimeClassName"] == "sandboxd"
    # Under runc the rlimit would count the user's processes host-wide.
    assert not {ANNOTATION_RUNTIME, ANNOTATION_PIDS} & set(runc["metadata"]["annotations"])


def test_summaries() -> None:
    pod = {
        "metadata": {"name": "p", "uid": "u", "labels": {"a": "b"}, "annotations": {"x": "1", "y": "2"}},
        "spec": {"nodeName": "n"},
        "status": {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "True"}],
            "containerStatuses": [{"state": {"waiting": {"reason": "ImagePullBackOff", "message": "nope"}}}],
        },
    }
    info = summarize(pod, ("x",))
    assert info.permanent and "ImagePullBackOff" in info.problem
    assert info.annotations == {"x": "1"}
    ready = summarize(
        {
            "metadata": {"name": "p"},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
        }
    )
    assert ready.serving
    unsched = summarize(
        {
            "metadata": {"name": "p"},
            "status": {
                "phase": "Pending",
                "conditions": [
                    {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "m"}
                ],
            },
        }
    )
    assert unsched.problem.startswith("Unschedulable") and not unsched.permanent


class _FakeWS:
    protocol = "v5.channel.k8s.io"


def test_exec_status_frames() -> None:
    s = ExecStream(_FakeWS())  # type: ignore[arg-type]
    assert s.exit_code is None
    s.status = {"status": "Success"}
    assert s.exit_code == 0
    s.status = {
        "status": "Failure",
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": "3"}]},
    }
    assert s.exit_code == 3
    s.status = {"status": "Failure", "message": "container not found"}
    assert s.exit_code is None and s.failure == "container not found"


def test_wrapped_argv_sets_cwd_and_env() -> None:
    argv = wrap_argv(["python3", "x.py"], "/workspace/a", {"A": "1"})
    assert argv[:2] == ["sh", "-c"]
    assert argv[-4:] == ["/workspace/a", "A=1", "python3", "x.py"]


def test_marker_splitter() -> None:
    sp = MarkerSplitter(b"__M__")
    assert sp.feed(b"hello __") + sp.feed(b"M__ 7\n") == b"hello "
    assert sp.done and sp.exit_code == 7
