"""Deadline policy, in one place: how much of a caller's deadline a call may
spend so that its answer still arrives in time. The API layer passes the
client's remaining time through untouched; only the core trims it."""

from __future__ import annotations

ACQUIRE_MARGIN_SECONDS = 0.05
"""An Acquire answers this long before the caller's deadline, so the answer
(sandboxes, or DEADLINE_EXCEEDED with nothing leased) arrives in time."""

EXEC_MARGIN_SECONDS = 0.1
"""An exec cut by the caller's deadline ends this long before it: the command
is killed by us (tree and all) and reported as TIMED_OUT in time."""

EXEC_FLOOR_SECONDS = 0.01
"""The shortest an exec cut by the deadline is given."""


def within_deadline(wanted: float, call_remaining: float | None, margin: float, floor: float = 0.0) -> float:
    """``wanted`` seconds, cut to end ``margin`` seconds before the caller's
    deadline (``call_remaining`` seconds away; None = no deadline), never below ``floor``."""
    if call_remaining is None or call_remaining - margin >= wanted:
        return wanted
    return max(floor, call_remaining - margin)
