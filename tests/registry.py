"""A real OCI registry for tests: Debian's ``docker-registry`` (the
distribution registry) on 127.0.0.1 and a free port, its storage in a
temporary directory, optionally behind basic auth (an htpasswd file made
with apache2-utils' ``htpasswd -B``). The engine treats registries on
127.0.0.0/8 as insecure-allowed, so it pulls from it over plain HTTP.
scripts/setup.sh (test) installs both packages."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REGISTRY_BINARY = "docker-registry"
HTPASSWD_BINARY = "htpasswd"
_START_SECONDS = 30.0


def registry_missing() -> str:
    """Why a registry cannot be started here ("" when it can)."""
    if shutil.which(REGISTRY_BINARY) is None:
        return "Debian's docker-registry is not installed (scripts/setup.sh test installs it)"
    return ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def closed_port() -> int:
    """A port on 127.0.0.1 nothing listens on (a registry that cannot be reached)."""
    return _free_port()


@dataclass
class Registry:
    """A running registry: its address (``127.0.0.1:PORT``) and, with auth, its one user."""

    address: str
    process: subprocess.Popen[bytes]
    username: str = ""
    password: str = ""

    def reference(self, name: str) -> str:
        """``name`` (``repo:tag``) as served by this registry."""
        return f"{self.address}/{name}"

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        """The registry stops answering (SIGSTOP) inside the block: its port
        still accepts connections, so a pull hangs rather than fails."""
        os.kill(self.process.pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(self.process.pid, signal.SIGCONT)


def _answers(address: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{address}/v2/", timeout=2):
            return True
    except urllib.error.HTTPError as e:
        return e.code == 401  # behind auth: up, and asking for credentials
    except OSError:
        return False


@contextlib.contextmanager
def run_registry(directory: Path, *, username: str = "", password: str = "") -> Iterator[Registry]:
    """Starts a registry storing under ``directory``, with basic auth when
    ``username`` is given; stops it on leaving."""
    # Never skipped for want of it: the image tests need the real thing.
    missing = registry_missing()
    if missing:
        raise RuntimeError(missing)
    directory.mkdir(parents=True, exist_ok=True)
    address = f"127.0.0.1:{_free_port()}"
    auth = ""
    if username:
        htpasswd = directory / "htpasswd"
        subprocess.run(
            [HTPASSWD_BINARY, "-Bbc", str(htpasswd), username, password], check=True, capture_output=True
        )
        auth = f"auth:\n  htpasswd:\n    realm: sandboxd-test\n    path: {htpasswd}\n"
    config = directory / "config.yml"
    config.write_text(
        "version: 0.1\n"
        "log:\n  level: error\n"
        f"storage:\n  filesystem:\n    rootdirectory: {directory / 'data'}\n  delete:\n    enabled: true\n"
        f"http:\n  addr: {address}\n" + auth
    )
    with (directory / "registry.log").open("wb") as log:
        process = subprocess.Popen([REGISTRY_BINARY, "serve", str(config)], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + _START_SECONDS
        while not _answers(address):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"registry did not start: {(directory / 'registry.log').read_text(errors='replace')}"
                )
            time.sleep(0.05)
        yield Registry(address, process, username, password)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
