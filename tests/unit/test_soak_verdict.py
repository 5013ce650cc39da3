"""The soak's memory verdict: flat, growing, and too short to tell."""

from __future__ import annotations

import pytest

from benchmarks.soak import memory_verdict

pytestmark = pytest.mark.timeout(10)


def samples(rss: list[float], *, threads: int = 20, fds: int = 80) -> list[dict[str, float]]:
    step = 5.0
    return [{"t": i * step, "rss_mib": r, "threads": threads, "fds": fds} for i, r in enumerate(rss)]


def test_a_steady_server_is_flat() -> None:
    v = memory_verdict(samples([60.0] * 12 + [100.0, 101.0, 100.5] * 40), warmup=60.0)
    assert v["flat"] is True and abs(v["growth"]) < 0.02 and v["rss_peak_mib"] == 101.0


def test_steady_growth_is_not_flat() -> None:
    v = memory_verdict(samples([100.0 + i for i in range(130)]), warmup=60.0)
    assert v["flat"] is False and v["growth"] > 0.5
    assert v["slope_mib_per_min_second_half"] == pytest.approx(12.0, rel=0.01)


def test_leaking_descriptors_are_not_flat() -> None:
    s = samples([100.0] * 130)
    s[-1]["fds"] = 500
    assert memory_verdict(s, warmup=60.0)["flat"] is False


def test_too_short_to_tell() -> None:
    assert memory_verdict(samples([1.0, 2.0]), warmup=60.0)["flat"] is None
