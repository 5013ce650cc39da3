"""A second kube-apiserver process for fault tests: the test cluster's own
binary and flags (read from the running one), another port, the same etcd.
Stopping it takes the API away from a control plane pointed at it while the
shared cluster (controller manager, scheduler, kwok, other tests) carries on
through the first one."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import socket
from pathlib import Path

import yaml

from sandboxd.backends.kubernetes.client import KubeClient, KubeError, load_configuration
from tests.kube.conftest import poll


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_us() -> None:
    """In the child: its own session, and SIGKILL when the test process dies,
    even by SIGKILL or a timeout, so no second API server outlives a run."""
    os.setsid()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _running_argv(kubeconfig: str) -> list[str] | None:
    """The argv of the test cluster's kube-apiserver (up.sh keeps its pid
    next to the kubeconfig), or None when it cannot be read."""
    pid_file = Path(kubeconfig).parent / "pids" / "kube-apiserver"
    try:
        raw = Path(f"/proc/{int(pid_file.read_text())}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    argv = [a.decode() for a in raw.split(b"\0") if a]
    return argv if argv and "kube-apiserver" in argv[0] else None


class SecondApiServer:
    def __init__(self, kubeconfig: str, workdir: Path) -> None:
        argv = _running_argv(kubeconfig)
        if argv is None:
            raise LookupError("cannot read the running kube-apiserver's command line")
        self.port = _free_port()
        self._argv = self._with(argv, {"--secure-port": str(self.port), "--cert-dir": str(workdir / "certs")})
        # Two servers on one address would take turns rewriting the
        # `kubernetes` Service's endpoints with their ports; leave it to the first.
        self._argv.append("--endpoint-reconciler-type=none")
        self._log = workdir / "kube-apiserver.log"
        config = yaml.safe_load(Path(kubeconfig).read_text())
        for cluster in config["clusters"]:
            cluster["cluster"]["server"] = f"https://127.0.0.1:{self.port}"
        self.kubeconfig = str(workdir / "second.kubeconfig")
        Path(self.kubeconfig).write_text(yaml.safe_dump(config))
        self._proc: asyncio.subprocess.Process | None = None

    @staticmethod
    def _with(argv: list[str], flags: dict[str, str]) -> list[str]:
        out = list(argv)
        for flag, value in flags.items():
            if flag in out:
                out[out.index(flag) + 1] = value
            else:
                out += [flag, value]
        return out

    async def start(self, timeout: float = 90.0) -> None:
        log = self._log.open("ab")
        try:
            self._proc = await asyncio.create_subprocess_exec(
                *self._argv, stdout=log, stderr=log, stdin=asyncio.subprocess.DEVNULL, preexec_fn=_die_with_us
            )
        finally:
            log.close()
        client = KubeClient(load_configuration(self.kubeconfig, None), threads=2, timeout=2.0)
        try:

            async def ready() -> bool:
                assert self._proc is not None
                if self._proc.returncode is not None:
                    raise AssertionError(f"kube-apiserver exited; see {self._log}")
                try:
                    await client.request("GET", "/api/v1/namespaces/default")
                    return True
                except KubeError:
                    return False

            await poll(ready, timeout=timeout, what="the second kube-apiserver to be ready")
        finally:
            await client.close()

    def pause(self) -> None:
        """SIGSTOP: connections are accepted (by the kernel) and never answered."""
        assert self._proc is not None
        self._proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self._proc is not None
        self._proc.send_signal(signal.SIGCONT)

    async def kill(self) -> None:
        """SIGKILL: connections are cut, new ones refused."""
        if self._proc is not None and self._proc.returncode is None:
            self._proc.kill()
            await self._proc.wait()
        self._proc = None

    async def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            if self._proc is not None:
                self.resume()  # a stopped process does not die of SIGKILL until continued
            await self.kill()
