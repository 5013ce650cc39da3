"""A throwaway Docker engine for one benchmark driver.

A naive burst of hundreds of ``docker run``s can wedge dockerd until it is
restarted (ENGINE-LIMITS), and the host's own engine serves other people. So
each driver gets a dockerd of its own: its own data root, exec root, pidfile,
socket and cgroup parent, its own containerd (the one dockerd manages), no
bridge and no iptables, and the runtimes of the host's daemon.json. ``close``
kills it whatever state it is in and removes every trace: processes (found by
the cgroup parent and by the paths on their command lines), mounts, cgroups
and directories.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import secrets
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import docker

DATA_BASE = Path("/var/lib/sandboxd-bench")
RUN_BASE = Path("/run/sandboxd-bench")
"""Short, so that containerd's socket under the exec root fits a unix socket path."""
CGROUP_ROOT = Path("/sys/fs/cgroup")
HOST_DAEMON_JSON = Path("/etc/docker/daemon.json")
START_WITHIN = 60.0


def _die_with_parent() -> None:
    """In the child: SIGTERM when the benchmark dies, even by SIGKILL (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    os.setsid()


def _alive(pid: int) -> bool:
    """Running and not a zombie (kill -0 also succeeds on an unreaped zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def host_runtimes() -> dict[str, Any]:
    """The extra runtimes the host's dockerd is configured with (runsc, crun)."""
    try:
        return dict(json.loads(HOST_DAEMON_JSON.read_text()).get("runtimes", {}))
    except (OSError, ValueError):
        return {}


class Engine:
    """``dockerd`` as a child process with everything of its own; use as a context manager."""

    def __init__(self, name: str) -> None:
        self.id = f"{name}-{secrets.token_hex(3)}"
        self.data = DATA_BASE / self.id
        self.run = RUN_BASE / self.id
        self.socket = self.run / "docker.sock"
        self.url = f"unix://{self.socket}"
        self.cgroup_parent = f"sandboxd-bench-{self.id}"
        self.log_path = self.data / "dockerd.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.start_s = 0.0

    def __enter__(self) -> Engine:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def client(self, timeout: float = 60.0, pool: int = 16) -> docker.DockerClient:
        return docker.DockerClient(base_url=self.url, timeout=timeout, max_pool_size=pool)

    def start(self) -> None:
        sweep_stale()
        (self.data / "root").mkdir(parents=True)
        (self.run / "exec").mkdir(parents=True)
        config = self.data / "daemon.json"
        # Only what the flags below do not set (dockerd refuses a key given twice).
        config.write_text(json.dumps({"runtimes": host_runtimes(), "experimental": True}))
        cmd = [
            "dockerd", "--config-file", str(config),
            "--data-root", str(self.data / "root"), "--exec-root", str(self.run / "exec"),
            "--pidfile", str(self.run / "dockerd.pid"), "-H", self.url,
            "--bridge=none", "--iptables=false", "--ip6tables=false",
            "--cgroup-parent", f"/{self.cgroup_parent}", "--shutdown-timeout", "2",
        ]  # fmt: skip
        env = {**os.environ, "PATH": os.environ.get("PATH", "") + ":/usr/local/sbin:/usr/sbin:/sbin"}
        env.pop("DOCKER_HOST", None)
        t0 = time.perf_counter()
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env, preexec_fn=_die_with_parent,
            )  # fmt: skip
        deadline = t0 + START_WITHIN
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"dockerd exited with {self.proc.returncode}:\n{self.log_tail()}")
            if self.ping(2.0):
                break
            if time.perf_counter() > deadline:
                raise TimeoutError(f"dockerd not answering within {START_WITHIN:g}s:\n{self.log_tail()}")
            time.sleep(0.2)
        self.start_s = round(time.perf_counter() - t0, 3)

    def ping(self, timeout: float) -> bool:
        try:
            c = docker.DockerClient(base_url=self.url, timeout=timeout)
        except docker.errors.DockerException:
            return False
        try:
            return bool(c.ping())
        except Exception:
            return False
        finally:
            c.close()

    def log_tail(self, lines: int = 20) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def load_image(self, image: str, host: docker.DockerClient) -> dict[str, Any]:
        """Copies ``image`` from the host's engine as its filesystem (export of a
        created container, import here, the image's config re-applied), which
        measured about twice as fast as ``docker save | docker load`` of the
        same image. Blocking."""
        t0 = time.perf_counter()
        source = host.images.get(image)
        conf = source.attrs.get("Config") or {}
        changes = [f"ENV {e}" for e in conf.get("Env") or []]
        if conf.get("WorkingDir"):
            changes.append(f"WORKDIR {conf['WorkingDir']}")
        if conf.get("Cmd"):
            changes.append(f"CMD {json.dumps(conf['Cmd'])}")
        changes += [f"LABEL {k}={json.dumps(v)}" for k, v in (conf.get("Labels") or {}).items()]
        box = host.containers.create(image, ["true"], network_mode="none")
        try:
            repo, _, tag = image.rpartition(":") if ":" in image.split("/")[-1] else (image, "", "latest")
            export = subprocess.Popen(["docker", "export", box.id], stdout=subprocess.PIPE)
            assert export.stdout is not None
            cmd = ["docker", "-H", self.url, "import"]
            for change in changes:
                cmd += ["--change", change]
            imported = subprocess.run(
                [*cmd, "-", f"{repo}:{tag}"], stdin=export.stdout, capture_output=True, timeout=300
            )
            export.stdout.close()
            if export.wait(60) != 0 or imported.returncode != 0:
                raise RuntimeError(f"importing {image}: {imported.stderr.decode(errors='replace')[-400:]}")
        finally:
            with contextlib.suppress(docker.errors.APIError):
                box.remove(force=True)
        return {"method": "export | import", "seconds": round(time.perf_counter() - t0, 3)}

    def container_dirs(self) -> int:
        """Containers the engine keeps on disk, answering or not."""
        with contextlib.suppress(OSError):
            return sum(1 for _ in (self.data / "root" / "containers").iterdir())
        return 0

    def close(self) -> dict[str, Any]:
        """Kills the engine and everything it started; removes its files. Idempotent."""
        t0 = time.perf_counter()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        killed = cleanup(self.id, self.data, self.run, self.cgroup_parent)
        return {"killed_processes": killed, "seconds": round(time.perf_counter() - t0, 3)}


# -- what a dead engine leaves behind ---------------------------------------------


def _cgroup_dirs(parent: str) -> list[Path]:
    """Every cgroup directory under ``parent`` in every hierarchy, deepest first."""
    found: list[Path] = []
    with contextlib.suppress(OSError):
        for hierarchy in CGROUP_ROOT.iterdir():
            top = hierarchy / parent
            if top.is_dir():
                found += [Path(d) for d, _, _ in os.walk(top)]
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def _pids_holding(marks: tuple[str, ...], parent: str) -> set[int]:
    """Processes in the cgroup parent, or whose command line names one of ``marks``."""
    pids: set[int] = set()
    for d in _cgroup_dirs(parent):
        with contextlib.suppress(OSError, ValueError):
            pids |= {int(x) for x in (d / "cgroup.procs").read_text().split()}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
            if any(m in cmdline for m in marks):
                pids.add(int(entry.name))
    pids.discard(os.getpid())
    return pids


def cleanup(engine_id: str, data: Path, run: Path, parent: str) -> int:
    """SIGKILLs the engine's processes (dockerd, containerd, shims, containers),
    unmounts what is mounted under its roots, removes its cgroups and files."""
    marks = (str(data) + "/", str(run) + "/")
    killed = 0
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        pids = {p for p in _pids_holding(marks, parent) if _alive(p)}
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
        time.sleep(0.2)
    mounts: list[str] = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = line.split()[4]
            if point.startswith(marks) or point in (str(data), str(run)):
                mounts.append(point)
    for point in sorted(mounts, key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)
    for d in _cgroup_dirs(parent):
        with contextlib.suppress(OSError):
            d.rmdir()
    shutil.rmtree(data, ignore_errors=True)
    shutil.rmtree(run, ignore_errors=True)
    return killed


def sweep_stale() -> int:
    """Removes engines of earlier runs whose dockerd is gone (a run killed
    before its cleanup); running ones belong to another benchmark and stay."""
    swept = 0
    with contextlib.suppress(OSError):
        for run in RUN_BASE.iterdir():
            try:
                pid = int((run / "dockerd.pid").read_text().strip())
            except (OSError, ValueError):
                pid = 0
            if pid and _alive(pid):
                continue
            with contextlib.suppress(OSError):
                if not pid and time.time() - run.stat().st_mtime < 2 * START_WITHIN:
                    continue  # still starting: its pidfile is not written yet
            cleanup(run.name, DATA_BASE / run.name, run, f"sandboxd-bench-{run.name}")
            swept += 1
    return swept
