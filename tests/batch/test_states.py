"""A batch line's states (``batch/_states.py``): the moves a run makes, the words outside the
ledger, and the one map from how lines ended to the exit code."""

from __future__ import annotations

from imggw_client.batch._states import (
    DOWNLOADING,
    EXPIRED,
    FAILED,
    FINAL,
    LEGACY,
    MOVES,
    PENDING,
    RECHECKS,
    RUNNING,
    SAVED,
    STATUS,
    STATUSES,
    WORDS,
    ExitCode,
    LineState,
    exit_code,
    statuses,
    words,
)


def test_a_run_moves_lines_forward_and_final_lines_nowhere_but_a_lost_file_back() -> None:
    assert set(MOVES) == set(LineState)
    assert MOVES[FAILED] == MOVES[EXPIRED] == frozenset()
    assert MOVES[SAVED] == {DOWNLOADING}  # files gone: downloaded again
    assert {SAVED, FAILED, EXPIRED} == FINAL
    # What a rerun moves back is never what the run itself may do, and never a submit again
    # for a line that has a task.
    for before, needs, after in RECHECKS:
        assert after not in MOVES[before]
        assert after is not PENDING or needs.startswith("no task id")


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
