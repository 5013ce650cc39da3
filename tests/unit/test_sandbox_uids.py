"""A host uid per sandbox: the allocator, the range's checks, the user
tables a sandbox sees, and how the Docker and Kubernetes specs carry it."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandboxd.backends.base import RUNC, SANDBOX_UID, Limits, SandboxSpec
from sandboxd.backends.docker.containerspec import DockerOptions, container_spec
from sandboxd.backends.docker.users import LABEL_USER, ContainerUsers
from sandboxd.backends.fake import FakeBackend
from sandboxd.backends.kubernetes.podspec import ANNOTATION_PASSWD, PodOptions, build_pod
from sandboxd.backends.uids import DEFAULT_UIDS, SandboxUids, UidRange, group_for, ids_in, passwd_for
from sandboxd.errors import InvalidArgument, NotFound, TransientBackendError
from sandboxd.settings import load_settings

pytestmark = pytest.mark.timeout(30)

IMAGE_PASSWD = b"root:x:0:0:root:/root:/bin/bash\nsandbox:x:1000:1000::/home/sandbox:/bin/bash\n"
IMAGE_GROUP = b"root:x:0:\nsandbox:x:1000:\n"


def _spec(sandbox_id: str = "sb-1") -> SandboxSpec:
    return SandboxSpec(
        sandbox_id=sandbox_id, pool="p", image="img", limits=Limits(pids=100), env={}, labels={}, runtime=RUNC
    )


def test_each_sandbox_gets_its_own_uid_and_keeps_it_on_a_retry() -> None:
    uids = SandboxUids(UidRange(300_000, 3))
    a, b = uids.allocate("a"), uids.allocate("b")
    assert a == (300_000, 300_000) and b == (300_001, 300_001)
    assert uids.allocate("a") == a, "a retried create keeps its uid"
    assert uids.allocate("c")[0] == 300_002
    with pytest.raises(TransientBackendError, match="all 3 uids from 300000"):
        uids.allocate("d")
    uids.release("b")
    assert uids.allocate("d")[0] == 300_001
    assert uids.in_use() == 3


def test_a_freed_uid_is_given_out_last() -> None:
    uids = SandboxUids(UidRange(300_000, 4))
    uids.allocate("a")
    uids.release("a")
    assert uids.allocate("b")[0] == 300_001, "next-fit: the uid just freed waits its turn"


def test_adopted_uids_are_never_given_to_another_sandbox() -> None:
    uids = SandboxUids(UidRange(300_000, 3))
    uids.adopt("old-1", 300_000)
    uids.adopt("old-2", 300_002)
    assert uids.allocate("new") == (300_001, 300_001)
    with pytest.raises(TransientBackendError):
        uids.allocate("newer")
    # A second sandbox found with a uid already held does not take it over.
    uids.adopt("intruder", 300_000)
    uids.release("intruder")
    uids.release("new")
    assert uids.allocate("newer")[0] == 300_001
    assert uids.held("old-1") == 300_000
    # Outside the range (made by hand, or under other settings): nothing to book.
    uids.adopt("elsewhere", 5000)
    assert uids.held("elsewhere") is None


def test_a_shared_range_gives_every_sandbox_the_same_user() -> None:
    uids = SandboxUids(UidRange(0, 0, shared=(1000, 1000)))
    assert uids.allocate("a") == uids.allocate("b") == (1000, 1000)


@pytest.mark.parametrize(
    ("base", "count", "why"),
    [
        (0, 10, "among root and the system users"),
        (500, 10, "among root and the system users"),
        (999, 2, "among root and the system users"),
        (1000, 10, "1000, the images' own sandbox user"),
        (60_000, 10_000, "65534, the overflow uid"),
        (2**31 - 10, 100, "past the largest uid"),
        (300_000, -1, "negative"),
    ],
)
def test_settings_refuse_a_range_over_root_or_system_users(base: int, count: int, why: str) -> None:
    for kind in ("docker", "kubernetes"):
        with pytest.raises(InvalidArgument, match=why) as info:
            load_settings(None, {"backend.kind": kind, "backend.uid_base": base, "backend.uid_count": count})
        assert info.value.field == "backend.uid_base"


def test_settings_default_to_a_uid_per_sandbox() -> None:
    backend = load_settings(None, {}).backend
    assert (backend.uid_base, backend.uid_count) == (DEFAULT_UIDS.base, DEFAULT_UIDS.count)  # type: ignore[union-attr]
    assert DEFAULT_UIDS.problem() == ""
    shared = load_settings(None, {"backend.uid_count": 0}).backend
    assert shared.uid_count == 0  # type: ignore[union-attr]


def test_user_tables_name_the_sandbox_user_by_its_uid() -> None:
    passwd = passwd_for(IMAGE_PASSWD, 200_007, 200_007, "/workspace")
    assert passwd.splitlines() == [
        b"root:x:0:0:root:/root:/bin/bash",
        b"sandbox:x:200007:200007:sandbox:/workspace:/bin/bash",
    ]
    assert group_for(IMAGE_GROUP, 200_007).splitlines() == [b"root:x:0:", b"sandbox:x:200007:"]
    assert ids_in(passwd) == {0, 200_007}
    # An image without a sandbox user gets one.
    assert passwd_for(b"root:x:0:0::/:/bin/sh", 200_001, 200_001, "/w").endswith(
        b"sandbox:x:200001:200001:sandbox:/w:/bin/bash\n"
    )


def test_docker_spec_runs_as_the_sandboxs_uid() -> None:
    inbox = Path("/srv/inbox/sb-1")
    spec = container_spec(_spec(), DockerOptions(instance="i"), inbox, (200_005, 200_005))
    assert spec["user"] == "200005:200005"
    assert spec["labels"][LABEL_USER] == "200005:200005"
    assert ",uid=200005,gid=200005" in spec["tmpfs"]["/workspace"]
    assert spec["environment"]["USER"] == spec["environment"]["LOGNAME"] == "sandbox"
    mounts = {m["Target"]: (m["Source"], m["ReadOnly"]) for m in spec["mounts"]}
    assert mounts["/etc/passwd"] == ("/srv/inbox/sb-1/.sandboxd-passwd", True)
    assert mounts["/etc/group"] == ("/srv/inbox/sb-1/.sandboxd-group", True)
    # Shared (count 0): the configured user, as before, and no tables of its own.
    shared = container_spec(_spec(), DockerOptions(instance="i", user="1000:1000"), inbox)
    assert shared["user"] == "1000:1000" and ",uid=1000,gid=1000" in shared["tmpfs"]["/workspace"]
    assert [m["Target"] for m in shared["mounts"]] == ["/.sandboxd/inbox"]


def test_docker_users_adopt_from_labels_and_free_on_removal() -> None:
    users = ContainerUsers(UidRange(300_000, 2), "1000:1000")
    users.adopt("c1", {LABEL_USER: "300001:300001", "sandboxd.sandbox": "sb-1"})
    # Made before labels: its Config.User, else the shared user.
    assert users.adopt("c0", {"sandboxd.sandbox": "sb-0"}, "1000:1000") == (1000, 1000)
    assert users.known("c1") == (300_001, 300_001)
    fresh = users.allocate("sb-2")
    assert fresh == (300_000, 300_000)
    users.created("c2", "sb-2", fresh)
    with pytest.raises(TransientBackendError):
        users.allocate("sb-3")
    users.removed("c1")
    assert users.known("c1") is None
    assert users.allocate("sb-3") == (300_001, 300_001)


def test_pod_spec_runs_each_pod_as_its_own_uid() -> None:
    opts = PodOptions(namespace="ns", instance="i")
    pod = build_pod(_spec(), opts, (200_009, 200_009))
    (container,) = pod["spec"]["containers"]
    assert container["securityContext"]["runAsUser"] == container["securityContext"]["runAsGroup"] == 200_009
    pod_context = pod["spec"]["securityContext"]
    assert (pod_context["runAsUser"], pod_context["runAsGroup"], pod_context["fsGroup"]) == (200_009,) * 3
    assert b"sandbox:x:200009:200009:" in pod["metadata"]["annotations"][ANNOTATION_PASSWD].encode()
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/etc/passwd"]["subPath"] == "passwd" and mounts["/etc/passwd"]["readOnly"]
    (users,) = [v for v in pod["spec"]["volumes"] if v["name"] == "users"]
    paths = {i["path"]: i["fieldRef"]["fieldPath"] for i in users["downwardAPI"]["items"]}
    assert paths["passwd"] == f"metadata.annotations['{ANNOTATION_PASSWD}']"
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["USER"] == env["LOGNAME"] == "sandbox"
    other = build_pod(_spec("sb-2"), opts, (200_010, 200_010))
    assert other["spec"]["securityContext"]["fsGroup"] == 200_010
    shared = build_pod(_spec(), opts)
    assert shared["spec"]["securityContext"]["runAsUser"] == 1000
    assert all(v["name"] != "users" for v in shared["spec"]["volumes"])


async def test_fake_sandboxes_have_distinct_uids_freed_on_destroy() -> None:
    backend = FakeBackend()
    a = await backend.create(_spec("a"))
    b = await backend.create(_spec("b"))
    ua, ub = backend.sandbox_user(a), backend.sandbox_user(b)
    assert ua != ub and SANDBOX_UID not in (ua[0], ub[0])
    await backend.destroy(a)
    with pytest.raises(NotFound):
        backend.sandbox_user(a)
    assert backend.uids.held("a") is None and backend.uids.held("b") == ub[0]


def test_instances_start_apart_and_skip_each_others_uids() -> None:
    one, two = SandboxUids(UidRange(300_000, 1000), "east"), SandboxUids(UidRange(300_000, 1000), "west")
    assert one.allocate("a") != two.allocate("a")
    taken = SandboxUids(UidRange(300_000, 3))
    taken.foreign({300_000, 300_002, 7})
    assert taken.allocate("a")[0] == 300_001
    with pytest.raises(TransientBackendError):
        taken.allocate("b")
    taken.foreign(set())  # the other instance's sandboxes are gone
    assert taken.allocate("b")[0] == 300_002


def test_docker_users_skip_other_instances_uids() -> None:
    users = ContainerUsers(UidRange(300_000, 2), "1000:1000")
    users.foreign([{LABEL_USER: "300000:300000"}, {}])
    assert users.allocate("sb") == (300_001, 300_001)


def test_a_listing_from_before_a_removal_books_nothing_for_it() -> None:
    users = ContainerUsers(UidRange(300_000, 2), "1000:1000")
    user = users.allocate("sb-1")
    users.created("c1", "sb-1", user)
    listed_at = users.mark()  # a listing asks the engine, which still has c1...
    users.removed("c1")  # ... while c1 is removed
    users.adopt("c1", {LABEL_USER: "300000:300000", "sandboxd.sandbox": "sb-1"}, listed_at=listed_at)
    assert users.uids.held("sb-1") is None and users.known("c1") is None
    # A listing after the removal that still finds it (removed behind our back
    # and made again) books it.
    users.adopt("c1", {LABEL_USER: "300000:300000", "sandboxd.sandbox": "sb-1"}, listed_at=users.mark())
    assert users.uids.held("sb-1") == 300_000
