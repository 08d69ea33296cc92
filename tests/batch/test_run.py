"""A run's lines as they move (``batch/_run.py``): moves held to the table, the counts and
money a report shows, and what a failure means for a line (tried again, left for the next run,
or the end of the run)."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pytest

from imggw_client import ImageRequest
from imggw_client._core.exceptions import (
    AuthenticationError,
    DownloadError,
    InvalidRequestError,
    NotFoundError,
    RateLimitError,
    ServerError,
    UnknownOutcomeError,
)
from imggw_client._files import StorageError
from imggw_client.batch._admission import Charge, Room
from imggw_client.batch._ledger import Ledger
from imggw_client.batch._schema import FAILED, RUNNING, SAVED, SUCCEEDED, UNKNOWN
from imggw_client.batch._store import FATAL, LEFT_LOGGED, RunLines, retry_later

from .ledgers import planned, row


def run_over(
    ledger: Ledger,
    *,
    deadline: float = math.inf,
    line_timeout: float | None = None,
    redact=lambda text: text.replace("sk-secret", "***"),
) -> RunLines:
    return RunLines(
        ledger,
        ledger.totals(),
        Room(Path(".")),
        deadline=deadline,
        line_timeout=line_timeout,
        redact=redact,
    )


@pytest.mark.anyio  # a run's cancel scope belongs to its event loop
async def test_each_move_keeps_the_counts_the_times_and_the_ledger(tmp_path: Path) -> None:
    lines = [row(1), row(2, RUNNING, task_id="2")]
    with planned(tmp_path, lines) as ledger:
        run = run_over(ledger)
        told: list[int] = []
        run.tell = lambda at_once: told.append(1)
        first = ledger.rows()[0]
        run.move(first, RUNNING)
        run.move(first, SUCCEEDED)
        assert first.completed_at is not None
        assert first.finished_at is None
        run.move(first, SAVED)
        assert first.finished_at is not None
        assert (run.finished_here, run.total, len(told)) == (1, 2, 3)
        assert dict(run.counts) == {UNKNOWN: 0, RUNNING: 1, SUCCEEDED: 0, SAVED: 1}
        assert run.unsaved == 1
        with pytest.raises(AssertionError, match="line 1: no move from saved to running"):
            run.move(first, RUNNING)  # not in the table
        second = ledger.rows()[1]
        run.fail(second, "content_policy", "refused")
        ledger.flush()
        assert [(r.state, r.error_code) for r in ledger.rows()] == [
            (SAVED, None),
            (FAILED, "content_policy"),
        ]


@pytest.mark.anyio  # a run's cancel scope belongs to its event loop
async def test_a_move_at_once_is_written_before_the_run_begins(tmp_path: Path) -> None:
    with planned(tmp_path, [row(1, SAVED, task_id="1")]) as ledger:
        run = run_over(ledger)
        run.move(ledger.rows()[0], SUCCEEDED, at_once=True)
        assert ledger.rows()[0].state is SUCCEEDED  # no flush needed: no writer thread


@pytest.mark.anyio  # a run's cancel scope belongs to its event loop
async def test_money_follows_charges_and_a_credit_without_a_cost_counts_as_unknown(
    tmp_path: Path,
) -> None:
    with planned(tmp_path, [row(1)]) as ledger:
        run = run_over(ledger)
        run.charged(Charge(), Charge(4.0, None))
        assert (run.credits, run.cost, run.cost_unknown) == (4.0, 0.0, 1)
        run.charged(Charge(4.0, None), Charge(4.0, 0.01))
        assert (run.credits, run.cost, run.cost_unknown) == (4.0, 0.01, 0)


def test_what_is_tried_again_later_and_what_ends_the_run() -> None:
    request = ImageRequest("a fox")
    lost = UnknownOutcomeError("lost", idempotency_key="k", request=request, surface="beta")
    assert retry_later(lost)  # its key makes another try safe
    assert retry_later(ServerError("boom", status_code=503))
    assert retry_later(RateLimitError("slow down", status_code=429))
    assert retry_later(DownloadError("reset", code="download_failed"))
    assert not retry_later(DownloadError("a page, not an image", code="not_an_image"))
    assert not retry_later(InvalidRequestError("bad", status_code=400))
    assert not retry_later(NotFoundError("gone", status_code=404))
    assert not retry_later(AuthenticationError("no", status_code=401))  # fatal, not later
    assert not retry_later(ValueError("a bug"))
    assert AuthenticationError in FATAL
    assert StorageError in FATAL


@pytest.mark.anyio  # a run's cancel scope belongs to its event loop
async def test_a_lines_step_gives_up_at_the_line_timeout_or_the_run_deadline(
    tmp_path: Path,
) -> None:
    with planned(tmp_path, [row(1)]) as ledger:
        assert run_over(ledger, deadline=5.0, line_timeout=60.0).line_deadline() == 5.0
        far = run_over(ledger, line_timeout=60.0).line_deadline()
        assert math.isfinite(far)
        assert run_over(ledger).line_deadline() == math.inf


@pytest.mark.anyio  # a run's cancel scope belongs to its event loop
async def test_lines_left_for_the_next_run_are_logged_one_by_one_then_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with planned(tmp_path, [row(1, RUNNING, task_id="77")]) as ledger:
        run = run_over(ledger)
        line = ledger.rows()[0]
        with caplog.at_level(logging.WARNING, logger="imggw_client"):
            for _ in range(LEFT_LOGGED + 5):
                run.left_for_next_run(line, "its status query failed (server_error)")
        assert run.left == LEFT_LOGGED + 5
        assert len(caplog.records) == LEFT_LOGGED
        assert caplog.records[0].getMessage() == (
            "line 1 (task 77): its status query failed (server_error); it stays running for "
            "the next run"
        )
        assert caplog.records[-1].getMessage().endswith("; later ones are counted, not logged")


@pytest.mark.anyio  # a run's cancel scope belongs to its event loop
async def test_an_unexpected_fault_ends_one_lines_step_and_never_logs_the_key(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with planned(tmp_path, [row(1)]) as ledger:
        run = run_over(ledger)
        try:
            raise RuntimeError("header Authorization: Bearer sk-secret")
        except RuntimeError as exc:
            with caplog.at_level(logging.ERROR, logger="imggw_client"):
                run.unexpected_fault(ledger.rows()[0], exc)
        (record,) = caplog.records
        assert "sk-secret" not in record.getMessage()
        assert record.getMessage().startswith("line 1: unexpected RuntimeError at test_run.py:")
        assert run.fatal is None
        assert run.unexpected == 1


@pytest.mark.anyio  # a run's cancel scope belongs to its event loop
async def test_a_fatal_error_ends_the_run_once(tmp_path: Path) -> None:
    with planned(tmp_path, [row(1)]) as ledger:
        run = run_over(ledger)
        first = AuthenticationError("no", status_code=401)
        run.stop(first)
        run.stop(StorageError("disk", code="storage_failed"))
        assert run.fatal is first
        assert run.cancel.cancel_called
        assert run.why(AuthenticationError("no", code="unauthorized")) == "unauthorized"
        # Without a code, the message, cleaned of the key, says what went wrong.
        assert run.why(ServerError("Bearer sk-secret broke", status_code=500)) == "Bearer *** broke"
