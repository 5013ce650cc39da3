"""A mini-swe-agent environment (PyPI ``mini-swe-agent``) backed by a sandboxd
sandbox, keeping the meaning of its ``DockerEnvironment``: each action is a
fresh ``bash -lc`` process (nothing carries over between actions), stdout
and stderr come back merged as ``output``, a timeout answers returncode -1
with ``exception_info``, and ``COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`` raises
mini-swe-agent's ``Submitted``. Select it in a config by class path::

    environment:
      environment_class: sandboxd.adapters.miniswe.SandboxdEnvironment
      target: 127.0.0.1:50051
      pool: swe
      cwd: /workspace

The sandbox is leased when the environment is made and released by
``cleanup()`` (also on garbage collection, as mini-swe-agent's own).
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
from dataclasses import asdict, dataclass, field
from typing import Any

from sandboxd import errors
from sandboxd.client import Client

__all__ = ["SandboxdEnvironment", "SandboxdEnvironmentConfig"]

_SUBMIT = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
# Runs the interpreter with stderr on stdout (one pipe, so the order of the
# output is the command's, as DockerEnvironment's stderr=STDOUT gives it),
# without touching the command's own text: nothing of this shows in output.
_MERGED = ("sh", "-c", 'exec "$@" 2>&1', "sh")


@dataclass
class SandboxdEnvironmentConfig:
    """The environment's settings, as mini-swe-agent's config files give them."""

    pool: str
    """The sandboxd pool to lease from."""
    image: str = ""
    """The task's image (what ``DockerEnvironment``'s ``image`` is: mini-swe-agent's
    SWE-bench runner sets it per instance); empty = the pool's own. The pool
    must serve it (its spec.images, ``["*"]`` for any); it is pulled when absent."""
    target: str = "127.0.0.1:50051"
    """The sandboxd server."""
    token: str | None = None
    """Tenant bearer token, when the server requires one."""
    cwd: str = ""
    """Working directory of each action; empty = the sandbox's (/workspace)."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment variables set for every action."""
    forward_env: list[str] = field(default_factory=list)
    """Host variables copied into every action when set (``env`` wins)."""
    timeout: int = 30
    """Seconds an action may run; its whole process tree is killed then."""
    interpreter: list[str] = field(default_factory=lambda: ["bash", "-lc"])
    """Program and flags the command is appended to."""
    labels: dict[str, str] = field(default_factory=dict)
    """Labels of the lease (run, task, ...)."""
    lease_ttl: float = 600.0
    acquire_timeout: float = 300.0

    def model_dump(self, mode: str = "python") -> dict[str, Any]:
        """The settings as a dict (mini-swe-agent's name), token left out."""
        data = asdict(self)
        data.pop("token")
        return data


class SandboxdEnvironment:
    """mini-swe-agent's ``Environment`` over one leased sandboxd sandbox."""

    def __init__(
        self,
        *,
        config_class: type = SandboxdEnvironmentConfig,
        logger: logging.Logger | None = None,
        client: Client | None = None,
        **kwargs: Any,
    ) -> None:
        """Keyword arguments are the config's; ``client`` shares a blocking
        sandboxd client (one is opened and closed here otherwise)."""
        self.logger = logger or logging.getLogger("minisweagent.environment")
        self.config: SandboxdEnvironmentConfig = config_class(**kwargs)
        self._own_client = client is None
        self._client = client if client is not None else Client(self.config.target, token=self.config.token)
        self._held: Any = self._client.acquire(
            self.config.pool,
            image=self.config.image,
            labels=self.config.labels,
            lease_ttl=self.config.lease_ttl,
            timeout=self.config.acquire_timeout,
        )
        try:
            self.sandbox: Any = self._held.__enter__()
        except BaseException:
            self._held = None
            self._close_client()
            raise
        self.sandbox_id: str = self.sandbox.id
        self._uname: dict[str, str] | None = None

    def execute(self, action: dict[str, Any], cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        """Runs ``action["command"]``; returns output, returncode, exception_info."""
        command = action.get("command", "")
        limit = timeout or self.config.timeout
        env = {k: v for k in self.config.forward_env if (v := os.getenv(k)) is not None}
        env.update(self.config.env)
        chunks: list[bytes] = []
        try:
            result = None
            for kind, value in self.sandbox.exec_stream(
                [*_MERGED, *self.config.interpreter, command],
                cwd=cwd or self.config.cwd,
                env=env,
                timeout=float(limit),
            ):
                if kind == "result":
                    result = value
                else:
                    chunks.append(value)  # stdout and stderr in the order they came
            text = b"".join(chunks).decode("utf-8", errors="replace")
            assert result is not None
            if result.outcome == "EXITED":
                output: dict[str, Any] = {
                    "output": text,
                    "returncode": result.exit_code,
                    "exception_info": "",
                }
            elif result.outcome == "TIMED_OUT":
                output = _failed(text, subprocess.TimeoutExpired(command, limit, output=text))
            else:
                output = _failed(text, None, result.outcome, result.detail)
        except errors.SandboxdError as e:
            output = _failed(b"".join(chunks).decode("utf-8", errors="replace"), e)
        self._check_finished(output)
        return output

    def _check_finished(self, output: dict[str, Any]) -> None:
        """Raises Submitted when the output says the task is done."""
        lines = output.get("output", "").lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == _SUBMIT and output["returncode"] == 0:
            from minisweagent.exceptions import Submitted

            submission = "".join(lines[1:])
            raise Submitted(
                {
                    "role": "exit",
                    "content": submission,
                    "extra": {"exit_status": "Submitted", "submission": submission},
                }
            )

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        """The config, the sandbox's uname (system, release, ...) and ``kwargs``."""
        if self._uname is None:
            keys = ["system", "node", "release", "version", "machine"]
            r = self.sandbox.exec(
                ["sh", "-c", "uname -s; uname -n; uname -r; uname -v; uname -m"], timeout=10.0
            )
            self._uname = dict(zip(keys, r.text.splitlines(), strict=False))
        return _merge(self.config.model_dump(), self._uname, kwargs)

    def serialize(self) -> dict[str, Any]:
        """The JSON-safe config and class path, in the shape mini-swe-agent saves in trajectories."""
        return {
            "info": {
                "config": {
                    "environment": self.config.model_dump(mode="json"),
                    "environment_type": f"{self.__class__.__module__}.{self.__class__.__name__}",
                }
            }
        }

    def cleanup(self) -> None:
        """Releases the sandbox (idempotent); a release the server cannot answer
        at once is retried (sandboxd.client.releasing), not left to the lease's TTL."""
        held, self._held = getattr(self, "_held", None), None
        try:
            if held is not None:
                held.__exit__(None, None, None)
        finally:
            self._close_client()

    def _close_client(self) -> None:
        if self._own_client:
            self._own_client = False
            self._client.close()

    def __enter__(self) -> SandboxdEnvironment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.cleanup()


def _failed(text: str, e: BaseException | None, kind: str = "", detail: str = "") -> dict[str, Any]:
    """mini-swe-agent's shape for a command that did not exit by itself."""
    name = type(e).__name__ if e is not None else kind
    message = str(e) if e is not None else f"{kind}: {detail}"
    return {
        "output": text,
        "returncode": -1,
        "exception_info": f"An error occurred while executing the command: {message}",
        "extra": {"exception_type": name, "exception": message},
    }


def _merge(*dicts: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for d in dicts:
        for k, v in d.items():
            out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out
