"""MkDocs hook: tables the documentation takes from the code at build time.

A page asks for one with a marker line, ``<!-- generated: NAME -->``; the
hook replaces it with the table, so the page shows what the code does now:

- ``lifecycle-transitions``: every edge of the sandbox state machine with its
  reason (``sandboxd.core.lifecycle.TRANSITIONS``);
- ``error-status``: which gRPC status each error of sandboxd's tree answers
  (``sandboxd.api.errors.STATUS_OF``), with the error's docstring.

A marker naming no table is logged as a warning, which fails the strict build.
"""

from __future__ import annotations

import inspect
import logging
import re
from collections.abc import Callable
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


TABLES: dict[str, Callable[[], str]] = {
    "lifecycle-transitions": lifecycle_transitions,
    "error-status": error_status,
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
