"""Snapshots keep owners and modes exactly, against the real engine: a
root-owned grader stays root's (unreadable secret, unchangeable tests) after
Snapshot, Restore and fork; names that are not UTF-8 travel as bytes; a path
no restore could write is refused when the snapshot is taken. Each test runs
with the workspace read in place and read through the sandbox (and under
gVisor, always read through the sandbox)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import docker
import pytest

from sandboxd import errors
from sandboxd.app import App
from sandboxd.backends.base import GVISOR, RUNC
from sandboxd.client import AsyncClient, Sandbox
from sandboxd.core.snapshots import manifest as mf
from tests.integration.conftest import NO_GVISOR, gvisor_registered, make_settings, running_app

pytestmark = [pytest.mark.docker, pytest.mark.timeout(240)]

MODES = [
    pytest.param(("in-place", RUNC), id="in-place"),
    pytest.param(("through-sandbox", RUNC), id="through-sandbox"),
    pytest.param(("through-sandbox", GVISOR), id="gvisor"),
]


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest, engine: docker.DockerClient) -> tuple[str, str]:
    read, runtime = request.param
    if runtime == GVISOR and not gvisor_registered(engine):
        pytest.skip(NO_GVISOR)
    return str(read), str(runtime)


@pytest.fixture
def runtime(mode: tuple[str, str]) -> str:
    return mode[1]


@pytest.fixture
async def app(
    mode: tuple[str, str], tmp_path: Path, engine: docker.DockerClient, image: str
) -> AsyncIterator[App]:
    settings = make_settings(tmp_path, **{"backend.host_workspaces": mode[0] == "in-place"})
    async with running_app(settings, engine) as app:
        yield app


GRADER = r"""
set -e
cd /workspace
mkdir tests secret
printf 'assert solve() == 42\n' > tests/test.py
printf 'k3y' > secret/key
chmod 0755 tests && chmod 0644 tests/test.py && chmod 0700 secret && chmod 0600 secret/key
"""

# What the grader looks like: owner, group, mode and name of each entry.
SHOW = "cd /workspace && find tests secret -printf '%U:%G %m %p\\n' | LC_ALL=C sort"
WANT = "0:0 600 secret/key\n0:0 644 tests/test.py\n0:0 700 secret\n0:0 755 tests\n"

# Ways the sandbox user could read the secret or change the grader (its
# directories lie in the sandbox user's workspace, which it may rename in, as
# in any such layout: what matters is what lies inside).
ATTACKS = [
    "cat /workspace/secret/key",
    "ls /workspace/secret",
    "printf 'pass' > /workspace/tests/test.py",
    "rm -f /workspace/tests/test.py",
    "mv /workspace/tests/test.py /workspace/t.py",
    "chmod 0777 /workspace/tests/test.py",
    "touch /workspace/tests/conftest.py",
    "cp -r /workspace/secret /workspace/s2",
]


async def grader_intact(sb: Sandbox) -> None:
    shown = await sb.exec(SHOW, user="root")
    assert shown.ok, shown
    assert shown.text == WANT
    for attack in ATTACKS:
        r = await sb.exec(attack)
        assert not r.ok, (attack, r)
    assert (await sb.exec("cat /workspace/secret/key", user="root")).text == "k3y"
    assert (await sb.exec("cat /workspace/tests/test.py")).text == "assert solve() == 42\n"
    # The sandbox user's own files stay its own.
    mine = await sb.exec("cd /workspace && printf x > mine && stat -c '%u %a' mine work/note && id -u")
    assert mine.ok, mine
    made, note, uid = mine.text.splitlines()
    assert made.split()[0] == note.split()[0] == uid and note.split()[1] == "640", mine


async def test_grader_stays_roots_through_snapshot_restore_and_fork(
    app: App, client: AsyncClient, pool: str
) -> None:
    async with client.acquire(pool, timeout=60) as sb:
        # Root (without capabilities) writes in the workspace only where all may.
        assert (await sb.exec("chmod 1777 /workspace")).ok
        made = await sb.exec(GRADER, user="root")
        assert made.ok, made
        assert (await sb.exec("mkdir -p work && printf n > work/note && chmod 0640 work/note")).ok
        before = (await sb.exec(SHOW, user="root")).text
        snap = await sb.snapshot()
        # Snapshotting changes nothing: still root's, still closed.
        assert (await sb.exec(SHOW, user="root")).text == before
        for attack in ATTACKS[:2]:
            assert not (await sb.exec(attack)).ok
    fork = await client.restore(snap.id, n=2, timeout=90)
    try:
        for target in fork:
            await grader_intact(target)
            # The restore's opening of the workspace's top (0777) was undone.
            assert (await target.exec("stat -c %a /workspace")).text != "777\n"
        # An incremental snapshot of a restored sandbox keeps the owners too.
        assert (await fork[0].exec("printf y > /workspace/work/more")).ok
        child = await fork[0].snapshot()
        assert child.parent_id == snap.id
    finally:
        await fork.release()
    again = await client.restore(child.id, timeout=90)
    try:
        await grader_intact(again[0])
        assert (await again[0].exec("cat /workspace/work/more")).text == "y"
    finally:
        await again.release()


async def test_names_that_are_not_utf8_travel_as_bytes(app: App, client: AsyncClient, pool: str) -> None:
    make = (
        "cd /workspace && mkdir $'d\\xff' && printf one > $'d\\xff/f\\xfe\\x01' "
        "&& ln -s $'d\\xff/f\\xfe\\x01' $'l\\x80' && printf two > $'\\xc3('"
    )
    show = "cd /workspace && find . -printf '%y %m %p %l\\n' | LC_ALL=C sort | od -An -c"
    async with client.acquire(pool, timeout=60) as sb:
        assert (await sb.exec(make)).ok
        want = (await sb.exec(show)).text
        snap = await sb.snapshot()
    restored = await client.restore(snap.id, timeout=90)
    try:
        assert (await restored[0].exec(show)).text == want
        assert (await restored[0].exec("cat /workspace/$'d\\xff/f\\xfe\\x01'")).text == "one"
        # A refusal names such a file with its bytes escaped (and is sent).
        assert (await restored[0].exec("ln -s /etc/passwd /workspace/$'out\\xff'")).ok
        with pytest.raises(errors.FailedPrecondition, match=r"/workspace/out\\xff: symlink to '/etc/passwd'"):
            await restored[0].snapshot()
    finally:
        await restored.release()


async def test_a_path_no_restore_could_write_is_refused_naming_it(client: AsyncClient, pool: str) -> None:
    # 17 levels of 250 bytes: about 4,270 bytes below the workspace.
    levels = [("a" * 249) + chr(ord("a") + i) for i in range(17)]
    top, rest = "/".join(levels[:8]), "/".join(levels[8:])
    async with client.acquire(pool, timeout=60) as sb:
        # Made in two steps, so that no working directory passes PATH_MAX.
        made = await sb.exec(
            f"cd /workspace && mkdir -p {top} && cd {top} && mkdir -p {rest} && : > {rest}/$'f\\xff'"
        )
        assert made.ok, made
        with pytest.raises(errors.FailedPrecondition, match=f"longer than {mf.MAX_PATH_BYTES} bytes") as got:
            await sb.snapshot()
        # Named by its head and its tail: the deepest directory (or what it holds).
        assert f"/workspace/{'a' * 90}" in str(got.value) and "aaaq" in str(got.value)
        # Removed, the workspace snapshots again.
        assert (await sb.exec(f"rm -rf /workspace/{'a' * 249}a")).ok
        assert (await sb.snapshot()).entry_count == 0
