"""rLLM's ``Sandbox`` Protocol (rllm-org/rllm ``rllm/sandbox/protocol.py``)
over a leased sandboxd sandbox, with the meanings of rLLM's Docker backend:
``exec`` runs ``bash -c command`` and returns stdout, raising RuntimeError
on a non-zero exit (so rLLM's ``_safe_exec`` turns it into text);
``upload_file(local_path, remote_path)`` and ``upload_dir`` copy host files
in; ``close`` destroys; ``is_alive`` never raises. A sandbox lost under a
command raises ``sandboxd.errors.SandboxLost`` instead: that is the
infrastructure's failure, not the command's.

    sb = SandboxdSandbox("task-17", pool="swe", target="127.0.0.1:50051")
    print(sb.exec("python3 -V"))
    sb.close()

Warm sandboxes come from the pool, so rLLM's own warm queue is not needed.
"""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sandboxd import errors
from sandboxd.client import Client
from sandboxd.v1 import common_pb2

__all__ = ["CommandFailed", "SandboxdSandbox", "create_sandboxd_sandbox"]

_SMALL_UPLOAD = 16 << 20
# rLLM's user names -> sandboxd's: only root and the sandbox's own user exist.
DEFAULT_USERS: Mapping[str, str] = {"root": "root", "0": "root"}
_TAIL = 600


class CommandFailed(RuntimeError):
    """A command exited non-zero or did not exit by itself (RuntimeError, as rLLM's Docker backend raises)."""

    def __init__(self, message: str, *, exit_code: int, stdout: str, stderr: str, outcome: str) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.stdout = stdout
        self.stderr = stderr
        self.outcome = outcome


class SandboxdSandbox:
    """rLLM's ``Sandbox`` over one sandboxd lease (leased on construction)."""

    def __init__(
        self,
        name: str,
        image: str = "",
        *,
        pool: str,
        target: str = "127.0.0.1:50051",
        token: str | None = None,
        client: Client | None = None,
        labels: dict[str, str] | None = None,
        lease_ttl: float = 600.0,
        acquire_timeout: float = 300.0,
        default_timeout: float = 3600.0,
        users: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> None:
        """``image`` is rLLM's (recorded; the pool decides what runs).
        ``default_timeout`` bounds a call that gives none: rLLM's Docker
        backend has no per-call limit, sandboxd always kills at one.
        ``users`` maps rLLM user names to sandboxd's ("root" = uid 0 without
        capabilities, "" = the sandbox's own user, which uploads run as):
        root cannot chmod or edit what the sandbox's user owns, so code
        that uploads files and then changes them as root (rLLM's oracle)
        wants ``users={"root": ""}``, an explicit choice."""
        self.name = name
        self.image = image
        self.default_timeout = default_timeout
        self._users = dict(DEFAULT_USERS if users is None else users)
        self._own_client = client is None
        self._client = client if client is not None else Client(target, token=token)
        self._held: Any = self._client.acquire(
            pool,
            labels={"rllm.name": name[:256], **(labels or {})},
            lease_ttl=lease_ttl,
            timeout=acquire_timeout,
        )
        try:
            self._sandbox: Any = self._held.__enter__()
        except BaseException:
            self._held = None
            self._close_client()
            raise
        self.sandbox_id: str = self._sandbox.id

    def exec(self, command: str, timeout: float | None = None, user: str | None = None) -> str:
        """Runs ``bash -c command`` (as ``user``: None = the sandbox's own,
        "root" = uid 0 without capabilities) and returns its stdout."""
        who = "" if user is None else self._users.get(user)
        if who is None:
            raise CommandFailed(
                f"Command failed in sandbox {self.name}: unable to find user {user}: "
                "a sandboxd sandbox has its own user and root only",
                exit_code=126,
                stdout="",
                stderr="",
                outcome="EXITED",
            )
        limit = float(timeout) if timeout else self.default_timeout
        # A shell command is run by bash, as `bash -c command`.
        r = self._sandbox.exec(command, timeout=limit, user=who)
        stdout, stderr = r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace")
        if r.outcome == "SANDBOX_LOST":
            raise errors.SandboxLost(f"sandbox {self.name} was lost under {command[:200]!r}: {r.detail}")
        if r.outcome == "TIMED_OUT":
            raise CommandFailed(
                f"Command timed out after {limit:g}s in sandbox {self.name}: {command}",
                exit_code=-1,
                stdout=stdout,
                stderr=stderr,
                outcome=r.outcome,
            )
        if r.outcome != "EXITED" or r.exit_code != 0:
            why = f"exit {r.exit_code}" if r.outcome == "EXITED" else f"{r.outcome}: {r.detail}"
            raise CommandFailed(
                f"Command failed ({why}) in sandbox {self.name}: {command}\n"
                f"stderr (tail):\n{stderr[-_TAIL:]}",
                exit_code=r.exit_code,
                stdout=stdout,
                stderr=stderr,
                outcome=r.outcome,
            )
        return str(stdout)

    def upload_file(self, local_path: str, remote_path: str) -> None:
        """Copies the host file ``local_path`` to ``remote_path`` (its mode kept)."""
        path = Path(local_path)
        data, mode = path.read_bytes(), path.stat().st_mode & 0o777
        if len(data) <= _SMALL_UPLOAD:
            self._sandbox.write_file(remote_path, data, mode)
            return
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.add(local_path, arcname=os.path.basename(remote_path))
        self._sandbox.upload_dir(buf.getvalue(), os.path.dirname(remote_path) or ".")

    def upload_dir(self, local_path: str, remote_path: str) -> None:
        """Copies the host directory ``local_path`` so its contents are at ``remote_path``."""
        self._sandbox.upload_dir(local_path, remote_path.rstrip("/") or "/")

    def is_alive(self) -> bool:
        """Whether the sandbox is still leased to us; False on any error."""
        try:
            info = self._client.get_sandbox(self.sandbox_id)
        except Exception:
            return False
        return (
            self._held is not None
            and info.state == common_pb2.SANDBOX_STATE_LEASED
            and info.lease_id == self._sandbox.lease_id
        )

    def close(self) -> None:
        """Releases (destroys) the sandbox; idempotent, never raises for a gone one.
        A release the server cannot answer at once is retried (sandboxd.client.releasing),
        not left to the lease's TTL."""
        held, self._held = self._held, None
        try:
            if held is not None:
                held.__exit__(None, None, None)
        finally:
            self._close_client()

    def _close_client(self) -> None:
        if self._own_client:
            self._own_client = False
            self._client.close()


def create_sandboxd_sandbox(name: str, image: str = "", **kwargs: Any) -> SandboxdSandbox:
    """Factory in the shape of rLLM's ``create_docker_sandbox``."""
    return SandboxdSandbox(name=name, image=image, **kwargs)
