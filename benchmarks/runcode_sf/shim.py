# ruff: noqa: UP006, UP035, UP042, UP045  (SandboxFusion's models as it writes them)
"""What SandboxFusion's own tests import, pointed at a ``/run_code`` over HTTP.

The models are SandboxFusion's server models (sandbox/runners/types.py and
sandbox/server/sandbox_api.py), so a response that would not validate there
fails here too. ``client`` stands in for FastAPI's ``TestClient(app)``: a
blocking ``post`` to the endpoint set by :func:`set_endpoint`, safe from many
threads at once.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from enum import Enum
from typing import Any, Dict, List, Optional

from pydantic import BaseModel, Field

from sandboxd.adapters.sandboxfusion_langs import LANGUAGE_NAMES

# Seconds one request may take before the ported test fails (never a hang).
REQUEST_LIMIT = 180.0


class CommandRunStatus(str, Enum):
    Finished = "Finished"
    Error = "Error"
    TimeLimitExceeded = "TimeLimitExceeded"


class CommandRunResult(BaseModel):
    status: CommandRunStatus
    execution_time: Optional[float] = None
    return_code: Optional[int] = None
    stdout: Optional[str] = None
    stderr: Optional[str] = None


class RunStatus(str, Enum):
    Success = "Success"
    Failed = "Failed"
    SandboxError = "SandboxError"


class RunCodeRequest(BaseModel):
    compile_timeout: float = Field(10)
    run_timeout: float = Field(10)
    memory_limit_MB: int = Field(-1)
    code: str
    stdin: Optional[str] = None
    language: str
    files: Dict[str, Optional[str]] = Field({})
    fetch_files: List[str] = Field([])

    def model_post_init(self, _: Any) -> None:
        # SandboxFusion's ``Language`` literal: a name outside it is a test bug.
        if self.language not in LANGUAGE_NAMES:
            raise ValueError(f"language {self.language!r} is not one of SandboxFusion's")


class RunCodeResponse(BaseModel):
    status: RunStatus
    message: str
    compile_result: Optional[CommandRunResult] = None
    run_result: Optional[CommandRunResult] = None
    executor_pod_name: Optional[str] = None
    files: Dict[str, str] = {}


class Response:
    """What the ported tests read of an HTTP answer."""

    def __init__(self, status_code: int, body: bytes) -> None:
        self.status_code = status_code
        self._body = body

    def json(self) -> Any:
        return json.loads(self._body)


class Client:
    """``TestClient(app)`` over HTTP: ``post(path, json=...)``. Each thread's answers
    since its last :meth:`forget` are kept, to tell why a case failed."""

    def __init__(self) -> None:
        self.endpoint = ""
        self._seen = threading.local()

    def forget(self) -> None:
        self._seen.answers = []

    def answers(self) -> list[Any]:
        return list(getattr(self._seen, "answers", []))

    def post(self, path: str, json: Any = None) -> Response:
        if not self.endpoint:
            raise RuntimeError("no /run_code endpoint set (set_endpoint)")
        data = _json_dumps(json)
        req = urllib.request.Request(
            self.endpoint + path, data=data, headers={"Content-Type": "application/json"}, method="POST"
        )
        try:
            with urllib.request.urlopen(req, timeout=REQUEST_LIMIT) as r:
                response = Response(r.status, r.read())
        except urllib.error.HTTPError as e:
            response = Response(e.code, e.read())
        if not hasattr(self._seen, "answers"):
            self._seen.answers = []
        try:
            self._seen.answers.append(response.json())
        except ValueError:
            self._seen.answers.append(None)
        return response


def _json_dumps(value: Any) -> bytes:
    return json.dumps(value, default=lambda v: v.value if isinstance(v, Enum) else str(v)).encode()


client = Client()


def set_endpoint(url: str) -> None:
    """Points every ported test at the ``/run_code`` server at ``url``."""
    client.endpoint = url.rstrip("/")


async def run_code_in_sandbox(request: RunCodeRequest) -> RunCodeResponse:
    """SandboxFusion's sandbox.utils.sandbox_client.run_code_in_sandbox, over ``client``."""
    import asyncio

    response = await asyncio.to_thread(client.post, "/run_code", request.model_dump())
    return RunCodeResponse(**response.json())


def parse_jest_cases(report_data: str | dict[str, Any]) -> list[dict[str, Any]]:
    """SandboxFusion's sandbox.utils.testing.parse_jest_cases."""
    report = json.loads(report_data) if isinstance(report_data, str) else report_data
    cases = []
    for suite in report["testResults"]:
        for case in suite["testResults"]:
            cases.append(
                {
                    "passed": case["status"] == "passed",
                    "full_name": case["fullName"],
                    "file": suite["testFilePath"],
                    "suite": " > ".join(case["ancestorTitles"]),
                    "test": case["title"],
                    "failure_messages": case["failureMessages"],
                }
            )
    return cases
