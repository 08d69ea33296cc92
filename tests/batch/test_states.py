"""A batch line's states (``batch/_states.py``): the moves a run makes, the words outside the
ledger, and the one map from how lines ended to the exit code."""

from __future__ import annotations

from imggw_client._core import states as task
from imggw_client.batch._states import (
    BATCH_MOVES,
    DOWNLOADING,
    EXPIRED,
    FAILED,
    FINAL,
    LEGACY,
    LINE_STATE,
    MOVES,
    PENDING,
    RECHECKS,
    RUNNING,
    SAVED,
    STATUS,
    STATUSES,
    TASK_STATE,
    WORDS,
    WORK,
    ExitCode,
    LineState,
    exit_code,
    statuses,
    words,
)


def test_a_run_moves_lines_forward_and_final_lines_nowhere_but_a_lost_file_back() -> None:
    assert set(MOVES) == set(LineState)
    assert MOVES[PENDING] == {RUNNING, DOWNLOADING, FAILED}  # a replay may answer finished
    assert MOVES[RUNNING] == {DOWNLOADING, FAILED}  # never back to pending
    assert MOVES[DOWNLOADING] == {SAVED, FAILED, EXPIRED}
    assert MOVES[SAVED] == {DOWNLOADING}  # files gone: downloaded again
    assert MOVES[FAILED] == frozenset()
    assert MOVES[EXPIRED] == {SAVED}  # a refreshed link saved after all
    assert {SAVED, FAILED, EXPIRED} == FINAL
    # What a rerun moves back is never what the run itself may do, and never a submit again
    # for a line that has a task.
    for rule in RECHECKS:
        assert rule.to not in MOVES[rule.state]
        assert rule.to is not PENDING or not rule.task_id


def test_line_moves_and_work_are_read_off_the_cores_one_table() -> None:
    # MOVES itself is pinned move by move above; here, what the batch adds to the core's table.
    by_the_table = {
        (line, LINE_STATE[task.move(state, event)])
        for line, state in TASK_STATE.items()
        for event in task.Event
    }
    assert not BATCH_MOVES & by_the_table  # the batch adds only what the table lacks
    assert {(DOWNLOADING, FAILED), (SAVED, DOWNLOADING)} == BATCH_MOVES
    # A line's work is its task state's; a recheck's target is the line state with its work.
    assert WORK == {PENDING: task.Work.RESEND, RUNNING: task.Work.WAIT,
                    DOWNLOADING: task.Work.DOWNLOAD, SAVED: None, FAILED: None,
                    EXPIRED: None}  # fmt: skip
    assert [rule.to for rule in RECHECKS] == [DOWNLOADING, DOWNLOADING, RUNNING, PENDING]
    # A task state the core adds shows up here at once: every one has its line state.
    assert set(LINE_STATE) == {*task.State, None}


def test_every_state_has_one_word_outside_the_ledger_and_one_on_the_display() -> None:
    assert set(STATUS) == set(LineState)
    assert set(STATUS.values()) == set(STATUSES)
    assert sorted(s for of in WORDS.values() for s in of) == sorted(LineState)
    assert set(LEGACY.values()) <= set(LineState)
    assert not set(LEGACY) & {s.value for s in LineState}
    assert f"{RUNNING}" == str(RUNNING) == "running"


def test_counts_become_words_and_statuses_zeros_included() -> None:
    counts = {PENDING: 1, RUNNING: 2, DOWNLOADING: 3, SAVED: 4, EXPIRED: 5}
    assert words(counts) == {"pending": 1, "running": 2, "downloading": 3, "succeeded": 4,
                             "failed": 5}  # fmt: skip
    assert statuses(counts) == {"pending": 1, "running": 5, "succeeded": 4, "failed": 5}
    assert statuses({"saved": 2}) == {"pending": 0, "running": 0, "succeeded": 2, "failed": 0}


def test_the_exit_code_a_guard_then_unfinished_then_failed_then_ok() -> None:
    assert exit_code({"succeeded": 3}) is ExitCode.OK
    assert exit_code({"succeeded": 3}, bad=1) is ExitCode.SOME_FAILED
    assert exit_code({"failed": 1, "running": 1}) is ExitCode.UNFINISHED
    assert exit_code({"pending": 1}, stopped_by="max_cost") is ExitCode.STOPPED
    assert [int(code) for code in ExitCode] == [0, 1, 3, 6]
