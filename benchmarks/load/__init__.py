"""Load-test harness: simulated RL rollouts against sandboxd and a naive
``docker run``/``docker exec`` baseline, in one run (see benchmarks.load.cli)."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    from benchmarks.load.cli import main as cli_main

    return cli_main(argv)
