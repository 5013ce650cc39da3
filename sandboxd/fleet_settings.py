"""The ``[fleet]`` settings section: one fleet of sandboxes shared by every
rollout run of the server, by weight (sandboxd.core.rollouts.sharing)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from sandboxd.errors import InvalidArgument


@dataclass(frozen=True)
class FleetSettings:
    """How the server's rollout runs share its sandboxes. With ``sandboxes``
    0 (the default) there is no sharing: each run is bounded by its pool alone.

        [fleet]
        sandboxes = 16
        reclaim_seconds = 30
        [fleet.weights]
        "team-a/grpo" = 2      # tenant/run; a run of the default tenant is just "run"
        "team-b/ppo" = 1
    """

    sandboxes: int = 0
    """Sandboxes the runs share (what their groups may hold at once, all together)."""
    reclaim_seconds: float = 30.0
    """Bound on giving back borrowed sandboxes: a borrower's in-flight groups
    beyond its allowance may finish until then; at the bound they are parked
    (runs with partial rollouts are parked at once) or cancelled with the
    reason "reclaimed"."""
    idle_seconds: float = 10.0
    """A run that has not asked for slots for this long wants only what it
    holds: the rest of its guarantee is lent."""
    borrowing: bool = True
    """Off: every run is held to its weight's share (static shares)."""
    weights: dict[str, float] = field(default_factory=dict)
    """Weight of each run by ``tenant/run`` (a default-tenant run by its name);
    runs not named weigh ``default_weight``."""
    default_weight: float = 1.0

    def __post_init__(self) -> None:
        if isinstance(self.sandboxes, bool) or not isinstance(self.sandboxes, int) or self.sandboxes < 0:
            raise InvalidArgument("fleet.sandboxes", f"must be a whole number >= 0, got {self.sandboxes!r}")
        for name in ("reclaim_seconds", "idle_seconds"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value <= 0
            ):
                raise InvalidArgument(f"fleet.{name}", f"must be a number of seconds > 0, got {value!r}")
        if not isinstance(self.borrowing, bool):
            raise InvalidArgument("fleet.borrowing", f"must be true or false, got {self.borrowing!r}")
        if not isinstance(self.weights, dict):
            raise InvalidArgument("fleet.weights", f"must be a table of run = weight, got {self.weights!r}")
        for key, weight in {**self.weights, "": self.default_weight}.items():
            name = f"fleet.weights.{key}" if key else "fleet.default_weight"
            if isinstance(weight, bool) or not isinstance(weight, int | float):
                raise InvalidArgument(name, f"must be a number, got {weight!r}")
            if not math.isfinite(weight) or weight <= 0:
                raise InvalidArgument(name, f"must be a finite number > 0, got {weight!r}")

    @property
    def enabled(self) -> bool:
        """Whether runs share a fleet at all."""
        return self.sandboxes > 0

    def weight(self, run_key: str) -> float:
        """The weight of the run with this internal key (``tenant/run``, or ``run``)."""
        return float(self.weights.get(run_key, self.default_weight))
