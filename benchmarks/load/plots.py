"""PNG plots of a run: latency CDFs per operation, pool size and demand over time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

OPS = ("acquire", "exec_session", "exec_oneshot", "write", "reward", "release", "snapshot")
COLORS = {"sandboxd": "tab:blue", "baseline": "tab:red", "floor": "tab:gray"}


def step_windows(d: dict[str, Any]) -> list[tuple[float, float]]:
    """(start, duration) of each step; older series lack the starts, which
    then follow from the durations and the pauses between steps."""
    steps: list[float] = d.get("step_s", [])
    starts: list[float] = d.get("step_start_s", [])
    if len(starts) != len(steps):
        gaps: list[float] = d.get("between_steps_s", [])
        starts, t = [], 0.0
        for i, step in enumerate(steps):
            starts.append(t)
            t += step + (gaps[i] if i < len(gaps) else 0.0)
    return list(zip(starts, steps, strict=True))


def plot_all(series: dict[str, Any], stem: Path, title: str) -> list[str]:
    """Writes <stem>_latency_cdf.png and <stem>_pool.png; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    written = []
    drivers = [d for d in COLORS if d in series]
    ops = [op for op in OPS if any(series[d]["samples_ms"].get(op) for d in drivers)]
    if ops:
        cols = min(3, len(ops))
        rows = (len(ops) + cols - 1) // cols
        fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
        for ax, op in zip(axes.flat, ops, strict=False):
            for d in drivers:
                xs = sorted(series[d]["samples_ms"].get(op, []))
                if xs:
                    ys = [(i + 1) / len(xs) for i in range(len(xs))]
                    ax.step(xs, ys, where="post", label=f"{d} (n={len(xs)})", color=COLORS.get(d))
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(NullFormatter())
            ax.set_title(op)
            ax.set_xlabel("latency (ms, log)")
            ax.set_ylabel("fraction ≤ x")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8, loc="lower right")
        for ax in list(axes.flat)[len(ops) :]:
            ax.set_visible(False)
        fig.suptitle(f"{title}: latency CDFs")
        fig.tight_layout()
        path = stem.with_name(stem.name + "_latency_cdf.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(str(path))

    timed = [d for d in drivers if series[d].get("timeline")]
    if timed:
        fig, axes = plt.subplots(len(timed), 1, figsize=(10, 3.6 * len(timed)), squeeze=False)
        for ax, d in zip(axes.flat, timed, strict=True):
            timeline = series[d]["timeline"]
            keys = [k for k in timeline[0] if k != "t"]
            ts = [s["t"] for s in timeline]
            for k in keys:
                ax.plot(
                    ts,
                    [s.get(k, 0) for s in timeline],
                    label=k,
                    lw=2.2 if k == "demand" else 1.3,
                    ls="--" if k == "demand" else "-",
                )
            for i, (start, step) in enumerate(step_windows(series[d])):
                ax.axvspan(start, start + step, alpha=0.12, color=COLORS.get(d))
                ax.text(start, ax.get_ylim()[1] * 0.97, f" step {i}: {step:.1f}s", fontsize=7, va="top")
            ax.axvline(0.0, color="k", lw=0.8)
            ax.set_title(f"{d}: sandboxes over time (t < 0: warm-up; shaded: steps; between: trainer update)")
            ax.set_xlabel("seconds since the clock started")
            ax.set_ylabel("sandboxes")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8, loc="upper right")
        fig.suptitle(f"{title}: pool size and demand")
        fig.tight_layout()
        path = stem.with_name(stem.name + "_pool.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(str(path))
    return written
