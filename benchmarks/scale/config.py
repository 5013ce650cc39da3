"""The scene's shape and time bounds, and the turns every trajectory runs."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Scene:
    rollouts: int = 960
    group: int = 8
    turns: int = 3
    warm_bound_s: float = 180.0
    """Longest the Prewarm waits (its own deadline)."""
    acquire_timeout_s: float = 150.0
    exec_timeout_s: float = 30.0
    step_bound_s: float = 240.0
    """The step's bound: every acquire, turn and release has a deadline inside it."""
    naive_bound_s: float = 180.0
    """The naive burst's bound; rollouts unfinished then count as errors."""
    teardown_bound_s: float = 90.0
    """Longest the pool's deletion and the server's stop may take each."""

    @classmethod
    def quick(cls, rollouts: int = 48, group: int = 8) -> Scene:
        return cls(
            rollouts=rollouts, group=group, warm_bound_s=60.0, acquire_timeout_s=60.0,
            step_bound_s=90.0, naive_bound_s=90.0, teardown_bound_s=60.0,
        )  # fmt: skip

    def sized(self, rollouts: int, group: int) -> Scene:
        return replace(self, rollouts=rollouts, group=group)


PRINT_TURN = "python3 -c \"import os; print(os.environ['TURN'])\""


def turn_command(turn: int, *, session: bool) -> str:
    """Turn ``turn`` of a trajectory: a short Python process printing the turn's
    number. In a session the number comes from the session's state (a counter
    the earlier turns exported), so a turn that ran anywhere but in its
    sandbox's own session prints the wrong one; without sessions (the naive
    baseline) it is passed in."""
    if session:
        return f"export TURN=$(( ${{TURN:-0}} + 1 )); {PRINT_TURN}"
    return f"TURN={turn} {PRINT_TURN}"
