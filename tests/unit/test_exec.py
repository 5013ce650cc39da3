"""Exec through the core on the FakeBackend: sessions, outcomes, lost sandboxes."""

from __future__ import annotations

import pytest

from sandboxd.backends.base import ExecOutcome
from sandboxd.core.files import FileData
from sandboxd.core.lifecycle import State
from sandboxd.errors import FailedPrecondition, NotFound
from tests.unit.conftest import Harness, wait_for

pytestmark = pytest.mark.timeout(30)


async def test_exec_runs_and_reports_exit_codes(h: Harness) -> None:
    _, rec = await h.leased()
    result, out, err = await h.exec(rec.sandbox_id, "echo hello world")
    assert (result.outcome, result.exit_code, out, err) == (ExecOutcome.EXITED, 0, b"hello world\n", b"")
    result, _, err = await h.exec(rec.sandbox_id, "nosuchcmd")
    assert result.exit_code == 127 and b"not found" in err
    result, _, _ = await h.exec(rec.sandbox_id, "exit 3")
    assert (result.outcome, result.exit_code) == (ExecOutcome.EXITED, 3)


async def test_exec_argv_stdin_and_env(h: Harness) -> None:
    _, rec = await h.leased()
    _, out, _ = await h.exec(rec.sandbox_id, None, argv=["cat"], stdin=b"from stdin")
    assert out == b"from stdin"
    _, out, _ = await h.exec(rec.sandbox_id, "env", env={"A": "1"})
    assert b"A=1\n" in out


async def test_session_keeps_cwd_and_env(h: Harness) -> None:
    _, rec = await h.leased()
    await h.control.write_files(rec.sandbox_id, [FileData("sub/dir/f.txt", b"content")])
    result, _, err = await h.exec(rec.sandbox_id, "cd sub/dir; export FOO=bar", session="agent")
    assert result.exit_code == 0, err
    _, out, _ = await h.exec(rec.sandbox_id, "pwd", session="agent")
    assert out == b"/workspace/sub/dir\n"
    _, out, _ = await h.exec(rec.sandbox_id, "env", session="agent")
    assert b"FOO=bar\n" in out
    _, out, _ = await h.exec(rec.sandbox_id, "cat f.txt", session="agent")
    assert out == b"content"
    # A per-command env does not leak into the session.
    _, out, _ = await h.exec(rec.sandbox_id, "env", session="agent", env={"ONCE": "1"})
    assert b"ONCE=1\n" in out
    _, out, _ = await h.exec(rec.sandbox_id, "env", session="agent")
    assert b"ONCE" not in out
    # No session, or another one: a fresh shell.
    _, out, _ = await h.exec(rec.sandbox_id, "pwd; env")
    assert out == b"/workspace\n"
    _, out, _ = await h.exec(rec.sandbox_id, "pwd; env", session="other")
    assert out == b"/workspace\n"


async def test_explicit_cwd(h: Harness) -> None:
    _, rec = await h.leased()
    await h.control.write_files(rec.sandbox_id, [FileData("d/x", b"")])
    _, out, _ = await h.exec(rec.sandbox_id, "pwd", cwd="d")
    assert out == b"/workspace/d\n"


async def test_timeout_gives_timed_out(h: Harness) -> None:
    _, rec = await h.leased()
    result, _, _ = await h.exec(rec.sandbox_id, "echo start; sleep 30", timeout=0.1)
    assert result.outcome is ExecOutcome.TIMED_OUT
    assert result.exit_code == -1
    assert result.duration < 5.0
    assert rec.state is State.LEASED  # a timeout does not cost the sandbox


async def test_output_cap_gives_output_truncated(h: Harness) -> None:
    _, rec = await h.leased()
    result, out, err = await h.exec(rec.sandbox_id, "yes", output_limit=1000, timeout=10.0)
    assert result.outcome is ExecOutcome.OUTPUT_TRUNCATED
    assert result.output_truncated
    assert len(out) + len(err) == 1000
    assert set(out) <= set(b"y\n")


async def test_pool_output_limit_applies_by_default(h: Harness) -> None:
    from sandboxd.backends.base import Limits

    _, rec = await h.leased(limits=Limits(output_bytes=64))
    result, out, _ = await h.exec(rec.sandbox_id, "yes", timeout=10.0)
    assert result.outcome is ExecOutcome.OUTPUT_TRUNCATED
    assert len(out) == 64


async def test_killed_sandbox_is_lost_and_replaced(h: Harness) -> None:
    # A full pool: both sandboxes it may hold are leased.
    pool = await h.warm_pool(min_ready=1, max_size=2)
    lease, records = await h.acquire(n=2)
    dead, alive = records
    assert pool.creates_needed() == 0
    creates = h.backend.creates
    h.backend.kill(dead.handle)
    result, _, _ = await h.exec(dead.sandbox_id, "echo hi")
    assert result.outcome is ExecOutcome.SANDBOX_LOST
    # The lost sandbox leaves the lease and the backend; the other stays leased.
    assert h.control.get_lease(lease.lease_id).sandbox_ids == [alive.sandbox_id]
    await wait_for(lambda: dead.state is State.GONE, what="lost one cleaned up")
    assert dead.handle not in h.backend.sandboxes
    assert "sandbox lost" in dead.failure_reason
    with pytest.raises(NotFound, match="lost"):
        h.control.get_sandbox(dead.sandbox_id)
    assert alive.state is State.LEASED
    assert pool.failed_total == 1
    # Replaced: its slot is refilled with a new sandbox.
    await wait_for(lambda: pool.ready == 1 and pool.creating == 0, what="replacement ready")
    assert h.backend.creates == creates + 1
    (replacement,) = (r for r in pool.records.values() if r.state is State.READY)
    assert replacement.sandbox_id not in (dead.sandbox_id, alive.sandbox_id)
    # Losing the last sandbox of a lease ends the lease.
    h.backend.kill(alive.handle)
    result, _, _ = await h.exec(alive.sandbox_id, "true")
    assert result.outcome is ExecOutcome.SANDBOX_LOST
    with pytest.raises(NotFound):
        h.control.get_lease(lease.lease_id)


async def test_exec_on_a_ready_sandbox_needs_a_lease(h: Harness) -> None:
    pool = await h.warm_pool(min_ready=1)
    (rec,) = pool.records.values()
    with pytest.raises(FailedPrecondition, match="not LEASED"):
        await h.exec(rec.sandbox_id, "true")


async def test_exec_after_release_is_not_found(h: Harness) -> None:
    lease, rec = await h.leased()
    await h.control.release(lease.lease_id, [])
    await wait_for(lambda: rec.state is State.GONE, what="destroyed")
    with pytest.raises(NotFound):
        await h.exec(rec.sandbox_id, "true")
