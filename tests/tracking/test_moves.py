"""Rows that are paid stay (DESIGN 22): a refusal removes a row only when that row's own first
request was refused; a submit reusing a journaled key for another request is refused before
anything is sent, the earlier row kept; a submit whose every request surely never left removes
its row, so a later collect never sends it. Over a real loopback socket, against the reference
gateway."""

from __future__ import annotations

import socket
import sqlite3
from pathlib import Path

import anyio
import pytest

from imggw_client import (
    APIConnectionError,
    AsyncClient,
    Client,
    IdempotencyConflictError,
    ImageRequest,
)
from imggw_client._core.states import NotSent, Refused, Sending
from imggw_client._journal.moves import apply
from imggw_client._journal.schema import transaction
from imggw_client.mock import MockGateway
from imggw_client.tracking import CollectReport, Journal, Scope, Tracker

from ..journals import FAST, KEY, TurkishRowcount, rows

SCOPE = Scope("http://127.0.0.1:9", "f" * 16)


def _collect(url: str, journal: Path, dest: Path) -> CollectReport:
    async def main() -> CollectReport:
        async with AsyncClient(KEY, url, poll=FAST, journal=journal) as client:
            return await Tracker(client).collect(dest, wait=True)

    return anyio.run(main)


def posts(gw: MockGateway) -> int:
    return sum(n for route, n in gw.stats()["requests"].items() if route.startswith("POST"))


def test_a_refusal_or_a_request_that_never_left_removes_only_the_row_its_own_call_made(
    tmp_path: Path,
) -> None:
    journal = Journal(tmp_path / "j.sqlite")
    fox = ImageRequest("a fox")
    journal.record(Sending("k-fox", "beta", fox, "call-1"), SCOPE)  # its first send: may be paid
    for later in (Refused("k-fox", "beta", "call-2"), NotSent("k-fox", "beta", "call-3")):
        journal.record(Sending("k-fox", "beta", fox, later.attempt), SCOPE)  # a resend
        journal.record(later, SCOPE)
        assert [e.idempotency_key for e in journal.tasks()] == ["k-fox"]  # kept
    journal.record(Sending("k-owl", "beta", ImageRequest("an owl"), "call-4"), SCOPE)
    journal.record(NotSent("k-owl", "beta", "call-4"), SCOPE)  # its own first: nothing left
    journal.record(Sending("k-cat", "beta", ImageRequest("a cat"), "call-5"), SCOPE)
    journal.record(Refused("k-cat", "beta", "call-5"), SCOPE)  # its own first: no task made
    assert [e.idempotency_key for e in journal.tasks()] == ["k-fox"]
    journal.close()


def test_a_journaled_key_is_refused_for_another_request_in_a_turkish_locale(
    tmp_path: Path,
) -> None:
    """Whether the submit's row was made is not read from the INSERT's rowcount, which a
    Turkish locale makes -1: the retyped prompt would then be sent, and refused by the gateway
    only (the key's paid task named nowhere in the error)."""
    path = tmp_path / "j.sqlite"
    journal = Journal(path)
    journal.record(Sending("k", "beta", ImageRequest("a fox"), "one"), SCOPE)
    journal.close()
    db = sqlite3.connect(path, isolation_level=None)
    try:
        with transaction(db), pytest.raises(IdempotencyConflictError):
            apply(
                TurkishRowcount(db),  # type: ignore[arg-type]
                Sending("k", "beta", ImageRequest("a fox!"), "two"),
                SCOPE,
                ("me", 0.0),
                path,
            )
    finally:
        db.close()
    (row,) = rows(path)
    assert row["prompt"] == "a fox"  # the paid row stays as it was


def test_a_retyped_prompt_reusing_a_journaled_key_is_refused_before_sending_and_the_paid_row_stays(
    served_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    gw, url = served_gateway
    path = tmp_path / "j.sqlite"
    key = "fox-key-0123456789abcdef"
    with Client(KEY, url) as bare:  # the fox's submit left and was paid; its answer was lost
        bare.submit("a fox", idempotency_key=key)
    with Client(KEY, url, poll=FAST, journal=path) as client:
        assert client.journal is not None
        client.journal.record(
            Sending(key, "beta", ImageRequest("a fox"), "lost-call"), client.journal_scope
        )
        before = posts(gw)
        for retyped in (
            {"prompt": "a fox!"},
            {"prompt": "a fox", "aspect_ratio": "16:9"},
            {"prompt": "a fox", "aspect_ratio": "1:1", "resolution": "2k"},
        ):
            with pytest.raises(IdempotencyConflictError) as refused:
                client.submit(**retyped, idempotency_key=key)  # type: ignore[arg-type]
            assert refused.value.code == "idempotency_key_reused"
            assert key in refused.value.message
            assert "nothing was sent" in refused.value.message
        assert posts(gw) == before  # nothing sent
    (row,) = rows(path)
    assert (row["idempotency_key"], row["state"], row["prompt"]) == (key, "unknown", "a fox")
    report = _collect(url, path, tmp_path / "out")
    assert len(report.saved) == 1  # the fox, found by its key and saved
    assert gw.stats()["tasks_created"] == 1


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_submit_that_never_left_leaves_no_row_for_a_later_collect_to_send(
    tmp_path: Path,
) -> None:
    port = _free_port()
    path = tmp_path / "j.sqlite"
    with Client(KEY, f"http://127.0.0.1:{port}", journal=path, max_retries=1) as client:
        with pytest.raises(APIConnectionError) as refused:  # nothing listens: never sent
            client.generate("a fox")
        assert refused.value.request_sent is False
    assert rows(path) == []
    gw = MockGateway(api_keys=[KEY], duration_min=0.01, duration_max=0.02)
    with gw.serve(port=port) as url:
        with Client(KEY, url, poll=FAST, journal=path) as client:
            task = client.generate("a fox")
            client.download(task, tmp_path / "out")
        report = _collect(url, path, tmp_path / "out")
        assert gw.stats()["tasks_created"] == 1  # one task billed, not two
    assert (report.saved, report.unresolved_keys) == ([], [])
    assert [r["state"] for r in rows(path)] == ["saved"]
