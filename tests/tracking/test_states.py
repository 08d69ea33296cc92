"""The one table of a journaled task's moves (``_core/states.py``): what it allows, what it
ignores, and the work each state still needs."""

from __future__ import annotations

import pytest

from imggw_client._core.states import MOVES, WORK, Event, State, Work, move


def test_a_task_moves_forward_from_its_submit_to_its_saved_files() -> None:
    state = move(None, Event.SENT)
    path = [state]
    for event in (Event.PENDING, Event.RUNNING, Event.SUCCEEDED, Event.SAVED):
        state = move(state, event)
        path.append(state)
    assert path == [State.UNKNOWN, State.PENDING, State.RUNNING, State.SUCCEEDED, State.SAVED]


@pytest.mark.parametrize(
    ("state", "event"),
    [
        (State.SUCCEEDED, Event.RUNNING),  # a gateway that goes back
        (State.FAILED, Event.SUCCEEDED),
        (State.RUNNING, Event.PENDING),
        (State.SAVED, Event.RUNNING),
        (State.SAVED, Event.EXPIRED),  # saved is saved
        (State.PENDING, Event.SAVED),  # nothing to save yet
        (State.RUNNING, Event.REFUSED),  # a task exists: only an unknown submit can be refused
    ],
)
def test_a_move_the_table_does_not_hold_keeps_the_state(state: State, event: Event) -> None:
    assert (state, event) not in MOVES
    assert move(state, event) is state


def test_a_refused_submit_leaves_no_row_and_every_state_is_reachable() -> None:
    assert move(State.UNKNOWN, Event.REFUSED) is None
    assert move(State.UNKNOWN, Event.NOT_SENT) is None  # it never left: nothing to replay
    reached = {target for target in MOVES.values() if target is not None}
    assert reached == set(State)


def test_the_work_left_follows_from_the_state() -> None:
    assert set(WORK) == set(State)
    assert WORK[State.UNKNOWN] is Work.RESEND
    assert WORK[State.PENDING] is WORK[State.RUNNING] is Work.WAIT
    assert WORK[State.SUCCEEDED] is Work.DOWNLOAD
    finals = {state for state, work in WORK.items() if work is None}
    assert finals == {State.SAVED, State.FAILED, State.EXPIRED, State.NOT_FOUND}
    # A final state never moves back to one with work.
    for (state, _), target in MOVES.items():
        if state in finals and target is not None:
            assert WORK[target] is None, (state, target)


def test_a_task_the_gateway_forgot_ends_not_found_and_is_never_asked_again() -> None:
    for state in (State.PENDING, State.RUNNING):
        assert move(state, Event.NOT_FOUND) is State.NOT_FOUND
    assert WORK[State.NOT_FOUND] is None
    for event in Event:  # final: nothing moves it on
        assert move(State.NOT_FOUND, event) is State.NOT_FOUND
    assert move(State.UNKNOWN, Event.NOT_FOUND) is State.UNKNOWN  # no task id to forget
