"""One Prime sandbox as this server keeps it (a sandboxd lease once RUNNING)
and its JSON form as the SDK reads it."""

from __future__ import annotations

import asyncio
import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from sandboxd.client import Lease

__all__ = ["TERMINAL", "PrimeSandbox", "iso", "utc_now"]

TERMINAL = ("TERMINATED", "ERROR", "TIMEOUT")
"""The statuses a sandbox ends in."""


def utc_now() -> dt.datetime:
    """The current time, timezone-aware UTC."""
    return dt.datetime.now(dt.UTC)


def iso(t: dt.datetime | None) -> str | None:
    """``t`` as the SDK's ISO 8601 (``...Z``), or None."""
    return None if t is None else t.isoformat().replace("+00:00", "Z")


@dataclass
class PrimeSandbox:
    """One Prime sandbox: a sandboxd lease once RUNNING."""

    id: str
    name: str
    image: str
    cpu_cores: float
    memory_gb: float
    disk_size_gb: float
    timeout_minutes: int
    idle_timeout_minutes: int | None
    env: dict[str, str]
    shown_env: dict[str, str]
    labels: list[str]
    token: str
    created_at: dt.datetime = field(default_factory=utc_now)
    updated_at: dt.datetime = field(default_factory=utc_now)
    started_at: dt.datetime | None = None
    terminated_at: dt.datetime | None = None
    status: str = "PENDING"
    error_type: str | None = None
    error_message: str | None = None
    termination_reason: str | None = None
    lease: Lease | None = None
    sandbox: str = ""
    """sandboxd's id of the leased sandbox."""
    ends_at: float | None = None
    """Monotonic end of its lifetime (timeout_minutes after RUNNING)."""
    last_active: float = 0.0
    task: asyncio.Task[None] | None = None

    def to_json(self) -> dict[str, Any]:
        """The sandbox as the SDK's ``Sandbox`` model reads it."""
        return {
            "id": self.id,
            "name": self.name,
            "dockerImage": self.image,
            "startCommand": None,
            "cpuCores": self.cpu_cores,
            "memoryGB": self.memory_gb,
            "diskSizeGB": self.disk_size_gb,
            "diskMountPath": "/workspace",
            "gpuCount": 0,
            "gpuType": None,
            "vm": False,
            "networkAllowlist": None,
            "networkDenylist": None,
            "status": self.status,
            "timeoutMinutes": self.timeout_minutes,
            "idleTimeoutMinutes": self.idle_timeout_minutes,
            "terminationReason": self.termination_reason,
            "environmentVars": self.shown_env or None,
            "labels": self.labels,
            "createdAt": iso(self.created_at),
            "updatedAt": iso(self.updated_at),
            "startedAt": iso(self.started_at),
            "terminatedAt": iso(self.terminated_at),
            "errorType": self.error_type,
            "errorMessage": self.error_message,
            "sandboxdSandboxId": self.sandbox or None,
        }

    def finish(self, status: str, error_type: str | None = None, message: str | None = None) -> None:
        """Marks it ended with ``status`` (a terminal one), unless it already is."""
        if self.status in TERMINAL:
            return
        self.status, self.error_type, self.error_message = status, error_type, message
        self.terminated_at = self.updated_at = utc_now()
