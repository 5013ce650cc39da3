"""Parsing what a Pod's cgroup files say into typed limit outcomes
(sandboxd.backends.kubernetes.limits): pure functions, no cluster."""

from __future__ import annotations

import pytest

from sandboxd.backends.base import ExecOutcome
from sandboxd.backends.kubernetes.limits import (
    Counters,
    explain_counters,
    explain_filesystems,
    explain_fs,
    no_process_slot,
    parse_counters,
    parse_filesystems,
    parse_fs,
)

pytestmark = pytest.mark.timeout(10)

V1 = "/sys/fs/cgroup/memory/memory.oom_control:oom_kill 2\n/sys/fs/cgroup/pids/pids.events:max 149\n"
# v2: memory.events has a "max" line of its own (memory.max hits), not a pids event.
V2 = (
    "/sys/fs/cgroup/memory.events:max 7\n/sys/fs/cgroup/memory.events:oom_kill 1\n"
    "/sys/fs/cgroup/pids.events:max 0\n/sys/fs/cgroup/pids.events.local:max 3\n"
)


def test_counters_from_cgroup_v1_and_v2() -> None:
    assert parse_counters(V1) == Counters(oom_kills=2, pids_max_events=149)
    assert parse_counters(V2) == Counters(oom_kills=1, pids_max_events=3)
    assert parse_counters("") is None


def test_which_counter_moved_names_the_outcome() -> None:
    base = Counters(1, 5)
    assert explain_counters(base, Counters(2, 5))[0] is ExecOutcome.OOM_KILLED  # type: ignore[index]
    assert explain_counters(base, Counters(1, 6))[0] is ExecOutcome.PIDS_EXHAUSTED  # type: ignore[index]
    assert explain_counters(base, base) is None


def test_a_full_workspace() -> None:
    files = parse_fs("2000 0 4096 100 4096\n")
    assert files is not None and explain_fs(files)[0] is ExecOutcome.FILE_LIMIT  # type: ignore[index]
    disk = parse_fs("2000 10 4096 0 4096\n")
    assert disk is not None and explain_fs(disk)[0] is ExecOutcome.DISK_FULL  # type: ignore[index]
    room = parse_fs("2000 10 4096 10 4096\n")
    assert room is not None and explain_fs(room) is None
    assert parse_fs("stat: cannot read file system information") is None


def test_a_full_scratch_mount_is_named() -> None:
    # FS_ARGV's lines: five numbers, then the mount; one stat could not read is absent.
    text = "2000 10 4096 10 4096 /workspace\n16384 16000 16384 0 4096 /mnt\n4096 4000 100 50 4096 /tmp\n"
    found = parse_filesystems(text + "garbage\n")
    assert sorted(found) == ["/mnt", "/tmp", "/workspace"]
    why = explain_filesystems(found)
    assert why is not None and why[0] is ExecOutcome.DISK_FULL and why[1].startswith("/mnt is full"), why
    # The workspace is named first when both are full.
    both = parse_filesystems("2000 0 4096 10 4096 /workspace\n" + text.split("\n", 1)[1])
    files = (ExecOutcome.FILE_LIMIT, "the workspace holds its maximum of 2000 files")
    assert explain_filesystems(both) == files
    assert explain_filesystems(parse_filesystems("2000 10 4096 10 4096 /workspace\n")) is None


def test_an_exec_refused_for_want_of_a_process_slot() -> None:
    runc_init_killed = (
        'failed to start exec "f5ef": OCI runtime exec failed: exec failed: unable to start '
        "container process: read init-p: connection reset by peer: unknown"
    )
    assert no_process_slot(runc_init_killed)
    assert no_process_slot("nsenter: failed to clone: Resource temporarily unavailable")
    assert not no_process_slot('unable to upgrade connection: container not found ("sandbox")')
    assert not no_process_slot("")
