"""The ``/run_code`` request body: validated as SandboxFusion's FastAPI model
(pydantic's lax mode) would, with its defaults, or the 422 error list."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from sandboxd.adapters.sandboxfusion_langs import LANGUAGE_NAMES

__all__ = ["RunCodeArgs", "parse_request"]


@dataclass
class RunCodeArgs:
    """A validated ``/run_code`` body, with SandboxFusion's defaults."""

    code: str
    language: str
    compile_timeout: float = 10.0
    run_timeout: float = 10.0
    memory_limit_MB: int = -1
    stdin: str | None = None
    files: dict[str, str] = field(default_factory=dict)
    fetch_files: list[str] = field(default_factory=list)


def _error(loc: str, msg: str, kind: str) -> dict[str, Any]:
    return {"loc": ["body", loc], "msg": msg, "type": kind}


def _number(value: Any) -> float | None:
    # pydantic's lax mode: numbers and numeric strings, never booleans.
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def parse_request(body: Any) -> RunCodeArgs | list[dict[str, Any]]:
    """The request, or the pydantic-style error list that FastAPI would answer 422 with."""
    if not isinstance(body, dict):
        return [{"loc": ["body"], "msg": "Input should be a valid dictionary", "type": "dict_type"}]
    problems: list[dict[str, Any]] = []
    code, language = body.get("code"), body.get("language")
    if not isinstance(code, str):
        problems.append(
            _error(
                "code",
                "Field required" if code is None else "Input should be a valid string",
                "missing" if code is None else "string_type",
            )
        )
    if language not in LANGUAGE_NAMES:
        problems.append(
            _error("language", f"Input should be one of {', '.join(LANGUAGE_NAMES)}", "literal_error")
        )
    args = RunCodeArgs(code=code if isinstance(code, str) else "", language=str(language))
    for name in ("compile_timeout", "run_timeout"):
        if name in body:
            number = _number(body[name])
            if number is None or not math.isfinite(number):
                problems.append(_error(name, "Input should be a valid number", "float_parsing"))
            else:
                setattr(args, name, number)
    if "memory_limit_MB" in body:
        mem = _number(body["memory_limit_MB"])
        if mem is None or not mem.is_integer():
            problems.append(_error("memory_limit_MB", "Input should be a valid integer", "int_parsing"))
        else:
            args.memory_limit_MB = int(mem)
    stdin = body.get("stdin")
    if stdin is not None and not isinstance(stdin, str):
        problems.append(_error("stdin", "Input should be a valid string", "string_type"))
    args.stdin = stdin if isinstance(stdin, str) else None
    files = body.get("files", {})
    if not isinstance(files, dict) or not all(isinstance(v, str | None) for v in files.values()):
        problems.append(_error("files", "Input should map names to base64 strings or null", "dict_type"))
    else:
        # A null entry is skipped, as SandboxFusion's restore_files does.
        args.files = {k: v for k, v in files.items() if isinstance(v, str)}
    fetch = body.get("fetch_files", [])
    if not isinstance(fetch, list) or not all(isinstance(f, str) for f in fetch):
        problems.append(_error("fetch_files", "Input should be a valid list of strings", "list_type"))
    else:
        args.fetch_files = fetch
    return problems or args
