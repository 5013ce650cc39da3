"""``sandboxd status``: the pools of a running server, live, as a table fed
by the WatchPool stream."""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TextIO

from sandboxd.client import AsyncClient
from sandboxd.errors import SandboxdError
from sandboxd.v1 import demand_pb2, rollouts_pb2

_CLEAR = "\x1b[H\x1b[2J"

COLUMNS = (
    ("POOL", "pool"),
    ("READY", "ready"),
    ("LEASED", "leased"),
    ("START", "starting"),
    ("WAIT", "waiting"),
    ("TARGET", "warm_target"),
    ("KEEP", "warm_keep"),
    ("MIN", "min_ready"),
    ("MAXRDY", "max_ready"),
    ("MAX", "max_size"),
    ("RATE/s", "acquire_rate"),
    ("STARTUP", "startup_seconds"),
    ("ANNOUNCED", "announced"),
    ("FAILED", "failed_total"),
    # How long the first acquirer in line has waited, and what the engine owes an answer for.
    ("WAITED", "oldest_wait_seconds"),
    ("DOUBT", "in_doubt"),
)


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def format_table(pools: Sequence[demand_pb2.PoolScaling], at: datetime | None = None) -> str:
    """A fixed-width table of pools, one line each, with why each warm
    target is what it is (and the last error, if any) underneath."""
    rows = [[h for h, _ in COLUMNS]]
    rows += [[_cell(getattr(p, field)) for _, field in COLUMNS] for p in pools]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    lines = []
    if at is not None:
        lines.append(f"sandboxd pools at {at.strftime('%Y-%m-%d %H:%M:%S')} UTC")
    for row in rows:
        lines.append(
            "  ".join(
                c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )
    if not pools:
        lines.append("(no pools)")
    degraded = next((p.engine_degraded for p in pools if p.engine_degraded), "")
    if degraded:
        window = max((p.start_window for p in pools), default=0)
        lines.append(f"ENGINE DEGRADED: {degraded}; starting at most {window or 1} at once")
    for p in pools:
        note = f"  {p.pool}: {p.reason or '-'}"
        if p.last_error:
            note += f"  [last error: {p.last_error}]"
        lines.append(note)
        for i in p.images:
            lines.append(
                f"    image {i.image}: ready {i.ready} starting {i.starting} waiting {i.waiting} "
                f"target {i.warm_target}"
            )
    lines += image_pull_lines(pools)
    return "\n".join(lines)


def image_pull_lines(pools: Sequence[demand_pb2.PoolScaling]) -> list[str]:
    """One line per image pull in flight or recently ended; every pool's
    update carries the server's pulls, so each is shown once."""
    seen: dict[str, demand_pb2.ImagePull] = {}
    for p in pools:
        for pull in p.pulls:
            seen.setdefault(pull.image, pull)
    lines = []
    for pull in seen.values():
        if pull.bytes_total:
            amount = f"{pull.bytes_done / 1e6:.1f} of {pull.bytes_total / 1e6:.1f} MB"
        else:
            amount = f"{pull.bytes_done / 1e6:.1f} MB"
        detail = f" ({pull.detail})" if pull.detail else ""
        lines.append(f"pull {pull.image}: {pull.state}, {amount}{detail}")
    return lines


async def _run_line(client: AsyncClient, run: str) -> str:
    from sandboxd.client.rollouts import RolloutClient

    try:
        f = await RolloutClient(client).figures(run)
    except SandboxdError as e:
        return f"run {run}: {e.message}"
    return (
        f"run {run}: v{f.policy_version} R_p {f.production_rate:.1f}/s k {f.keep_rate:.2f} "
        f"R_eff {f.effective_rate:.1f}/s R_c {f.consumption_rate:.1f}/s "
        f"trainer idle {f.trainer_idle_ratio:.0%} generator idle {f.generator_idle_ratio:.0%} "
        f"queue {f.queue_depth} in flight {f.in_flight} target {f.target_concurrency} "
        f"staleness max {f.staleness_trajectory.max} masked {f.infra_failures_masked}"
    ) + "".join(f"\n  {line}" for line in run_detail_lines(f))


def usd(amount: float) -> str:
    """Dollars to the cent, or to three significant digits below a cent."""
    if amount >= 0.01 or amount <= 0:
        return f"${amount:.2f}"
    return f"${amount:.{2 - math.floor(math.log10(amount))}f}"


def run_detail_lines(f: rollouts_pb2.Figures) -> list[str]:
    """A run's dollars and its rollouts' stage distributions, for ``sandboxd status --run``."""
    lines = []
    if f.HasField("cost"):
        c = f.cost
        mtok = f" {usd(c.usd_per_mtok)}/Mtok (sandboxes {usd(c.sandbox_usd_per_mtok)})" if c.tokens else ""
        lines.append(
            f"cost: trainer idle {usd(c.trainer_idle_usd_per_step)}/step"
            f" ({usd(c.trainer_idle_usd_per_hour)}/h"
            f" of {c.trainer_gpus} GPUs at {usd(c.gpu_hour_usd)}), sandboxes {usd(c.sandbox_usd_per_rollout)}"
            f"/rollout {usd(c.sandbox_usd_per_step)}/step{mtok}; {c.steps} steps {c.rollouts} rollouts"
            f" in {f.window_seconds:.0f} s"
        )
    if f.HasField("lifecycle"):
        lc = f.lifecycle
        lines.append(
            f"lifecycle: {lc.traces} rollouts, sandboxes warm {lc.warm_sandboxes} cold {lc.cold_sandboxes} "
            f"pulled {lc.image_pulls}; waits on: {lc.bottleneck or '-'}"
        )
        for d in lc.stages:
            if d.count:
                lines.append(
                    f"  {d.stage:<17} p50 {d.p50_seconds:8.3f}s p90 {d.p90_seconds:8.3f}s "
                    f"p99 {d.p99_seconds:8.3f}s  {d.share:4.0%}  n={d.count}"
                )
    return lines


async def run_status(
    target: str,
    *,
    pool: str = "",
    once: bool = False,
    interval: float = 1.0,
    token: str | None = None,
    out: TextIO | None = None,
    runs: Sequence[str] = (),
) -> int:
    """Prints the pools (and the named rollout runs' throughput figures)
    live, refreshing in place on a terminal."""
    out = out or sys.stdout
    refresh = not once and out.isatty()
    async with AsyncClient(target, token=token) as client:
        async for update in client.watch_pools(pool, interval=interval):
            at = datetime.fromtimestamp(update.at.ToNanoseconds() / 1e9, UTC) if update.at.seconds else None
            text = format_table(list(update.pools), at)
            for run in runs:
                text += "\n" + await _run_line(client, run)
            out.write((_CLEAR if refresh else "") + text + "\n")
            out.flush()
            if once:
                return 0
    return 0
