"""MkDocs hook: tables the documentation takes from the code at build time.

A page asks for one with a marker line, ``<!-- generated: NAME -->``; the
hook replaces it with the table, so the page shows what the code does now:

- ``lifecycle-transitions``: every edge of the sandbox state machine with its
  reason (``sandboxd.core.lifecycle.TRANSITIONS``);
- ``error-status``: which gRPC status each error of sandboxd's tree answers
  (``sandboxd.api.errors.STATUS_OF``), with the error's docstring;
- ``isolation-results``: the committed ``benchmarks/results/isolation.json``,
  runc beside gVisor (and gVisor without the keeper, and a writable root),
  so the page quotes the run that is committed.

A marker naming no table is logged as a warning, which fails the strict build.
"""

from __future__ import annotations

import inspect
import json
import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger("mkdocs.hooks.code_tables")

_MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.M)


def lifecycle_transitions() -> str:
    """The sandbox lifecycle's transition table."""
    from sandboxd.core.lifecycle import TRANSITIONS

    rows = ["| from | to | when |", "|---|---|---|"]
    rows += [f"| `{a.name}` | `{b.name}` | {why} |" for (a, b), why in TRANSITIONS.items()]
    return "\n".join(rows)


def error_status() -> str:
    """The error tree's gRPC status codes, most specific first."""
    from sandboxd.api.errors import STATUS_OF

    rows = ["| error (`sandboxd.errors`) | gRPC status | meaning |", "|---|---|---|"]
    for cls, code in STATUS_OF:
        doc = " ".join((inspect.getdoc(cls) or "").split()).replace("|", "\\|")
        rows.append(f"| `{cls.__name__}` | `{code.name}` | {doc} |")
    rows.append("| anything else | `INTERNAL` | a bug: the message names the server's log line (ref) |")
    return "\n".join(rows)


_RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"

_ISOLATION_ROWS = [
    ("create_start", "sandbox create + start (the backend's create: container and health check)"),
    ("warm_acquire", "warm Acquire"),
    ("session_exec", "session exec `true` round trip"),
    ("session_exec_backend", "the same through the backend alone (no RPC)"),
    ("file_creates", "2,000 empty files created and removed"),
    ("python_tests", "40-test `python3 -m unittest` run"),
    ("snapshot_50mb", "snapshot of a 50 MB workspace (through the sandbox)"),
]
# Keys ``<metric>_<runtime><suffix>_ms``; runs from before the writable
# root was measured have none of them.
_WRITABLE_ROWS = [
    ("create_start", "_writable", 'create + start, writable root (`root="writable"`)'),
    ("root_write_50mb", "", "50 MB written by one shell into the workspace (read-only root)"),
    ("root_write_50mb", "_writable", "the same into `/var/tmp` of a writable root"),
]


def isolation_results() -> str:
    """The committed isolation benchmark: medians in ms, runc beside gVisor."""
    d = json.loads((_RESULTS / "isolation.json").read_text())
    host = d.get("host", {})
    rows = [
        f"Committed run: medians of {d['repeat']}, ms, {host.get('cpus', '?')} cores, "
        f"1-minute load {host.get('load_1m', 0):.0f}.",
        "",
        "| measured | runc | gVisor | ratio |",
        "|---|---|---|---|",
    ]
    for key, label in _ISOLATION_ROWS:
        rows.append(f"| {label} | {d[key + '_runc_ms']} | {d[key + '_gvisor_ms']} | {d[key + '_ratio']}x |")
    if "create_start_gvisor_nokeeper_ms" in d:
        rows.append(
            f"| create + start, gVisor without the keeper | {d['create_start_runc_ms']} | "
            f"{d['create_start_gvisor_nokeeper_ms']} | {d['create_start_nokeeper_ratio']}x |"
        )
    for metric, suffix, label in _WRITABLE_ROWS:
        if f"{metric}_runc{suffix}_ms" in d:
            runc, gvisor = d[f"{metric}_runc{suffix}_ms"], d[f"{metric}_gvisor{suffix}_ms"]
            rows.append(f"| {label} | {runc} | {gvisor} | {round(gvisor / max(runc, 0.1), 2)}x |")
    return "\n".join(rows)


TABLES: dict[str, Callable[[], str]] = {
    "lifecycle-transitions": lifecycle_transitions,
    "error-status": error_status,
    "isolation-results": isolation_results,
}


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Replace each marker with its table."""

    def table(match: re.Match[str]) -> str:
        make = TABLES.get(match[1])
        if make is None:
            log.warning("%s: no generated table named %r", page.file.src_uri, match[1])
            return match[0]
        return make()

    return _MARKER.sub(table, markdown)
