"""The sandbox lifecycle transition table."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandboxd.backends.base import Limits
from sandboxd.core.lifecycle import TRANSITIONS, SandboxRecord, State
from sandboxd.errors import FailedPrecondition

pytestmark = pytest.mark.timeout(30)

LEGAL = {
    (State.CREATING, State.READY),
    (State.CREATING, State.FAILED),
    (State.READY, State.LEASED),
    (State.READY, State.RELEASING),
    (State.READY, State.FAILED),
    (State.LEASED, State.RELEASING),
    (State.LEASED, State.FAILED),
    (State.RELEASING, State.GONE),
    (State.RELEASING, State.READY),
    (State.FAILED, State.GONE),
}


def record(state: State) -> SandboxRecord:
    return SandboxRecord("sb-000000000001", "p", "img", Limits(), state=state)


def test_table_is_exactly_the_documented_edges() -> None:
    assert set(TRANSITIONS) == LEGAL


@pytest.mark.parametrize(("src", "dst"), sorted(LEGAL))
def test_legal_edges_move_and_stamp(src: State, dst: State) -> None:
    rec = record(src)
    rec.move(dst, 123.0, "why")
    assert rec.state is dst
    assert rec.entered[dst] == 123.0
    assert rec.failure_reason == "why"


@pytest.mark.parametrize(("src", "dst"), [e for e in itertools.product(State, State) if e not in LEGAL])
def test_illegal_edges_raise_and_leave_the_record_alone(src: State, dst: State) -> None:
    rec = record(src)
    with pytest.raises(FailedPrecondition, match=f"{src.name} to {dst.name}"):
        rec.move(dst, 1.0)
    assert rec.state is src
    assert dst not in rec.entered


@pytest.mark.parametrize("src", [State.LEASED, State.GONE, State.FAILED])
def test_nothing_returns_to_ready(src: State) -> None:
    # A used sandbox goes back to READY only through its reset (RELEASING),
    # never straight from its lease, and never once lost or gone.
    with pytest.raises(FailedPrecondition):
        record(src).move(State.READY, 1.0)


@given(st.lists(st.sampled_from(list(State)), max_size=12))
def test_random_walks_only_follow_the_table(steps: list[State]) -> None:
    rec = record(State.CREATING)
    for to in steps:
        before = rec.state
        if (before, to) in LEGAL:
            rec.move(to, 0.0)
            assert rec.state is to
        else:
            with pytest.raises(FailedPrecondition):
                rec.move(to, 0.0)
            assert rec.state is before
    # GONE is terminal.
    if rec.state is State.GONE:
        assert not any(src is State.GONE for src, _ in LEGAL)
