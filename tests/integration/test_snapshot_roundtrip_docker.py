"""A property-based round trip on the real engine: workspaces of arbitrary
byte names, modes (000, closed and sticky directories), owners (the sandbox
user and root), symlinks, hard links, empty and larger files go through
Snapshot, Restore and a fork of two, read in place and through the sandbox,
and come back exactly (names as bytes, kind, mode, owner, size, content,
link target); or, where an owner could not read its own entry in the
sandbox, the snapshot is refused with FAILED_PRECONDITION on both paths.

The trees are compared as the host's root sees them (through the
container's /proc root: every entry, whatever its mode), so nothing in
sandboxd is trusted to describe what it restored; that needs runc."""

from __future__ import annotations

import asyncio
import hashlib
import os
import posixpath
import stat
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sandboxd import errors
from sandboxd.app import App
from sandboxd.backends.base import LABEL_SANDBOX
from sandboxd.backends.shell import ansi_c_quote
from sandboxd.client import AsyncClient, Sandbox
from tests.integration.conftest import make_settings, running_app

pytestmark = [pytest.mark.docker, pytest.mark.timeout(900)]

ROOT, USER = "root", "user"


@dataclass(frozen=True)
class Node:
    name: bytes  # the path below the workspace, as bytes
    kind: str  # f, d, l (symlink), h (hard link to ``target``)
    mode: int
    owner: str
    size: int = 0
    target: bytes = b""


_COMPONENT = (
    st.binary(min_size=1, max_size=12)
    .filter(lambda b: b"/" not in b and b"\0" not in b)
    .filter(lambda b: b not in (b".", b".."))
)
_FILE_MODES = [0o000, 0o400, 0o600, 0o644, 0o640, 0o755, 0o700, 0o444]
_DIR_MODES = [0o755, 0o700, 0o1777, 0o000, 0o500, 0o711, 0o1755]
_SIZES = [0, 1, 100, 70_000]


@st.composite
def trees(draw: st.DrawFn) -> list[Node]:
    nodes: list[Node] = []
    dirs: list[bytes] = [b""]
    taken: set[bytes] = set()
    files: list[Node] = []
    for _ in range(draw(st.integers(1, 10))):
        parent = draw(st.sampled_from(dirs))
        name = draw(_COMPONENT)
        path = parent + b"/" + name if parent else name
        if path in taken:
            continue
        taken.add(path)
        owner = draw(st.sampled_from([USER, USER, ROOT]))
        kind = draw(st.sampled_from(["f", "f", "d", "d", "l", "h"]))
        if kind == "h" and not [f for f in files if f.owner == owner]:
            kind = "f"
        if kind == "d":
            dirs.append(path)
            nodes.append(Node(path, "d", draw(st.sampled_from(_DIR_MODES)), owner))
        elif kind == "f":
            node = Node(path, "f", draw(st.sampled_from(_FILE_MODES)), owner, draw(st.sampled_from(_SIZES)))
            files.append(node)
            nodes.append(node)
        elif kind == "l":
            # Relative, to anything (or nothing) inside the workspace.
            to = draw(st.sampled_from([n.name for n in nodes] or [b"missing"]))
            up = b"../" * path.count(b"/")
            nodes.append(Node(path, "l", 0o777, owner, target=up + to))
        else:
            # protected_hardlinks: a user links only what it owns.
            to_file = draw(st.sampled_from([f for f in files if f.owner == owner]))
            nodes.append(Node(path, "h", to_file.mode, owner, to_file.size, to_file.name))
    return nodes


def _q(path: bytes) -> str:
    return ansi_c_quote("/workspace/" + path.decode("utf-8", "surrogateescape"))


def _steps(nodes: list[Node]) -> list[tuple[str, str]]:
    """(actor, command) creating ``nodes`` with their owners: directories
    open (0777) while anything is made, closed children first at the end."""
    steps: list[tuple[str, str]] = [(USER, "chmod 1777 /workspace")]
    for n in nodes:  # in creation order: a parent before what it holds
        if n.kind == "d":
            steps.append((n.owner, f"mkdir {_q(n.name)} && chmod 0777 {_q(n.name)}"))
        elif n.kind == "f":
            seed = hashlib.sha256(n.name).hexdigest()[:16]
            steps.append((n.owner, f"{{ yes {seed} || :; }} | head -c {n.size} > {_q(n.name)}"))
        elif n.kind == "l":
            steps.append(
                (n.owner, f"ln -s {ansi_c_quote(n.target.decode('utf-8', 'surrogateescape'))} {_q(n.name)}")
            )
        else:
            steps.append((n.owner, f"ln {_q(n.target)} {_q(n.name)}"))
    for n in nodes:
        if n.kind == "f":
            steps.append((n.owner, f"chmod {n.mode:o} {_q(n.name)}"))
    for n in sorted((n for n in nodes if n.kind == "d"), key=lambda n: -n.name.count(b"/")):
        steps.append((n.owner, f"chmod {n.mode:o} {_q(n.name)}"))
    return steps


def _refused(nodes: list[Node]) -> bool:
    """Whether some entry's owner could not read it in the sandbox (its own
    file, its own directory's listing, or the way down to it)."""
    by_name = {n.name: n for n in nodes}

    def bits(owner: str, n: Node) -> int:
        return (n.mode >> 6 if n.owner == owner else n.mode) & 7

    for n in nodes:
        if n.kind == "f" and not bits(n.owner, n) & 4:
            return True
        if n.kind == "h" and not bits(n.owner, by_name[n.target]) & 4:
            return True
        if n.kind == "d" and bits(n.owner, n) & 5 != 5:
            return True
        parent = posixpath.dirname(n.name)
        while parent:
            if not bits(n.owner, by_name[parent]) & 1:
                return True
            parent = posixpath.dirname(parent)
    return False


def _walk(top: bytes, rel: bytes = b"") -> list[tuple[bytes, os.stat_result]]:
    out = []
    for entry in os.scandir(top + rel if not rel else top + b"/" + rel):
        path = rel + b"/" + entry.name if rel else entry.name
        st = entry.stat(follow_symlinks=False)
        out.append((path, st))
        if stat.S_ISDIR(st.st_mode):
            out += _walk(top, path)
    return out


def _describe_host(top: bytes, uid: int, gid: int) -> set[tuple[Any, ...]]:
    rows = set()
    for path, info in _walk(top):
        full = top + b"/" + path
        kind = "d" if stat.S_ISDIR(info.st_mode) else "l" if stat.S_ISLNK(info.st_mode) else "f"
        digest = hashlib.sha256(Path(os.fsdecode(full)).read_bytes()).hexdigest() if kind == "f" else ""
        target = os.readlink(full) if kind == "l" else b""
        owner = (
            {uid: USER, 0: ROOT}.get(info.st_uid, info.st_uid),
            {gid: USER, 0: ROOT}.get(info.st_gid, info.st_gid),
        )
        size = info.st_size if kind == "f" else 0  # a directory's or link's size is the file system's
        rows.add((path, kind, info.st_mode & 0o7777, owner, size, digest, target))
    return rows


async def _describe(engine: docker.DockerClient, sb: Sandbox) -> set[tuple[Any, ...]]:
    """The workspace as the host's root sees it (every entry, whatever its
    mode): (name, kind, mode, owner, size, digest, link target)."""
    uid, gid = (int(x) for x in (await sb.exec("id -u; id -g")).text.split())
    (container,) = await asyncio.to_thread(
        engine.containers.list, filters={"label": f"{LABEL_SANDBOX}={sb.id}"}
    )
    top = f"/proc/{container.attrs['State']['Pid']}/root/workspace".encode()
    return await asyncio.to_thread(_describe_host, top, uid, gid)


async def _build(sb: Sandbox, nodes: list[Node]) -> None:
    group: list[str] = []
    actor = USER
    for who, command in [*_steps(nodes), ("", "")]:
        if who != actor and group:
            r = await sb.exec("set -e\n" + "\n".join(group), user="root" if actor == ROOT else "")
            assert r.ok, (r, group)
            group = []
        actor = who
        group.append(command)


@pytest.fixture(params=["in-place", "through-sandbox"])
async def app(
    request: pytest.FixtureRequest, tmp_path: Path, engine: docker.DockerClient, image: str
) -> AsyncIterator[App]:
    settings = make_settings(tmp_path, **{"backend.host_workspaces": request.param == "in-place"})
    async with running_app(settings, engine) as app:
        yield app


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=True,
)
@given(nodes=trees())
async def test_workspaces_come_back_exactly_or_are_refused_on_both_paths(
    client: AsyncClient, pool: str, engine: docker.DockerClient, nodes: list[Node]
) -> None:
    async with client.acquire(pool, timeout=60) as sb:
        await _build(sb, nodes)
        want = await _describe(engine, sb)
        if _refused(nodes):
            with pytest.raises(errors.FailedPrecondition, match="cannot be snapshotted: its owner"):
                await sb.snapshot()
            return
        snap = await sb.snapshot()
    fork = await client.restore(snap.id, n=2, timeout=120)
    try:
        for target in fork:
            assert await _describe(engine, target) == want
    finally:
        await fork.release()
