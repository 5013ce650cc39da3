"""A versitygw (the Versity S3 Gateway) serving a temporary directory on
127.0.0.1 for the tests that need an S3-compatible server. Object metadata
(ETags, which multipart uploads need) is kept in a sidecar directory, so the
filesystem needs no extended attributes."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

ACCESS, SECRET = "sandboxd-test", "sandboxd-test-secret"


def versitygw_binary() -> str:
    found = shutil.which("versitygw")
    gopath = os.environ.get("GOPATH") or str(Path.home() / "go")
    candidate = Path(gopath) / "bin" / "versitygw"
    if found:
        return found
    if candidate.exists():
        return str(candidate)
    raise AssertionError("versitygw not found: run scripts/setup.sh (it builds it with `go install`)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def serve(where: Path) -> Iterator[str]:
    """A gateway over ``where``/s3 (metadata in ``where``/sidecar) until the
    block ends; yields its endpoint."""
    root, meta = where / "s3", where / "sidecar"
    root.mkdir()
    meta.mkdir()
    port = free_port()
    log_path = where / "versitygw.log"
    log = log_path.open("wb")
    proc = subprocess.Popen(
        [versitygw_binary(), "--access", ACCESS, "--secret", SECRET, "--port", f"127.0.0.1:{port}",
         "--quiet", "posix", "--sidecar", str(meta), str(root)],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        for _ in range(400):  # up to ~20 s for the port to accept
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.05).close()
                break
            except OSError as e:
                if proc.poll() is not None:
                    raise AssertionError(f"versitygw exited: {log_path.read_text()}") from e
                time.sleep(0.05)  # a pause between polls of another process's port
        else:
            raise AssertionError("versitygw did not start listening")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()
