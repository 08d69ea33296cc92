"""A batch line's states (``batch/_states.py``): the core's states, the moves a run makes, the
words outside the ledger, and the one map from how lines ended to the exit code."""

from __future__ import annotations

from imggw_client._core import states as task
from imggw_client.batch._schema import (
    BATCH_MOVES,
    EXPIRED,
    FAILED,
    FINAL,
    KEPT,
    MOVES,
    RECHECKS,
    RUNNING,
    SAVED,
    STATUS,
    STATUSES,
    SUCCEEDED,
    UNKNOWN,
    WORDS,
    ExitCode,
    LineState,
    exit_code,
    line_counts,
    line_state,
    statuses,
    words,
)


def test_a_run_moves_lines_forward_and_final_lines_nowhere_but_a_lost_file_back() -> None:
    assert set(MOVES) == set(KEPT)
    assert MOVES[UNKNOWN] == {RUNNING, SUCCEEDED, FAILED}  # a replay may answer finished
    assert MOVES[RUNNING] == {SUCCEEDED, FAILED}  # never back to unknown
    assert MOVES[SUCCEEDED] == {SAVED, FAILED, EXPIRED}
    assert MOVES[SAVED] == {SUCCEEDED}  # files gone: downloaded again
    assert MOVES[FAILED] == frozenset()
    assert MOVES[EXPIRED] == {SAVED}  # a refreshed link saved after all
    assert {SAVED, FAILED, EXPIRED} == FINAL
    # What a rerun moves back is never what the run itself may do, and never a submit again
    # for a line that has a task.
    for rule in RECHECKS:
        assert rule.to not in MOVES[rule.state]
        assert rule.to is not UNKNOWN or not rule.task_id


def test_line_moves_and_work_are_read_off_the_cores_one_table() -> None:
    # MOVES itself is pinned move by move above; here, what the batch adds to the core's table.
    # Every move of a run is a move of the core's table, or one of the two a batch adds; a
    # refused submit and a forgotten task are kept as failed lines, a queued task as running.
    def kept(target: task.State | None) -> task.State:
        if target is None or target is task.State.NOT_FOUND:
            return FAILED
        return RUNNING if target is task.State.PENDING else target

    by_the_table = {
        (state, kept(task.move(state, event))) for state in KEPT for event in task.Event
    }
    assert not BATCH_MOVES & by_the_table  # the batch adds only what the table lacks
    assert {(SUCCEEDED, FAILED), (SAVED, SUCCEEDED)} == BATCH_MOVES
    # A line's work is its state's; a recheck's target is the kept state with its work.
    assert {state: task.WORK[state] for state in KEPT} == {
        UNKNOWN: task.Work.RESEND,
        RUNNING: task.Work.WAIT,
        SUCCEEDED: task.Work.DOWNLOAD,
        SAVED: None,
        FAILED: None,
        EXPIRED: None,
    }
    assert [rule.to for rule in RECHECKS] == [SUCCEEDED, SUCCEEDED, RUNNING, UNKNOWN]
    assert all(task.WORK[rule.to] is rule.work for rule in RECHECKS)
    # A task state the core adds shows up here at once: every one has its line's word.
    assert {line_state(state) for state in task.State} == set(LineState)


def test_every_state_has_one_word_outside_the_ledger_and_one_on_the_display() -> None:
    assert [line_state(state) for state in KEPT] == [
        LineState.PENDING,
        LineState.RUNNING,
        LineState.DOWNLOADING,
        LineState.SAVED,
        LineState.FAILED,
        LineState.EXPIRED,
    ]
    assert set(STATUS) == set(LineState)
    assert set(STATUS.values()) == set(STATUSES)
    assert sorted(s for of in WORDS.values() for s in of) == sorted(LineState)
    assert f"{LineState.RUNNING}" == str(LineState.RUNNING) == "running"


def test_counts_become_words_and_statuses_zeros_included() -> None:
    counts = {UNKNOWN: 1, RUNNING: 2, SUCCEEDED: 3, SAVED: 4, EXPIRED: 5, FAILED: 0}
    shown = line_counts(counts)
    assert shown == {"pending": 1, "running": 2, "downloading": 3, "saved": 4, "expired": 5}
    assert words(shown) == {
        "pending": 1,
        "running": 2,
        "downloading": 3,
        "succeeded": 4,
        "failed": 5,
    }
    assert statuses(shown) == {"pending": 1, "running": 5, "succeeded": 4, "failed": 5}
    assert statuses({"saved": 2}) == {"pending": 0, "running": 0, "succeeded": 2, "failed": 0}


def test_the_exit_code_a_guard_then_unfinished_then_failed_then_ok() -> None:
    assert exit_code({"succeeded": 3}) is ExitCode.OK
    assert exit_code({"succeeded": 3}, bad=1) is ExitCode.SOME_FAILED
    assert exit_code({"failed": 1, "running": 1}) is ExitCode.UNFINISHED
    assert exit_code({"pending": 1}, stopped_by="max_cost") is ExitCode.STOPPED
    assert [int(code) for code in ExitCode] == [0, 1, 3, 6]
