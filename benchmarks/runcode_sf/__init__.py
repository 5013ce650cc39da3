"""SandboxFusion's own tests, replayed against a ``/run_code`` endpoint.

``ported/`` holds SandboxFusion's runner tests (sandbox/tests/runners/) and the
dataset tests that post to ``/run_code`` (sandbox/tests/datasets/test_utils.py,
test_antihack.py), with their requests and assertions as SandboxFusion wrote
them. Left out, each for a reason run-code cannot change:

- test_cuda.py, test_python_gpu.py: need a GPU (``cuda``, ``python_gpu``);
  run-code answers them SandboxError, as a CPU-only SandboxFusion does.
- test_jupyter.py: ``/run_jupyter``, an endpoint run-code does not serve.
- the other dataset tests (test_mbpp.py, test_multiple.py, ...): they call
  ``/submit`` and ``/get_prompts`` of SandboxFusion's dataset service, which
  run-code does not serve, not ``/run_code``.

``test_isolation_network_external_access`` is kept but listed in
:data:`NEEDS_NETWORK`: it asks for the internet, which a sandbox without a
network cannot reach.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import pkgutil
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from benchmarks.runcode_sf import ported
from benchmarks.runcode_sf.shim import client, set_endpoint

__all__ = ["NEEDS_NETWORK", "Case", "Outcome", "cases", "replay", "run_case", "set_endpoint", "suite_report"]

NEEDS_NETWORK = frozenset({"sf_isolation::test_isolation_network_external_access"})
"""Cases that reach the internet: run-code's sandboxes have no network."""


@dataclass(frozen=True)
class Case:
    """One of SandboxFusion's test functions."""

    name: str
    """``module::function``."""
    func: Callable[[], Any]


@dataclass(frozen=True)
class Outcome:
    name: str
    passed: bool
    error: str = ""
    timed_out: bool = False
    """Some compile or run of the case ran out of its time limit (on a host short of
    CPU, a case may fail for that alone)."""


def _timed_out(answers: list[Any]) -> bool:
    for answer in answers:
        if isinstance(answer, dict):
            for key in ("compile_result", "run_result"):
                result = answer.get(key)
                if isinstance(result, dict) and result.get("status") == "TimeLimitExceeded":
                    return True
    return False


def cases() -> list[Case]:
    """Every ported test function, in file then source order."""
    found: list[Case] = []
    for info in sorted(pkgutil.iter_modules(ported.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{ported.__name__}.{info.name}")
        funcs = [
            f
            for n, f in vars(module).items()
            if n.startswith("test_") and inspect.isfunction(f) and f.__module__ == module.__name__
        ]
        funcs.sort(key=lambda f: f.__code__.co_firstlineno)
        found += [Case(f"{info.name}::{f.__name__}", f) for f in funcs]
    return found


def run_case(case: Case) -> Outcome:
    """Runs one case to its end in this thread (an async one in its own loop)."""
    client.forget()
    try:
        result = case.func()
        if inspect.iscoroutine(result):
            asyncio.run(result)
    except Exception as e:
        where = traceback.extract_tb(e.__traceback__)[-1]
        what = "".join(traceback.format_exception_only(e)).strip()
        error = f"line {where.lineno}: {where.line}: {what}"[-2000:]
        return Outcome(case.name, False, error, _timed_out(client.answers()))
    return Outcome(case.name, True)


async def replay(selected: Iterable[Case], concurrency: int) -> list[Outcome]:
    """Runs ``selected`` against the endpoint, ``concurrency`` at once, each in a thread."""
    gate = asyncio.Semaphore(concurrency)

    async def one(case: Case) -> Outcome:
        async with gate:
            return await asyncio.to_thread(run_case, case)

    return list(await asyncio.gather(*(one(c) for c in selected)))


async def suite_report(url: str, concurrency: int = 8) -> dict[str, Any]:
    """Replays every case against the ``/run_code`` server at ``url``, one at a time and
    then ``concurrency`` at once: how many pass each way, and which fail."""
    set_endpoint(url)
    selected = cases()
    sequential = await replay(selected, 1)
    concurrent = await replay(selected, concurrency)
    return {
        "sf_suite_total": len(selected),
        "sf_suite_passed": sum(o.passed for o in sequential),
        f"sf_suite_passed_at_{concurrency}": sum(o.passed for o in concurrent),
        "sf_suite_failed": sorted(o.name for o in sequential if not o.passed),
        f"sf_suite_failed_at_{concurrency}": sorted(o.name for o in concurrent if not o.passed),
        f"sf_suite_timed_out_at_{concurrency}": sum(o.timed_out for o in concurrent if not o.passed),
    }
