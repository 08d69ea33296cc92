"""Key memory (DESIGN 22): a journaled submit of unknown outcome first sent longer ago than the
gateway remembers keys is never sent again by a collect (the gateway would bill a second task):
it is reported (one WARNING naming the key, ``CollectReport.stale_keys``, exit 1) and left in the
journal as it is. A resend keeps the row's first-send time. A batch line's first send is kept
in its ledger and judged the same way. Over a real loopback socket,
against the reference gateway."""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import time
from pathlib import Path

import anyio
import pytest

from imggw_client import AsyncClient, Client, ImageRequest, RetryPolicy
from imggw_client._core.states import Sending
from imggw_client.batch import BatchReport, run_batch
from imggw_client.batch._schema import LEDGER_NAME
from imggw_client.mock import MockGateway
from imggw_client.tracking import CollectReport, Tracker

from ..journals import FAST, KEY, rows

HOUR = 3600.0


def _collect(url: str, journal: Path, dest: Path, **client: object) -> CollectReport:
    async def main() -> CollectReport:
        async with AsyncClient(KEY, url, poll=FAST, journal=journal, **client) as c:  # type: ignore[arg-type]
            return await Tracker(c).collect(dest)

    return anyio.run(main)


def posts(gw: MockGateway) -> int:
    """Submits the gateway received (every POST route)."""
    return sum(n for route, n in gw.stats()["requests"].items() if route.startswith("POST"))


def _age(path: Path, seconds: float) -> None:
    """Moves every row's first send ``seconds`` into the past (as a row written then)."""
    with sqlite3.connect(path) as db:
        db.execute("UPDATE tasks SET created = created - ?", (seconds,))


@pytest.mark.gateway(idempotency_ttl=HOUR, manual_clock=True)
def test_an_unknown_submit_older_than_the_gateways_key_memory_is_reported_never_resent(
    served_gateway: tuple[MockGateway, str], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    gw, url = served_gateway
    path = tmp_path / "j.sqlite"
    key = "fox-key-0123456789abcdef"
    # The submit left and was billed; its answer was lost (the journal says unknown).
    with Client(KEY, url) as bare:
        bare.submit("a fox", idempotency_key=key)
    with Client(KEY, url, journal=path) as client:
        assert client.journal is not None
        client.journal.record(Sending(key, "beta", ImageRequest("a fox")), client.journal_scope)
    _age(path, 2 * HOUR)
    gw.advance(2 * HOUR)  # the gateway forgot the key: a resend would make a second task
    before = posts(gw)
    with caplog.at_level(logging.WARNING, logger="imggw_client"):
        report = _collect(url, path, tmp_path / "out", idempotency_window=HOUR)
    assert posts(gw) == before  # nothing sent
    assert gw.stats()["tasks_created"] == 1  # billed once, never twice
    assert report.stale_keys == [key]
    assert report.exit_code == 1
    assert (report.saved, report.running, report.unresolved_keys) == ([], [], [])
    warned = [r for r in caplog.records if key in r.getMessage()]
    assert len(warned) == 1
    assert warned[0].levelno == logging.WARNING
    assert "idempotency_window" in warned[0].getMessage()
    assert KEY not in caplog.text
    (row,) = rows(path)
    assert (row["idempotency_key"], row["state"], row["task_id"]) == (key, "unknown", None)


@pytest.mark.gateway(idempotency_ttl=HOUR, duration_min=0.01, duration_max=0.02)
def test_within_the_window_the_same_row_is_resent_and_billed_once(
    served_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    gw, url = served_gateway
    path = tmp_path / "j.sqlite"
    key = "owl-key-0123456789abcdef"
    with Client(KEY, url) as bare:
        # Finished before the collect, which asks once (it does not wait): how soon that ask
        # comes is no part of what is tested.
        bare.wait(bare.submit("an owl", idempotency_key=key).task_id)
    with Client(KEY, url, journal=path) as client:
        assert client.journal is not None
        client.journal.record(Sending(key, "beta", ImageRequest("an owl")), client.journal_scope)
    _age(path, HOUR / 2)
    report = _collect(url, path, tmp_path / "out", idempotency_window=HOUR)
    assert gw.stats()["tasks_created"] == 1  # the key replayed the task
    assert report.stale_keys == []
    assert len(report.saved) == 1  # the same task, found again and saved


def test_a_resend_keeps_the_rows_first_send_time(
    served_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    gw, url = served_gateway
    path = tmp_path / "j.sqlite"
    with Client(KEY, url, poll=FAST, journal=path) as client:
        first = client.submit("a fox")
        (before,) = rows(path)
        again = client.submit("a fox", idempotency_key=first.idempotency_key)
    (after,) = rows(path)
    assert again.task_id == first.task_id
    assert after["created"] == before["created"]
    assert gw.stats()["tasks_created"] == 1


def _age_lines(folder: Path, seconds: float) -> None:
    """Moves every batch line's first send ``seconds`` into the past."""
    with contextlib.closing(sqlite3.connect(folder / LEDGER_NAME)) as db, db:
        db.execute("UPDATE tasks SET first_sent = first_sent - ?", (seconds,))


def _lines(folder: Path) -> list[tuple[str, str, float | None]]:
    with contextlib.closing(sqlite3.connect(folder / LEDGER_NAME)) as db:
        found = db.execute("SELECT idempotency_key, state, first_sent FROM tasks ORDER BY line")
        return list(found)


@pytest.mark.gateway(
    duration_min=0.01, duration_max=0.02, retry_after=0, fault_rate=1.0, faults=["lost"]
)
def test_a_batch_line_whose_key_may_be_forgotten_is_held_back_until_the_window_allows(
    served_gateway: tuple[MockGateway, str], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    gw, url = served_gateway
    source = tmp_path / "in.txt"
    source.write_text("a fox\nan owl\n")
    out = tmp_path / "out"
    quick = RetryPolicy(max_attempts=2, initial_backoff=0.01, max_backoff=0.02)

    def run(window: float) -> BatchReport:
        return run_batch(
            source,
            out,
            timeout=1.0,
            client_factory=lambda: AsyncClient(
                KEY, url, poll=FAST, retry=quick, idempotency_window=window
            ),
        )

    before = time.time()
    first = run(HOUR)  # every answer lost: two tasks made and billed, their ids unknown
    assert first.counts == {"pending": 2}
    assert gw.stats()["tasks_created"] == 2
    sent = _lines(out)
    # Each line's first send is kept, once, however many tries followed it.
    assert all(
        state == "unknown" and when is not None and when >= before for _, state, when in sent
    )

    gw.configure(fault_rate=0.0)
    _age_lines(out, 2 * HOUR)
    posted = posts(gw)
    with caplog.at_level(logging.WARNING, logger="imggw_client"):
        held = run(HOUR)
    assert posts(gw) == posted  # nothing sent: the gateway may have forgotten both keys
    assert held.exit_code == 3
    assert held.counts == {"pending": 2}
    for key, _, _ in sent:
        (warned,) = [r for r in caplog.records if key in r.getMessage()]
        assert "idempotency_window" in warned.getMessage()
    assert KEY not in caplog.text
    assert [(k, s) for k, s, _ in _lines(out)] == [(k, s) for k, s, _ in sent]

    # The caller's explicit word (a gateway that remembers keys longer): sent again with
    # their keys, the same two tasks found, nothing billed twice, the first send kept.
    again = run(3 * HOUR)
    assert again.exit_code == 0
    assert again.counts == {"saved": 2}
    assert gw.stats()["tasks_created"] == 2
    assert [when for _, _, when in _lines(out)] == [when - 2 * HOUR for _, _, when in sent]
