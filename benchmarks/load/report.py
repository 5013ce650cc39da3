"""The result file, the table printed after a run, and ``compare``."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.dollars import prices_entry, sandbox_usd, trainer_usd

SPEEDUP_GOAL = 3.0
FLOOR_GOAL = 1.2
"""sandboxd's step time at most this many times the floor's (plain processes on the host)."""
DRIVERS = ("sandboxd", "baseline", "floor")
ROW_OPS = ("acquire", "exec", "exec_session", "exec_oneshot", "write", "snapshot", "reward", "release")


def _p(driver: dict[str, Any] | None, op: str, key: str) -> float | None:
    if not driver:
        return None
    value = driver.get("latency_ms", {}).get(op, {}).get(key)
    return None if value is None else float(value)


def step_time(driver: dict[str, Any] | None) -> float | None:
    """Mean step time (the makespan for burst/open runs)."""
    if not driver or not driver.get("step_s"):
        return None
    steps: list[float] = driver["step_s"]
    return round(sum(steps) / len(steps), 3)


def build_report(header: dict[str, Any], drivers: dict[str, dict[str, Any]]) -> dict[str, Any]:
    sd, bl, fl = drivers.get("sandboxd"), drivers.get("baseline"), drivers.get("floor")
    s_step, b_step, f_step = step_time(sd), step_time(bl), step_time(fl)
    errors = sum(sum(d.get("errors", {}).values()) for d in drivers.values())
    leaked = sum(int(d.get("leaked", 0)) for d in drivers.values())
    speedup = round(b_step / s_step, 2) if s_step and b_step else None
    over_floor = round(s_step / f_step, 3) if s_step and f_step else None
    report: dict[str, Any] = {
        **header,
        "sandboxd_step_s": s_step,
        "baseline_step_s": b_step,
        "floor_step_s": f_step,
        "speedup": speedup,
        "sandboxd_over_floor": over_floor,
        "sandboxd_exec_p99_ms": _p(sd, "exec", "p99"),
        "baseline_exec_p99_ms": _p(bl, "exec", "p99"),
        "sandboxd_warmup_s": sd.get("setup", {}).get("warmup_s") if sd else None,
        "errors": errors,
        "leaked": leaked,
    }
    goals = {
        "speedup": {"goal": f">= {SPEEDUP_GOAL:g}", "value": speedup,
                    "met": None if speedup is None else speedup >= SPEEDUP_GOAL},
        "errors": {"goal": "== 0", "value": errors, "met": errors == 0},
        "leaked": {"goal": "== 0", "value": leaked, "met": leaked == 0},
    }  # fmt: skip
    if fl is not None:
        goals["sandboxd_over_floor"] = {
            "goal": f"<= {FLOOR_GOAL:g}", "value": over_floor,
            "met": None if over_floor is None else over_floor <= FLOOR_GOAL,
        }  # fmt: skip
    report.update(dollars(drivers))
    report["goals"] = goals
    report["goals_met"] = all(g["met"] for g in goals.values())
    report["drivers"] = drivers
    return report


def dollars(drivers: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Each driver's figures in dollars: the trainer waits out every step's
    rollouts (its GPUs idle meanwhile), and the sandboxes cost their
    reservation for the time they were leased."""
    out: dict[str, Any] = {"prices": prices_entry()}
    for name, d in drivers.items():
        step = step_time(d)
        steps = len(d.get("step_s") or [])
        completed = int(d.get("episodes", {}).get("completed", 0))
        usd = sandbox_usd(float(d.get("sandbox_seconds", 0.0)))
        out[f"{name}_idle_usd_per_step"] = None if step is None else round(trainer_usd(step), 6)
        out[f"{name}_sandbox_usd_per_rollout"] = round(usd / completed, 8) if completed else None
        out[f"{name}_sandbox_usd_per_step"] = round(usd / steps, 6) if steps else None
    return out


def _fmt(v: Any, unit: str = "") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, float):
        return f"{v:,.2f}{unit}" if abs(v) < 1000 else f"{v:,.0f}{unit}"
    return f"{v}{unit}"


def rows_of(report: dict[str, Any], driver: str) -> list[tuple[str, Any]]:
    d = report.get("drivers", {}).get(driver)
    if not d:
        return []
    rows: list[tuple[str, Any]] = [
        ("step time (mean, s)", step_time(d)),
        ("steps (s)", ", ".join(f"{s:.2f}" for s in d.get("step_s", [])) or None),
        ("warm-up (s)", d.get("setup", {}).get("warmup_s")),
        ("wall (s)", d.get("wall_s")),
    ]
    for op in ROW_OPS:
        lat = d.get("latency_ms", {}).get(op)
        if lat and lat.get("n"):
            rows.append((f"{op} p50 / p99 ms (n)", f"{_fmt(lat['p50'])} / {_fmt(lat['p99'])} ({lat['n']})"))
    t = d.get("throughput", {})
    rows += [
        ("execs/s", t.get("execs_per_s")),
        ("requests", d.get("requests")),
        (
            "episodes completed/planned",
            f"{d.get('episodes', {}).get('completed')}/{d.get('episodes', {}).get('planned')}",
        ),
        ("stopped by", d.get("stopped_by")),
        ("errors", ", ".join(f"{k}={v}" for k, v in sorted(d.get("errors", {}).items())) or "0"),
        ("leaked", d.get("leaked")),
        ("snapshots", d.get("snapshots", {}).get("note")),
        ("host CPU busy before (%)", d.get("background_cpu_pct")),
        ("host CPU busy during (%)", d.get("host_cpu_busy_pct")),
        ("server CPU (% of a core)", d.get("server_cpu_pct_of_one_core")),
        ("harness CPU (s)", d.get("harness_cpu_s")),
    ]
    priced = (
        ("trainer idle $/step", "idle_usd_per_step"),
        ("sandbox $/rollout", "sandbox_usd_per_rollout"),
        ("sandbox $/step", "sandbox_usd_per_step"),
    )
    for label, key in priced:
        value = report.get(f"{driver}_{key}")
        rows.append((label, None if value is None else f"${value:.6f}"))
    return rows


def _table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    line = "  ".join("-" * w for w in widths)
    out = [line, "  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)), line]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    out.append(line)
    return "\n".join(out)


def render(report: dict[str, Any]) -> str:
    """The drivers of one run side by side."""
    drivers = [d for d in DRIVERS if d in report.get("drivers", {})]
    per = {d: dict(rows_of(report, d)) for d in drivers}
    keys: list[str] = []
    for d in drivers:
        keys += [k for k, _ in rows_of(report, d) if k not in keys]
    rows = [[k, *(_fmt(per[d].get(k)) for d in drivers)] for k in keys]
    title = (
        f"profile {report.get('profile')} ({report.get('mode')}), {report.get('rollouts')} rollouts "
        f"x {report.get('steps')} steps, groups of {report.get('group_size')}"
        f"{' (quick)' if report.get('quick') else ''}"
    )
    lines = [title, _table(["", *drivers], rows)]
    if report.get("speedup") is not None:
        lines.append(f"step time: sandboxd {report['speedup']:.2f}x shorter than the baseline")
    if report.get("sandboxd_over_floor") is not None:
        lines.append(f"step time: sandboxd {report['sandboxd_over_floor']:.2f}x the floor (plain processes)")
    for name, g in report.get("goals", {}).items():
        mark = {True: "ok  ", False: "MISS", None: "n/a "}[g["met"]]
        lines.append(f"goal {mark} {name}: {g['value']} (goal {g['goal']})")
    return "\n".join(lines)


def compare(a_path: Path, b_path: Path) -> str:
    """Two result files side by side, driver by driver, with b/a ratios of numbers."""
    a, b = (json.loads(p.read_text()) for p in (a_path, b_path))
    out = []
    head_rows = [
        [k, _fmt(a.get(k)), _fmt(b.get(k))]
        for k in ("profile", "mode", "rollouts", "steps", "group_size", "quick", "sandboxd_step_s",
                  "baseline_step_s", "floor_step_s", "speedup", "sandboxd_over_floor",
                  "sandboxd_exec_p99_ms", "baseline_exec_p99_ms", "errors", "leaked", "started_at")
    ]  # fmt: skip
    out.append(_table(["", f"A: {a_path.name}", f"B: {b_path.name}"], head_rows))
    for d in DRIVERS:
        ra, rb = dict(rows_of(a, d)), dict(rows_of(b, d))
        if not ra and not rb:
            continue
        keys = [*ra, *(k for k in rb if k not in ra)]
        rows = []
        for k in keys:
            va, vb = ra.get(k), rb.get(k)
            ratio = (
                f"{vb / va:.2f}x"
                if isinstance(va, int | float) and isinstance(vb, int | float) and va
                else ""
            )
            rows.append([k, _fmt(va), _fmt(vb), ratio])
        out.append(f"\n{d}")
        out.append(_table(["", "A", "B", "B/A"], rows))
    return "\n".join(out)
