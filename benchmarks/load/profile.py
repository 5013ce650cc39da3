"""Load profiles: a small TOML file per workload shape.

    name = "step-sync"
    description = "GRPO steps: all groups start together"

    [run]
    mode = "step-sync"          # step-sync | burst | open
    rollouts = 128              # trajectories per step (step-sync) or in all
    group_size = 8              # sandboxes per acquire (a GRPO group); 1 = single acquires
    steps = 2                   # step-sync only
    step_gap_seconds = 20       # step-sync: the trainer's update between steps (not in step time)
    refill = "between-steps"    # step-sync: when the pool refills (continuous | between-steps)
    concurrency = 0             # open/burst: rollouts in flight at once; 0 = all
    arrival_rate = 0.0          # open: new groups per second (Poisson); 0 = as fast as concurrency allows
    max_seconds = 900           # hard bound on the run (every driver)
    max_requests = 200000       # hard bound on requests (RPCs / engine calls) per driver
    seed = 1

    [episode]
    turns = { dist = "lognormal", median = 5, sigma = 0.8, min = 1, max = 40 }
    think_seconds = { dist = "lognormal", median = 0.3, sigma = 0.7, max = 4 }
    execs_per_turn = { dist = "uniform", min = 1, max = 3 }
    session_fraction = 0.7      # share of execs run in the persistent session
    files_per_turn = { dist = "uniform", min = 0, max = 2 }
    file_bytes = { dist = "lognormal", median = 2000, sigma = 1.0, min = 64, max = 65536 }
    snapshot_probability = 0.05 # per turn, when the server supports snapshots
    exec_timeout_seconds = 30

    [commands]                  # {file}: a file this episode wrote; {turn}; {rollout}
    setup = ["cd /workspace"]   # session commands once after acquiring
    session = ["cat {file}", "ls -la"]
    oneshot = ["python3 {file}"]
    reward = "python3 {file}"

    [quick]                     # overrides for --quick (same sections)
    run = { steps = 1 }

Presets live in benchmarks/profiles/<name>.toml. Every mistake is a
ProfileError naming the key (``episode.turns.sigma: must be a number``).
"""

from __future__ import annotations

import math
import string
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.load.dists import Dist, ProfileError, parse_dist

PROFILES_DIR = Path(__file__).resolve().parent.parent / "profiles"
PRESETS = ("swe-like", "tool-calls", "burst", "step-sync")
MODES = ("step-sync", "burst", "open")
REFILLS = ("continuous", "between-steps")
PLACEHOLDERS = frozenset({"file", "turn", "rollout"})
MAX_FILE_BYTES = 64 * 1024
"""Largest file a profile may write: the baseline passes files base64-encoded on a command line."""


@dataclass(frozen=True)
class RunShape:
    mode: str
    rollouts: int
    group_size: int
    steps: int
    step_gap_seconds: float
    refill: str
    """continuous: the pool refills as sandboxes are released, during the step;
    between-steps: the harness lowers the pool's floor once every group of a
    step holds its sandboxes and restores it after the step (the trainer's update)."""
    concurrency: int
    arrival_rate: float
    max_seconds: float
    max_requests: int
    seed: int

    @property
    def groups(self) -> int:
        """Acquires per step (the last group may be smaller)."""
        return math.ceil(self.rollouts / self.group_size)

    @property
    def in_flight(self) -> int:
        """Most sandboxes held at once."""
        if self.mode == "step-sync" or self.concurrency == 0:
            return self.rollouts
        return min(self.rollouts, max(self.concurrency, self.group_size))


@dataclass(frozen=True)
class EpisodeShape:
    turns: Dist
    think_seconds: Dist
    execs_per_turn: Dist
    session_fraction: float
    files_per_turn: Dist
    file_bytes: Dist
    snapshot_probability: float
    exec_timeout_seconds: float


@dataclass(frozen=True)
class Commands:
    setup: tuple[str, ...]
    session: tuple[str, ...]
    oneshot: tuple[str, ...]
    reward: str


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    run: RunShape
    episode: EpisodeShape
    commands: Commands
    source: str = ""


_RUN_DEFAULTS: dict[str, Any] = {
    "group_size": 1,
    "steps": 1,
    "step_gap_seconds": 0.0,
    "refill": "continuous",
    "concurrency": 0,
    "arrival_rate": 0.0,
    "max_seconds": 900.0,
    "max_requests": 200_000,
    "seed": 1,
}
_EPISODE_DEFAULTS: dict[str, Any] = {
    "think_seconds": 0.0,
    "execs_per_turn": 1,
    "session_fraction": 0.5,
    "files_per_turn": 0,
    "file_bytes": 1024,
    "snapshot_probability": 0.0,
    "exec_timeout_seconds": 30.0,
}
_COMMAND_DEFAULTS: dict[str, Any] = {"setup": [], "session": [], "oneshot": []}
_TOP_KEYS = {"name", "description", "run", "episode", "commands", "quick"}


def _table(where: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ProfileError(where, f"must be a table, not {value!r}")
    return value


def _check_keys(where: str, table: Mapping[str, Any], allowed: set[str] | frozenset[str]) -> None:
    unknown = sorted(set(table) - set(allowed))
    if unknown:
        raise ProfileError(
            where, f"unknown key(s): {', '.join(unknown)} (allowed: {', '.join(sorted(allowed))})"
        )


def _int(where: str, value: Any, lo: int, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProfileError(where, f"must be an integer, not {value!r}")
    if value < lo or (hi is not None and value > hi):
        bound = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ProfileError(where, f"must be {bound}, not {value}")
    return value


def _float(where: str, value: Any, lo: float, hi: float | None = None, *, above: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ProfileError(where, f"must be a number, not {value!r}")
    if value < lo or (above and value == lo) or (hi is not None and value > hi):
        bound = (f"> {lo:g}" if above else f">= {lo:g}") if hi is None else f"in [{lo:g}, {hi:g}]"
        raise ProfileError(where, f"must be {bound}, not {value!r}")
    return float(value)


def _command(where: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ProfileError(where, f"must be a non-empty string, not {value!r}")
    try:
        fields = {f for _, f, _, _ in string.Formatter().parse(value) if f is not None}
    except ValueError as e:
        raise ProfileError(where, f"bad placeholder syntax: {e}") from e
    unknown = sorted(fields - PLACEHOLDERS)
    if unknown:
        raise ProfileError(
            where,
            f"unknown placeholder(s) {', '.join('{' + u + '}' for u in unknown)} "
            f"(known: {', '.join('{' + p + '}' for p in sorted(PLACEHOLDERS))})",
        )
    return value


def _commands(where: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise ProfileError(where, f"must be a list of strings, not {value!r}")
    return tuple(_command(f"{where}[{i}]", v) for i, v in enumerate(value))


def merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """Deep-merges tables: ``over`` wins; nested tables merge key by key
    (a distribution table is replaced whole, since its keys depend on its kind)."""
    out = dict(base)
    for key, value in over.items():
        old = out.get(key)
        if isinstance(value, dict) and isinstance(old, dict) and "dist" not in value:
            out[key] = merge(old, value)
        else:
            out[key] = value
    return out


def parse_profile(
    data: Mapping[str, Any],
    *,
    quick: bool = False,
    overrides: Mapping[str, Any] | None = None,
    source: str = "",
) -> Profile:
    """A Profile from parsed TOML; ``overrides`` are dotted keys ({"run.rollouts": 8})."""
    _check_keys("profile", data, _TOP_KEYS)
    doc = dict(data)
    quick_table = _table("quick", doc.pop("quick", {}))
    _check_keys("quick", quick_table, {"run", "episode", "commands"})
    if quick:
        doc = merge(doc, quick_table)
    for dotted, value in (overrides or {}).items():
        section, _, key = dotted.partition(".")
        doc[section] = merge(_table(section, doc.get(section, {})), {key: value})

    name = doc.get("name", Path(source).stem if source else "")
    if not isinstance(name, str) or not name:
        raise ProfileError("name", f"must be a non-empty string, not {name!r}")
    description = doc.get("description", "")
    if not isinstance(description, str):
        raise ProfileError("description", "must be a string")

    run_t = merge(_RUN_DEFAULTS, _table("run", doc.get("run", {})))
    _check_keys("run", run_t, {"mode", "rollouts", *_RUN_DEFAULTS})
    if "mode" not in run_t:
        raise ProfileError("run.mode", f"missing (one of {', '.join(MODES)})")
    if run_t["mode"] not in MODES:
        raise ProfileError("run.mode", f"must be one of {', '.join(MODES)}, not {run_t['mode']!r}")
    if "rollouts" not in run_t:
        raise ProfileError("run.rollouts", "missing")
    run = RunShape(
        mode=run_t["mode"],
        rollouts=_int("run.rollouts", run_t["rollouts"], 1, 100_000),
        group_size=_int("run.group_size", run_t["group_size"], 1, 1024),
        steps=_int("run.steps", run_t["steps"], 1, 1000),
        step_gap_seconds=_float("run.step_gap_seconds", run_t["step_gap_seconds"], 0.0, 3600.0),
        refill=run_t["refill"],
        concurrency=_int("run.concurrency", run_t["concurrency"], 0),
        arrival_rate=_float("run.arrival_rate", run_t["arrival_rate"], 0.0),
        max_seconds=_float("run.max_seconds", run_t["max_seconds"], 0.0, 24 * 3600.0, above=True),
        max_requests=_int("run.max_requests", run_t["max_requests"], 1, 100_000_000),
        seed=_int("run.seed", run_t["seed"], 0),
    )
    if run.mode != "step-sync" and run.steps != 1:
        raise ProfileError("run.steps", f"only step-sync runs several steps (mode is {run.mode!r})")
    if run.mode != "step-sync" and run.step_gap_seconds:
        raise ProfileError("run.step_gap_seconds", f"only step-sync has steps (mode is {run.mode!r})")
    if run.refill not in REFILLS:
        raise ProfileError("run.refill", f"must be one of {', '.join(REFILLS)}, not {run.refill!r}")
    if run.mode != "step-sync" and run.refill != "continuous":
        raise ProfileError("run.refill", f"only step-sync refills between steps (mode is {run.mode!r})")
    if run.mode != "open" and run.arrival_rate:
        raise ProfileError("run.arrival_rate", f"only open runs have an arrival rate (mode is {run.mode!r})")

    ep_t = merge(_EPISODE_DEFAULTS, _table("episode", doc.get("episode", {})))
    _check_keys("episode", ep_t, {"turns", *_EPISODE_DEFAULTS})
    if "turns" not in ep_t:
        raise ProfileError("episode.turns", "missing (a number or a distribution table)")
    episode = EpisodeShape(
        turns=parse_dist("episode.turns", ep_t["turns"], integer=True, upper=1000),
        think_seconds=parse_dist("episode.think_seconds", ep_t["think_seconds"], upper=600.0),
        execs_per_turn=parse_dist("episode.execs_per_turn", ep_t["execs_per_turn"], integer=True, upper=100),
        session_fraction=_float("episode.session_fraction", ep_t["session_fraction"], 0.0, 1.0),
        files_per_turn=parse_dist("episode.files_per_turn", ep_t["files_per_turn"], integer=True, upper=100),
        file_bytes=parse_dist("episode.file_bytes", ep_t["file_bytes"], integer=True, upper=MAX_FILE_BYTES),
        snapshot_probability=_float("episode.snapshot_probability", ep_t["snapshot_probability"], 0.0, 1.0),
        exec_timeout_seconds=_float(
            "episode.exec_timeout_seconds", ep_t["exec_timeout_seconds"], 0.0, 3600.0, above=True
        ),
    )
    if episode.turns.lo < 1:
        raise ProfileError("episode.turns", "an episode has at least one turn: set min = 1")

    cmd_t = merge(_COMMAND_DEFAULTS, _table("commands", doc.get("commands", {})))
    _check_keys("commands", cmd_t, {"reward", *_COMMAND_DEFAULTS})
    if "reward" not in cmd_t:
        raise ProfileError("commands.reward", "missing (the command that scores an episode)")
    commands = Commands(
        setup=_commands("commands.setup", cmd_t["setup"]),
        session=_commands("commands.session", cmd_t["session"]),
        oneshot=_commands("commands.oneshot", cmd_t["oneshot"]),
        reward=_command("commands.reward", cmd_t["reward"]),
    )
    if episode.session_fraction > 0 and not commands.session:
        raise ProfileError("commands.session", "empty, but episode.session_fraction > 0")
    if episode.session_fraction < 1 and not commands.oneshot:
        raise ProfileError("commands.oneshot", "empty, but episode.session_fraction < 1")
    return Profile(name, description, run, episode, commands, source)


def resolve(name_or_path: str) -> Path:
    """A preset name (``step-sync``) or a path to a TOML file."""
    if name_or_path in PRESETS or (PROFILES_DIR / f"{name_or_path}.toml").is_file():
        return PROFILES_DIR / f"{name_or_path}.toml"
    path = Path(name_or_path)
    if not path.is_file():
        raise ProfileError(
            "profile", f"{name_or_path!r} is neither a preset ({', '.join(PRESETS)}) nor a file"
        )
    return path


def _shown(path: Path) -> str:
    """The profile's path as results record it: relative to the project for
    shipped presets, so result files name no machine's directories."""
    root = Path(__file__).resolve().parents[2]
    try:
        return str(path.resolve().relative_to(root))
    except ValueError:
        return str(path)


def load_profile(
    name_or_path: str, *, quick: bool = False, overrides: Mapping[str, Any] | None = None
) -> Profile:
    path = resolve(name_or_path)
    try:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    except tomllib.TOMLDecodeError as e:
        raise ProfileError(str(path), f"not valid TOML: {e}") from e
    try:
        return parse_profile(data, quick=quick, overrides=overrides, source=_shown(path))
    except ProfileError as e:
        raise ProfileError(f"{path.name}: {e.where}", e.problem) from None
