"""Key memory (DESIGN 22): a journaled submit of unknown outcome first sent longer ago than the
gateway remembers keys is never sent again by a collect (the gateway would bill a second task):
it is reported (one WARNING naming the key, ``CollectReport.stale_keys``, exit 1) and left in the
journal as it is. A resend keeps the row's first-send time. Over a real loopback socket,
against the reference gateway."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import anyio
import pytest

from imggw_client import AsyncClient, Client, ImageRequest
from imggw_client._core.states import Sending
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


def test_an_unknown_submit_older_than_the_gateways_key_memory_is_reported_never_resent(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    gw = MockGateway(api_keys=[KEY], idempotency_ttl=HOUR, manual_clock=True)
    path = tmp_path / "j.sqlite"
    key = "fox-key-0123456789abcdef"
    with gw.serve() as url:
        # The submit left and was billed; its answer was lost (the journal says unknown).
        with Client(KEY, url) as bare:
            bare.submit("a fox", idempotency_key=key)
        with Client(KEY, url, journal=path) as client:
            assert client.journal is not None
            client.journal.record(Sending(key, "beta", ImageRequest("a fox")),
                                  client.journal_scope)  # fmt: skip
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


def test_within_the_window_the_same_row_is_resent_and_billed_once(tmp_path: Path) -> None:
    gw = MockGateway(api_keys=[KEY], idempotency_ttl=HOUR, duration_min=0.01, duration_max=0.02)
    path = tmp_path / "j.sqlite"
    key = "owl-key-0123456789abcdef"
    with gw.serve() as url:
        with Client(KEY, url) as bare:
            bare.submit("an owl", idempotency_key=key)
        with Client(KEY, url, journal=path) as client:
            assert client.journal is not None
            client.journal.record(Sending(key, "beta", ImageRequest("an owl")),
                                  client.journal_scope)  # fmt: skip
        _age(path, HOUR / 2)
        report = _collect(url, path, tmp_path / "out", idempotency_window=HOUR)
        assert gw.stats()["tasks_created"] == 1  # the key replayed the task
    assert report.stale_keys == []
    assert len(report.saved) == 1  # the same task, found again and saved


def test_a_resend_keeps_the_rows_first_send_time(
    gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    gw, url = gateway
    path = tmp_path / "j.sqlite"
    with Client(KEY, url, poll=FAST, journal=path) as client:
        first = client.submit("a fox")
        (before,) = rows(path)
        again = client.submit("a fox", idempotency_key=first.idempotency_key)
    (after,) = rows(path)
    assert again.task_id == first.task_id
    assert after["created"] == before["created"]
    assert gw.stats()["tasks_created"] == 1
