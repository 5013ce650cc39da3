"""Pausing, checkpointing and restoring running gVisor containers.

Measured on Docker 20.10 (experimental) with runsc: ``POST
/containers/{id}/checkpoints`` with ``Exit: false`` and a ``CheckpointDir``
writes the image (checkpoint.img, pages.img, pages_meta.img) straight into a
directory of ours while the container keeps running. The engine refuses a
checkpoint directory on start, so a restore copies the image into the
target's own ``containers/<id>/checkpoints/<name>`` under the engine's root
and starts it with ``?checkpoint=<name>``; the target may be a warm
container that ran before (it is stopped first), with other mounts. The
engine uploads that directory, as a tar, to containerd's content store and
refuses one whose digest it holds already ("content ... already exists": a
restore of an image restored before, or several restores of one image at
once): each copy gets a random mtime, which makes its tar unique.

gVisor restores the container's init tree only (sandboxd.backends.docker.keeper
says how processes get there). A paused runsc container cannot be removed
(the engine reports a zombie): it is thawed first.
"""

from __future__ import annotations

import os
import secrets
import shutil
import time
from pathlib import Path
from typing import Any

import docker.errors
import requests.exceptions

from sandboxd.backends.base import GVISOR
from sandboxd.backends.docker.containers import Containers
from sandboxd.backends.docker.keeper import KEPT_VAR, RELAY_VAR
from sandboxd.backends.shell import EXEC_TAG_VAR, SESSION_TAG_VAR
from sandboxd.errors import FailedPrecondition, SandboxLost, TransientBackendError

_NAME = "sandboxd"
"""The checkpoint's name in the engine (one at a time per container)."""
_STOP_WAIT_SECONDS = 30
_CREATE_ATTEMPTS = 4
"""Checkpoint creates tried while the engine reports leftover content (0.5, 1, 2 s apart)."""

# Restored images get a random mtime in [_EPOCH, _EPOCH + _STAMPS) seconds:
# concurrent restores of one image (a fork) then upload different tars.
_EPOCH = 1_000_000_000
_STAMPS = 1 << 30


# Lists, with bash builtins but one sort, the processes a checkpoint would
# not carry. gVisor's restore kills every process whose lineage began with an
# engine exec (a task's origin is inherited by fork, whoever its parent is
# later): only the container's init (pid 1) and what the keeper started
# (kept shells among them) survive. That origin is not visible from inside,
# so a process counts as an exec's when its parent chain ends at a root
# other than pid 1 (an exec's first process has parent 0) or, re-parented to
# pid 1, when its environment carries an exec's tag (EXEC_TAG_VAR,
# SESSION_TAG_VAR) but not a kept shell's key (KEPT_VAR: the keeper started
# it), or whose environment it cannot read (another user's: root's, started
# by a root exec, as kept processes run as the container's user and none
# can change its uid). Left out: the backend's own shells (roots with
# SESSION_TAG_VAR), relays to kept shells with their pumps (RELAY_VAR), and
# this listing with the shells it runs in ($BASHPID and up). One line each,
# "pid args", the args cut at 200 bytes; at most _LISTED.
_LISTED = 50
NOT_CARRIED_SCRIPT = f"""
declare -A up mine
for d in /proc/[0-9]*; do
  p=${{d#/proc/}}; s=
  {{ read -r s < "$d/stat"; }} 2>/dev/null || continue
  s=${{s##*) }}; set -- $s
  [ "$1" = Z ] || up[$p]=$2
done
q=$BASHPID
while [ -n "$q" ] && [ "$q" != 0 ]; do mine[$q]=1; q=${{up[$q]}}; done
tagged() {{
  local e t=1
  {{ : < "/proc/$1/environ"; }} 2>/dev/null || {{ [ -e "/proc/$1/stat" ] && return 0; }}
  while IFS= read -r -d '' e; do
    case $e in {KEPT_VAR}=*) return 1 ;; {EXEC_TAG_VAR}=* | {SESSION_TAG_VAR}=*) t=0 ;; esac
  done 2>/dev/null < "/proc/$1/environ"
  return $t
}}
relay() {{
  local e
  while IFS= read -r -d '' e; do
    case $e in {RELAY_VAR}=*) return 0 ;; esac
  done 2>/dev/null < "/proc/$1/environ"
  return 1
}}
session_shell() {{
  local e
  while IFS= read -r -d '' e; do
    case $e in {SESSION_TAG_VAR}=*) return 0 ;; esac
  done 2>/dev/null < "/proc/$1/environ"
  return 1
}}
n=0
for p in $(printf '%s\n' "${{!up[@]}}" | sort -n); do
  [ "$p" = 1 ] || [ -n "${{mine[$p]}}" ] && continue
  q=$p; hops=0
  while [ "${{up[$q]:-0}}" != 0 ] && [ $hops -lt 4096 ]; do q=${{up[$q]}}; hops=$((hops + 1)); done
  if [ "$q" = "$p" ]; then session_shell "$p" && continue
  elif [ "$q" = 1 ]; then tagged "$p" || continue
  else relay "$q" && continue
  fi
  a=
  while IFS= read -r -d '' w; do a+="${{a:+ }}$w"; done 2>/dev/null < "/proc/$p/cmdline"
  printf '%s %s\n' "$p" "${{a:0:200}}"
  n=$((n + 1)); [ $n -ge {_LISTED} ] && break
done
true
"""


def parse_not_carried(text: str) -> list[str]:
    """NOT_CARRIED_SCRIPT's lines as "args (pid N)"."""
    out = []
    for line in text.splitlines():
        pid, _, args = line.partition(" ")
        if pid.isdigit():
            out.append(f"{args or '?'} (pid {pid})")
    return out


class Checkpoints:
    """Pause, resume, checkpoint and restore of gVisor containers, each engine
    call on the containers' worker threads."""

    def __init__(self, containers: Containers, local: bool) -> None:
        self._containers = containers
        # Restores write below the engine's root: only where it is this host's.
        self._local = local
        self._root: Path | None = None
        self._experimental: bool | None = None

    def refusal(self, runtime: str) -> str:
        """Why sandboxes of ``runtime`` cannot be paused or checkpointed ("" if they can)."""
        if runtime != GVISOR:
            return (
                f"runtime {runtime!r} cannot checkpoint a running sandbox here (CRIU under runc is not "
                "available); use a pool with runtime 'gvisor'"
            )
        if not self._local:
            return (
                "the Docker engine is remote: a checkpoint image must be written into the engine's own "
                "directory, which only a control plane on the engine's host can do"
            )
        return ""

    async def pause(self, handle: str) -> None:
        await self._call("pause", self._containers.api.pause, handle, quiet="is already paused")

    async def resume(self, handle: str) -> None:
        await self._call("resume", self._containers.api.unpause, handle, quiet="is not paused")

    async def checkpoint(self, handle: str, dest: Path) -> None:
        """The image lands in ``dest`` (made here; must not exist)."""
        await self._engine_facts()
        await self._containers.run(self._checkpoint_sync, handle, dest)

    async def _engine_facts(self) -> Path:
        """The engine's root directory, once it is known to checkpoint at all."""
        if self._experimental is None or self._root is None:
            info = await self._containers.engine_info()
            self._experimental = bool(info.get("ExperimentalBuild"))
            self._root = Path(str(info.get("DockerRootDir") or "/var/lib/docker"))
        if not self._experimental:
            raise FailedPrecondition(
                "the Docker engine runs without experimental features, which checkpoints need "
                '("experimental": true in its daemon.json)'
            )
        return self._root

    def _checkpoint_sync(self, handle: str, dest: Path) -> None:
        api = self._containers.api
        work = dest.parent / f".{dest.name}.{secrets.token_hex(4)}"
        work.mkdir(parents=True, mode=0o700)
        try:
            body = {"CheckpointID": _NAME, "CheckpointDir": str(work), "Exit": False}
            for attempt in range(_CREATE_ATTEMPTS):
                try:
                    self._raise(api._post_json(api._url("/containers/{0}/checkpoints", handle), data=body))
                    break
                except docker.errors.APIError as e:
                    # Docker 20.10 commits each checkpoint's blobs to containerd's
                    # content store and fails on one an earlier checkpoint left
                    # there (identical content) until containerd's GC removes it.
                    if "already exists" not in str(e.explanation) or attempt == _CREATE_ATTEMPTS - 1:
                        raise
                    shutil.rmtree(work / _NAME, ignore_errors=True)
                    time.sleep(0.5 * 2**attempt)  # a worker thread, not the event loop
            # The engine writes <dir>/<name>/; ours is the image itself.
            os.rename(work / _NAME, dest)
        except docker.errors.NotFound as e:
            raise SandboxLost("the sandbox's container is gone") from e
        except docker.errors.APIError as e:
            raise TransientBackendError(f"checkpoint failed: {e.explanation}") from e
        except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
            raise TransientBackendError(f"checkpoint failed: {e}") from e
        finally:
            shutil.rmtree(work, ignore_errors=True)

    async def restore(self, handle: str, image: Path) -> None:
        """Stops the container, then starts it from ``image`` (a directory)."""
        root = await self._engine_facts()
        await self._containers.run(self._restore_sync, handle, image, root)

    def _restore_sync(self, handle: str, image: Path, root: Path) -> None:
        api = self._containers.api
        target = root / "containers" / handle / "checkpoints" / _NAME
        try:
            api.kill(handle)
            api.wait(handle, timeout=_STOP_WAIT_SECONDS)
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir(parents=True, mode=0o700)
            # Whole seconds: the engine's tar drops fractions (two restores in
            # one second with sub-second stamps still collided).
            stamp = _EPOCH + secrets.randbelow(_STAMPS)
            for entry in os.scandir(image):
                shutil.copyfile(entry.path, target / entry.name)
                os.utime(target / entry.name, (stamp, stamp))
            self._raise(api._post(api._url("/containers/{0}/start", handle), params={"checkpoint": _NAME}))
        except docker.errors.NotFound as e:
            raise SandboxLost("the sandbox's container is gone") from e
        except docker.errors.APIError as e:
            raise FailedPrecondition(
                f"the engine could not start the sandbox from the checkpoint: {e.explanation}"
            ) from e
        except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
            raise TransientBackendError(f"restore from a checkpoint failed: {e}") from e
        except OSError as e:
            raise FailedPrecondition(f"cannot hand the checkpoint image to the engine: {e}") from e
        finally:
            shutil.rmtree(target, ignore_errors=True)

    def _raise(self, response: Any) -> None:
        self._containers.api._raise_for_status(response)

    async def _call(self, what: str, fn: Any, handle: str, quiet: str) -> None:
        try:
            await self._containers.run(fn, handle)
        except docker.errors.NotFound as e:
            raise SandboxLost("the sandbox's container is gone") from e
        except docker.errors.APIError as e:
            if quiet in str(e.explanation):
                return
            raise TransientBackendError(f"{what} failed: {e.explanation}") from e
        except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
            raise TransientBackendError(f"{what} failed: {e}") from e
