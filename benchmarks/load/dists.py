"""Seeded, bounded random distributions for episode shapes.

A distribution is written in a profile as an inline table::

    turns = { dist = "lognormal", median = 6, sigma = 0.9, min = 1, max = 60 }
    think_seconds = { dist = "pareto", scale = 0.2, alpha = 1.6, max = 8.0 }
    execs_per_turn = { dist = "uniform", min = 1, max = 3 }
    files_per_turn = 1                      # a bare number is a constant

Every draw is clamped to ``[min, max]`` (the long tails stay bounded) and
rounded when the distribution is an integer count. Draws come from a
``random.Random`` the caller seeds, so a plan is the same in every run.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from typing import Any

KINDS = ("constant", "uniform", "lognormal", "pareto", "exponential")


class ProfileError(ValueError):
    """A profile (or one of its distributions) is malformed; the message names the key."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where}: {problem}")
        self.where = where
        self.problem = problem


@dataclass(frozen=True)
class Dist:
    kind: str
    a: float = 0.0
    """constant: the value; uniform: low; lognormal: median; pareto: scale (x_m); exponential: mean."""
    b: float = 0.0
    """lognormal: sigma; pareto: alpha; unused otherwise."""
    lo: float = 0.0
    hi: float = math.inf
    integer: bool = False

    def sample(self, rng: random.Random) -> float:
        if self.kind == "constant":
            x = self.a
        elif self.kind == "uniform":
            x = rng.randint(int(self.lo), int(self.hi)) if self.integer else rng.uniform(self.lo, self.hi)
        elif self.kind == "lognormal":
            x = rng.lognormvariate(math.log(self.a), self.b)
        elif self.kind == "pareto":
            x = self.a * rng.paretovariate(self.b)
        else:  # exponential
            x = rng.expovariate(1.0 / self.a)
        x = min(max(x, self.lo), self.hi)
        return float(round(x)) if self.integer else x

    def sample_int(self, rng: random.Random) -> int:
        return round(self.sample(rng))

    def mean_estimate(self) -> float:
        """The unbounded mean (ignores clamping): for sizing runs in messages."""
        if self.kind == "constant":
            return self.a
        if self.kind == "uniform":
            return (self.lo + self.hi) / 2
        if self.kind == "lognormal":
            return self.a * math.exp(self.b**2 / 2)
        if self.kind == "pareto":
            return self.a * self.b / (self.b - 1) if self.b > 1 else math.inf
        return self.a

    def scaled(self, factor: float) -> Dist:
        """The same shape with every value multiplied by factor (not for counts)."""
        hi = self.hi * factor if math.isfinite(self.hi) else self.hi
        if self.kind == "uniform":
            return Dist(self.kind, lo=self.lo * factor, hi=hi, integer=self.integer)
        return Dist(self.kind, self.a * factor, self.b, self.lo * factor, hi, self.integer)


def _number(where: str, table: dict[str, Any], key: str, *, positive: bool = False) -> float:
    if key not in table:
        raise ProfileError(where, f"missing {key!r}")
    value = table[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ProfileError(f"{where}.{key}", f"must be a number, not {value!r}")
    if not math.isfinite(value) or value < 0 or (positive and value <= 0):
        raise ProfileError(f"{where}.{key}", f"must be {'> 0' if positive else '>= 0'}, not {value!r}")
    return float(value)


def parse_dist(where: str, value: Any, *, integer: bool = False, upper: float = math.inf) -> Dist:
    """A Dist from a profile value; ``upper`` is a hard cap the profile may not exceed."""
    if isinstance(value, bool):
        raise ProfileError(where, f"must be a number or a distribution table, not {value!r}")
    if isinstance(value, int | float):
        table: dict[str, Any] = {"dist": "constant", "value": value}
    elif isinstance(value, dict):
        table = dict(value)
    else:
        raise ProfileError(where, f"must be a number or a distribution table, not {value!r}")
    kind = table.pop("dist", None)
    if kind not in KINDS:
        raise ProfileError(f"{where}.dist", f"must be one of {', '.join(KINDS)}, not {kind!r}")
    allowed = {
        "constant": {"value"},
        "uniform": {"min", "max"},
        "lognormal": {"median", "sigma", "min", "max"},
        "pareto": {"scale", "alpha", "min", "max"},
        "exponential": {"mean", "min", "max"},
    }[kind]
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise ProfileError(where, f"unknown key(s) {', '.join(unknown)} for dist {kind!r}")
    lo = _number(where, table, "min") if "min" in table else 0.0
    hi = _number(where, table, "max") if "max" in table else math.inf
    if kind == "constant":
        a = _number(where, table, "value")
        dist = Dist(kind, a, lo=a, hi=a, integer=integer)
    elif kind == "uniform":
        lo, hi = _number(where, table, "min"), _number(where, table, "max")
        dist = Dist(kind, lo=lo, hi=hi, integer=integer)
    elif kind == "lognormal":
        dist = Dist(
            kind,
            _number(where, table, "median", positive=True),
            _number(where, table, "sigma"),
            lo,
            hi,
            integer,
        )
    elif kind == "pareto":
        alpha = _number(where, table, "alpha", positive=True)
        dist = Dist(kind, _number(where, table, "scale", positive=True), alpha, lo, hi, integer)
    else:
        dist = Dist(kind, _number(where, table, "mean", positive=True), 0.0, lo, hi, integer)
    if not math.isfinite(dist.hi):
        dist = replace(dist, hi=upper)
    if dist.lo > dist.hi:
        raise ProfileError(where, f"min {dist.lo:g} is above max {dist.hi:g}")
    if dist.hi > upper:
        raise ProfileError(where, f"max must be bounded by {upper:g} (got {dist.hi:g})")
    if integer and dist.hi < 0:
        raise ProfileError(where, "counts cannot be negative")
    return dist
