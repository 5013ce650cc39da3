"""``sandboxd status``: the pools of a running server, live, as a table fed
by the WatchPool stream."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TextIO

from sandboxd.client import AsyncClient
from sandboxd.v1 import demand_pb2

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
    for p in pools:
        note = f"  {p.pool}: {p.reason or '-'}"
        if p.last_error:
            note += f"  [last error: {p.last_error}]"
        lines.append(note)
    return "\n".join(lines)


async def run_status(
    target: str,
    *,
    pool: str = "",
    once: bool = False,
    interval: float = 1.0,
    token: str | None = None,
    out: TextIO | None = None,
) -> int:
    out = out or sys.stdout
    refresh = not once and out.isatty()
    async with AsyncClient(target, token=token) as client:
        async for update in client.watch_pools(pool, interval=interval):
            at = datetime.fromtimestamp(update.at.ToNanoseconds() / 1e9, UTC) if update.at.seconds else None
            text = format_table(list(update.pools), at)
            out.write((_CLEAR if refresh else "") + text + "\n")
            out.flush()
            if once:
                return 0
    return 0
