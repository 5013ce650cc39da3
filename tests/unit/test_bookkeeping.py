"""The record bookkeeping the registry and leasing share: operations counted
per sandbox, and the bounded memory of what ended recently."""

from __future__ import annotations

import pytest

from sandboxd.core.bookkeeping import BusyCounts, Tombstones


def test_busy_counts_nest_and_leave_no_key_behind() -> None:
    busy = BusyCounts()
    with busy.using("sb-1"):
        with busy.using("sb-1"):
            assert busy["sb-1"] == 2 and busy.busy("sb-1")
        assert busy.get("sb-1") == 1
    assert not busy.busy("sb-1") and "sb-1" not in busy and len(busy) == 0


def test_busy_counts_drop_on_an_error_too() -> None:
    busy = BusyCounts()
    with pytest.raises(RuntimeError), busy.using("sb-1"):
        raise RuntimeError("the command failed")
    assert dict(busy) == {}


def test_tombstones_forget_the_oldest_past_their_bound() -> None:
    gone: Tombstones[str] = Tombstones(2)
    gone.add("a", "released")
    gone.add("b", "lease expired")
    gone.add("a", "again")  # already remembered: keeps its place, takes the new word
    gone.add("c", "released")
    assert "a" not in gone and gone.get("a") is None
    assert gone.get("b") == "lease expired" and "c" in gone and len(gone) == 2
