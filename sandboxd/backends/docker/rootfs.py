"""A writable root whose writes are bounded (SandboxSpec.writable_root).

The engine gives a container with a writable root an overlay2 layer of its
own on the host's disk, unbounded (its ``--storage-opt size=`` needs xfs with
project quotas). So between create and start a size- and inode-limited tmpfs
is mounted over the container's layer directory (the parent of its
``UpperDir``: ``diff/``, ``work/``, the ``link`` and ``lower`` files, and
``merged/`` once started), with what the engine put there copied in, so that
overlayfs finds upper and work dirs on one filesystem: the sandbox's root
writes land in the tmpfs, a write past its bound fails with ENOSPC inside,
and its pages are charged to the writer's memory cgroup, as the
workspace's are. Under gVisor, runsc's default root overlay keeps its upper
layer in a file in the container's rootfs, which then lives in that tmpfs.

The engine unmounts the tmpfs when it removes the container (it removes a
layer directory with a mountpoint in it by unmounting first); ``unmount``
and ``sweep`` make sure of it, unmounting any of this instance's tmpfs mounts
left over a layer no container uses (a crash between mount and start, an
engine that did not). Mounts are named ``MOUNT_SOURCE.<instance>``.

This needs the control plane to share the engine host's mount namespace and
its overlay2 directory, as root; ``refusal`` says why not where it cannot.
The bind-mounted files the engine writes outside the layer (/etc/hosts,
/etc/hostname, /etc/resolv.conf) would be writable and unbounded: they are
replaced with read-only copies from the sandbox's inbox.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker.types

from sandboxd.backends.network.netns import EGRESS_ADDRESS

MOUNT_SOURCE = "sandboxd-root"
"""The source name of every writable root's tmpfs (with ``.<instance>``)."""
_EXTRA_FILES = 64
# Inodes the overlay itself and the mountpoints the runtime makes in the
# root take from the tmpfs, beyond the sandbox's max_files.
_LAYER_ENTRIES = 64
# A fresh container's layer directory holds a handful of entries: more
# means it is not what this module expects to copy.
_ENGINE_PIDFILES = ("/var/run/docker.pid", "/run/docker.pid")
_NETWORK_FILES = ("hosts", "hostname", "resolv.conf")
_MNT_DETACH = 2

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def network_files_mounts(inbox: Path, network: bool) -> list[docker.types.Mount]:
    """Writes the sandbox's /etc/hosts, /etc/hostname and /etc/resolv.conf
    into its inbox and returns their read-only mounts (the engine's own
    would be writable with the root, on the host's disk). With ``network``
    the resolver is the sandbox's egress resolver, as the engine's DNS
    option would name it."""
    contents = {
        "hosts": "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\tsandbox\n",
        "hostname": "sandbox\n",
        "resolv.conf": f"nameserver {EGRESS_ADDRESS}\n" if network else "",
    }
    mounts = []
    for name in _NETWORK_FILES:
        path = inbox / f".sandboxd-{name}"
        path.write_text(contents[name])
        path.chmod(0o644)
        mounts.append(
            docker.types.Mount(target=f"/etc/{name}", source=str(path), type="bind", read_only=True)
        )
    return mounts


@dataclass(frozen=True)
class _Entry:
    path: str
    mode: int
    uid: int
    gid: int
    data: bytes | None
    link: str | None


def _read_layer(layer: Path) -> list[_Entry]:
    entries: list[_Entry] = []
    for top, dirs, files in os.walk(layer):
        for name in [*dirs, *files]:
            full = os.path.join(top, name)
            st = os.lstat(full)
            rel = os.path.relpath(full, layer)
            if stat.S_ISLNK(st.st_mode):
                entries.append(_Entry(rel, st.st_mode, st.st_uid, st.st_gid, None, os.readlink(full)))
            elif stat.S_ISREG(st.st_mode):
                entries.append(_Entry(rel, st.st_mode, st.st_uid, st.st_gid, Path(full).read_bytes(), None))
            elif stat.S_ISDIR(st.st_mode):
                entries.append(_Entry(rel, st.st_mode, st.st_uid, st.st_gid, None, None))
            else:
                raise OSError(f"unexpected {full} in the container's layer directory")
            if len(entries) > _LAYER_ENTRIES:
                raise OSError(f"the container's layer directory {layer} holds more than expected")
    return entries


def _write_layer(layer: Path, entries: list[_Entry]) -> None:
    # Parents come before children (os.walk is top-down); directory modes
    # are set last, as some (work/work: 0) let no entry be made inside.
    for e in entries:
        full = layer / e.path
        if e.link is not None:
            os.symlink(e.link, full)
        elif e.data is not None:
            full.write_bytes(e.data)
        else:
            full.mkdir()
        os.lchown(full, e.uid, e.gid)
        if e.link is None and e.data is not None:
            os.chmod(full, stat.S_IMODE(e.mode))
    for e in reversed(entries):
        if e.link is None and e.data is None:
            os.chmod(layer / e.path, stat.S_IMODE(e.mode))


def _mount_tmpfs(source: str, target: Path, options: str) -> None:
    if _libc.mount(source.encode(), str(target).encode(), b"tmpfs", 0, options.encode()) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"cannot mount a tmpfs on {target}: {os.strerror(err)}")


def mount_root(upper_dir: str, instance: str, size: int, files: int) -> Path:
    """Mounts the bounded tmpfs over the layer directory of a created (not
    yet started) container whose ``UpperDir`` is ``upper_dir``, with the
    engine's entries copied in; returns the layer directory. OSError when
    it cannot (the container is then left for its removal)."""
    layer = Path(upper_dir).parent
    st = layer.stat()
    entries = _read_layer(layer)
    options = f"size={size},mode={stat.S_IMODE(st.st_mode):o},uid={st.st_uid},gid={st.st_gid}"
    if files:
        # gVisor pools have no max_files: their root overlay is one file here.
        options += f",nr_inodes={files + _EXTRA_FILES}"
    _mount_tmpfs(f"{MOUNT_SOURCE}.{instance}", layer, options)
    try:
        _write_layer(layer, entries)
    except OSError:
        unmount(layer)
        raise
    return layer


def unmount(layer: Path) -> None:
    """Unmounts a writable root's tmpfs (lazily: a process may still hold
    it); nothing mounted there is no error."""
    if _libc.umount2(str(layer).encode(), _MNT_DETACH) != 0:
        err = ctypes.get_errno()
        if err not in (22, 2):  # EINVAL: not a mountpoint; ENOENT: gone
            raise OSError(err, f"cannot unmount {layer}: {os.strerror(err)}")


def mounted_roots(instance: str) -> list[Path]:
    """The layer directories this instance's writable-root tmpfs mounts are on."""
    source = f"{MOUNT_SOURCE}.{instance}"
    out = []
    with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
        for line in f:
            fields = line.split()
            sep = fields.index("-")
            if fields[sep + 1] == "tmpfs" and fields[sep + 2] == source:
                out.append(Path(fields[4].replace("\\040", " ")))
    return out


def sweep(instance: str, in_use: set[str]) -> list[Path]:
    """Unmounts this instance's writable-root tmpfs mounts whose layer
    directory's name is not in ``in_use``; returns those it unmounted."""
    gone = [p for p in mounted_roots(instance) if p.name not in in_use]
    for layer in gone:
        with contextlib.suppress(OSError):
            unmount(layer)
    return gone


def layers_in_use(root_dir: str) -> set[str]:
    """The layer directory names of every container the engine holds, from
    its layer store (``image/overlay2/layerdb/mounts/<container>/mount-id``)."""
    mounts = Path(root_dir) / "image" / "overlay2" / "layerdb" / "mounts"
    out: set[str] = set()
    with contextlib.suppress(FileNotFoundError):
        for entry in mounts.iterdir():
            with contextlib.suppress(OSError):
                out.add((entry / "mount-id").read_text().strip())
    return out


def refusal(info: dict[str, Any], local: bool, inboxes: bool) -> str | None:
    """Why this process cannot bound a writable root on the engine whose
    ``info`` this is; None when it can."""
    if not local:
        return "the Docker engine is remote (its layers must be on this host)"
    if info.get("Driver") != "overlay2":
        return (
            f"the engine's storage driver is {info.get('Driver')!r}, not overlay2 (Docker's own "
            "--storage-opt size= needs xfs with project quotas)"
        )
    if not inboxes:
        return "the backend has no inbox directory (docker.inbox_dir), which the root's fixed files need"
    if os.geteuid() != 0:
        return "the control plane does not run as root, which mounting the root's bound needs"
    root_dir = str(info.get("DockerRootDir") or "")
    if not root_dir or not (Path(root_dir) / "overlay2").is_dir():
        return f"the engine's layer directory {root_dir}/overlay2 is not visible here"
    if not _same_mount_namespace():
        return "the control plane does not share the engine's mount namespace"
    return None


def _same_mount_namespace() -> bool:
    """Whether the engine's process is in this process's mount namespace
    (False when its pid file cannot be read to tell)."""
    for pidfile in _ENGINE_PIDFILES:
        with contextlib.suppress(OSError, ValueError):
            pid = int(Path(pidfile).read_text().strip())
            return os.readlink(f"/proc/{pid}/ns/mnt") == os.readlink("/proc/self/ns/mnt")
    return False
