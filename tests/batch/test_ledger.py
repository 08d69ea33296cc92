"""The queries of an open ledger (``batch/_ledger.py``): a plan that keeps what it knows of each
line, the looks again a rerun takes at no cost (``_states.RECHECKS``), and the sums a run starts
from: money, prices, room, durations."""

from __future__ import annotations

from pathlib import Path

import pytest

from imggw_client import AsyncClient
from imggw_client.batch._ledger import BatchLockedError, Ledger
from imggw_client.batch._lines import COLLECT
from imggw_client.batch._schema import (
    EXPIRED,
    FAILED,
    RECHECKS,
    RUNNING,
    SAVED,
    SUCCEEDED,
    UNKNOWN,
)
from imggw_client.tracking._store import NOT_FOUND

from .ledgers import plan, planned, row


def test_a_plan_keeps_a_known_line_and_renews_a_changed_one(tmp_path: Path) -> None:
    with planned(tmp_path, [row(1, SAVED, task_id="1"), row(2, SAVED, task_id="2")]) as ledger:
        ledger.begin_plan()
        kept = ledger.plan_line(row(5, digest="digest-1", identity="line:1"))
        changed = ledger.plan_line(row(2, digest="another request"))
        assert ledger.plan_line(row(9, identity="line:1")) is None  # the same line twice
        ledger.end_plan(commit=True)
        assert kept is not None
        assert changed is not None
        assert (kept[0].state, kept[0].line, kept[1]) == (SAVED, 5, False)  # moved, not renewed
        assert (changed[0].state, changed[1]) == (UNKNOWN, True)
        assert [(r.line, r.state) for r in ledger.rows()] == [(2, UNKNOWN), (5, SAVED)]


def test_a_plan_not_committed_leaves_the_last_one(tmp_path: Path) -> None:
    with planned(tmp_path, [row(1)]) as ledger:
        ledger.begin_plan()
        ledger.plan_line(row(7))
        ledger.end_plan(commit=False)
        assert [r.line for r in ledger.rows()] == [1]


def test_a_rerun_looks_again_at_what_a_second_look_may_find_otherwise(tmp_path: Path) -> None:
    rows = [
        row(1, EXPIRED, task_id="1", error_code="result_expired"),
        row(2, FAILED, task_id="2", urls=["https://x/2.png"], error_code="not_an_image"),
        row(3, FAILED, task_id="3", error_code=NOT_FOUND),
        row(4, FAILED, error_code=NOT_FOUND),  # a submit answered 404: nothing was made
        row(5, FAILED, task_id="5", error_code="content_policy"),  # the task failed: final
        row(6, FAILED, task_id="6", error_code=NOT_FOUND, kind=COLLECT),  # as row 3
        # (a collect line always names its task: one that does not is a damaged ledger)
    ]
    with planned(tmp_path, rows) as ledger:
        ledger.begin_plan()
        for each in rows:
            ledger.plan_line(each)
        ledger.recheck()
        ledger.end_plan(commit=True)
        found = [(r.state, r.error_code) for r in ledger.rows()]
    assert found == [
        (SUCCEEDED, None),
        (SUCCEEDED, None),
        (RUNNING, None),
        (UNKNOWN, None),
        (FAILED, "content_policy"),
        (RUNNING, None),
    ]
    # The table the ledger carries out names exactly these moves back.
    assert {(rule.state, rule.to) for rule in RECHECKS} == {
        (EXPIRED, SUCCEEDED),
        (FAILED, SUCCEEDED),
        (FAILED, RUNNING),
        (FAILED, UNKNOWN),
    }


def test_money_and_prices_count_only_what_a_line_was_really_charged(tmp_path: Path) -> None:
    rows = [
        row(1, SAVED, task_id="1", credits=4.0, cost=0.01),
        row(2, RUNNING, task_id="2", credits=0.0, cost=0.0),  # 0 while running: no price
        row(3, FAILED, task_id="3", credits=0.0, cost=0.0),  # a failed task's 0: no price
        row(4, SAVED, task_id="4", resolution="2k", credits=16.0, cost=-1.0),  # clamped
        row(5, SAVED, task_id="5", resolution="2k", credits=12.0, cost=None),  # no cost said
        row(6, FAILED, kind="bad"),  # a bad input line is not work: not counted
    ]
    with planned(tmp_path, rows) as ledger:
        totals = ledger.totals()
        assert (totals.credits, totals.cost, totals.cost_unknown) == (32.0, 0.01, 1)
        assert sum(totals.counts.values()) == 5
        assert ledger.charges() == {"1k": (4.0, 0.01), "2k": (16.0, -1.0)}
        assert ledger.waiting_by_resolution(UNKNOWN) == {}
        assert ledger.unsaved_by_resolution() == {"1k": 1}


def test_a_runs_durations_are_its_newest_per_kind_without_replays_or_collects(
    tmp_path: Path,
) -> None:
    rows = [
        row(n, SAVED, task_id=str(n), submitted_at=100.0 * n, completed_at=100.0 * n + n)
        for n in range(1, 6)
    ]
    rows.append(row(6, SAVED, task_id="6", submitted_at=None, completed_at=700.0))  # replayed
    rows.append(row(7, SAVED, task_id="7", kind=COLLECT, submitted_at=1.0, completed_at=9.0))
    with planned(tmp_path, rows) as ledger:
        assert ledger.durations(3) == {("beta", "1k"): [3.0, 4.0, 5.0]}


def test_links_that_kept_the_key_in_clear_are_blanked_once(tmp_path: Path) -> None:
    key = "sk-live-0123456789abcdef"
    rows = [
        row(1, SUCCEEDED, task_id="1", urls=[f"https://x/1.png?sig={key}"]),
        row(2, SUCCEEDED, task_id="2", urls=["https://x/2.png"]),
    ]
    (tmp_path / "short").mkdir()
    with planned(tmp_path / "short", rows) as ledger:
        short = AsyncClient(api_key="1.p", base_url="http://127.0.0.1:9")
        assert ledger.blank_links(short.redact_url) == 0  # too short to be told apart
    with planned(tmp_path, rows) as ledger:
        client = AsyncClient(api_key=key, base_url="http://127.0.0.1:9")
        assert ledger.blank_links(client.redact_url) == 1
        assert ledger.rows()[0].urls == ["https://x/1.png?sig=[redacted]"]
        assert ledger.blank_links(client.redact_url) == 0  # looked through once, for good


def test_saves_are_committed_by_the_writer_and_a_second_process_is_kept_out(
    tmp_path: Path,
) -> None:
    with planned(tmp_path, [row(1)]) as ledger:
        line = ledger.rows()[0]
        line.state, line.task_id = RUNNING, "1"
        ledger.save(line)
        ledger.flush()
        assert ledger.rows()[0].task_id == "1"
        with pytest.raises(BatchLockedError) as raised, Ledger.open(tmp_path):
            pass
        assert raised.value.code == "batch_locked"
    with Ledger.open(tmp_path) as again:  # free once the first is closed
        plan(again, [row(1)])
