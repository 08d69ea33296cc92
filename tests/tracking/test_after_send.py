"""After the send, the call's answer wins (DESIGN 22): a journal write that fails after the
submit's request left (another process holds the file past the busy timeout) never turns a
paid answer into an error: one WARNING names the key (never the API key), the row stays as it
was (a later collect replays its key) and the call returns. "Nothing was sent" is said only of
the submit's own row, written before the request leaves. Over a real loopback socket."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from imggw_client import AsyncClient, Client
from imggw_client._journal import journal as _journal
from imggw_client.mock import MockGateway, MockRequest, MockResponse
from imggw_client.tracking import StorageError

from ..journals import FAST, KEY, rows


@pytest.fixture
def locked_after_send(
    served_gateway: tuple[MockGateway, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[MockGateway, str, Path]]:
    """A gateway whose first submit, once it arrives (its row committed), finds the journal
    locked by another connection until the test ends; the journal waits 0.2 s for a lock."""
    gw, url = served_gateway
    path = tmp_path / "j.sqlite"
    monkeypatch.setattr(_journal, "BUSY_TIMEOUT_MS", 200)
    holder: list[sqlite3.Connection] = []
    handle = gw.handle

    def lock_then_answer(request: MockRequest) -> MockResponse:
        if request.method == "POST" and not holder:
            db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            db.execute("BEGIN IMMEDIATE")  # another process's write lock, held
            holder.append(db)
        return handle(request)

    gw.handle = lock_then_answer  # type: ignore[method-assign]
    yield gw, url, path
    for db in holder:
        db.rollback()
        db.close()


def _warned(caplog: pytest.LogCaptureFixture, key: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if key in r.getMessage() and r.levelno == logging.WARNING]


def test_a_submit_whose_answer_cannot_be_journaled_returns_it_and_warns_once(
    locked_after_send: tuple[MockGateway, str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    gw, url, path = locked_after_send
    with caplog.at_level(logging.WARNING), Client(KEY, url, poll=FAST, journal=path) as client:
        sub = client.submit("a fox")
        assert sub.task_id
    (warning,) = _warned(caplog, sub.idempotency_key)
    assert "did not record" in warning.getMessage()
    assert "nothing was sent" not in caplog.text
    assert KEY not in caplog.text
    (row,) = rows(path)
    assert (row["idempotency_key"], row["state"], row["task_id"]) == (
        sub.idempotency_key,
        "unknown",
        None,
    )  # as it was: a later collect replays its key
    assert gw.stats()["tasks_created"] == 1


def test_an_async_submit_too(
    locked_after_send: tuple[MockGateway, str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    _, url, path = locked_after_send

    async def main() -> str:
        async with AsyncClient(KEY, url, poll=FAST, journal=path) as client:
            return (await client.submit("a fox")).idempotency_key

    with caplog.at_level(logging.WARNING):
        key = anyio.run(main)
    assert len(_warned(caplog, key)) == 1
    assert [r["state"] for r in rows(path)] == ["unknown"]


def test_a_submits_own_row_that_cannot_be_written_is_an_error_before_sending(
    served_gateway: tuple[MockGateway, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gw, url = served_gateway
    path = tmp_path / "j.sqlite"
    monkeypatch.setattr(_journal, "BUSY_TIMEOUT_MS", 200)
    with Client(KEY, url, poll=FAST, journal=path) as client:
        locker = sqlite3.connect(path, isolation_level=None)
        locker.execute("BEGIN IMMEDIATE")
        try:
            with pytest.raises(StorageError) as failed:
                client.submit("a fox")
        finally:
            locker.rollback()
            locker.close()
    assert failed.value.code == "journal_failed"
    assert "nothing was sent" in failed.value.message
    assert sum(gw.stats()["requests"].values()) == 0
