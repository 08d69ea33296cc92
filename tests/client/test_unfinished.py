"""``unfinished()`` (DESIGN 22): a journaled submit whose outcome is unknown is sent again with
its key, several at once under the client's budget, unless its first send is older than the
gateway's memory of keys (``idempotency_window``): then it is reported, never sent, until the
caller asks. Both clients, over a real loopback socket, the gateway on a manual clock."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path
from typing import Any

import anyio
import pytest

from imggw_client import (
    AsyncClient,
    Client,
    ImageRequest,
    PollPolicy,
    RetryPolicy,
    UnknownOutcomeError,
)
from imggw_client.mock import ManualClock, MockGateway, MockRequest, MockResponse

from ..conftest import CANARY_KEY, Driven, FakeTime, make_client
from ..journals import rows

FAST = PollPolicy(initial_interval=0.02, max_interval=0.1)
pytestmark = pytest.mark.gateway(
    api_keys=[CANARY_KEY], manual_clock=True, duration_min=1, duration_max=1
)


async def lost_submit(client: Driven, gw: MockGateway, prompt: str, key: str) -> None:
    """A submit whose every answer is lost: the task is made and billed, the journal's row
    keeps its outcome unknown (as a process killed while it was in flight leaves it)."""
    gw.configure(fault_rate=1.0, faults=("lost",))
    try:
        with pytest.raises(UnknownOutcomeError):
            await client.submit(prompt, idempotency_key=key)
    finally:
        gw.configure(fault_rate=0.0)


def first_sent(journal: Path, key: str, seconds_ago: float) -> None:
    """Moves a row's first send ``seconds_ago`` into the past, as if it had been written then."""
    with sqlite3.connect(journal) as db:
        db.execute(
            "UPDATE tasks SET created = created - ? WHERE idempotency_key = ?", (seconds_ago, key)
        )


@pytest.mark.anyio
@pytest.mark.gateway(idempotency_ttl=3600)
async def test_a_submit_sent_before_the_gateway_forgot_its_key_is_held_back_until_asked(
    kind: str,
    fake_time: FakeTime,
    gateway: MockGateway,
    shared_gateway_url: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    journal = tmp_path / "journal.sqlite"
    client = make_client(
        kind,
        fake_time,
        base_url=shared_gateway_url,
        journal=journal,
        poll=FAST,
        idempotency_window=3600,
    )
    old, recent = "key-sent-two-hours-ago", "key-sent-just-now"
    try:
        await lost_submit(client, gateway, "a fox", old)
        gateway.advance(7200)  # the gateway has forgotten the old key: it would bill it again
        first_sent(journal, old, 7200)
        await lost_submit(client, gateway, "a cat", recent)
        assert gateway.stats()["tasks_created"] == 2
        caplog.set_level(logging.WARNING, logger="imggw_client")
        caplog.clear()

        subs = await client.unfinished()

        assert [s.idempotency_key for s in subs] == [recent]  # replayed: the gateway knows it
        assert gateway.stats()["tasks_created"] == 2  # the old one was not sent
        said = [r.getMessage() for r in caplog.records if old in r.getMessage()]
        assert len(said) == 1
        assert "unfinished(resend_expired_keys=True)" in said[0]
        assert "idempotency_window=3600s" in said[0]
        assert CANARY_KEY not in caplog.text
        held = [r for r in rows(journal) if r["idempotency_key"] == old]
        assert [(r["task_id"], r["state"]) for r in held] == [(None, "unknown")]  # kept as is

        again = await client.unfinished(resend_expired_keys=True)  # the caller's choice

        assert old in [s.idempotency_key for s in again]
        assert gateway.stats()["tasks_created"] == 3  # what the default spared: a second bill
    finally:
        await client.close()


class Gathering:
    """The reference gateway whose submits, once ``armed``, wait for ``size`` of them to be in
    flight at once (or for ``patience`` seconds); ``peak`` is the most seen at once."""

    def __init__(self, gateway: MockGateway, size: int, patience: float = 5.0) -> None:
        self.app, self.size, self.patience = gateway.asgi(), size, patience
        self.armed, self.in_flight, self.peak = False, 0, 0
        self.full: anyio.Event | None = None

    def asgi(self) -> Gathering:
        return self

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if not self.armed or scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        if self.full is None:  # made on the server's own event loop
            self.full = anyio.Event()
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            if self.in_flight >= self.size:
                self.full.set()
            with anyio.move_on_after(self.patience):  # one at a time: each waits in vain
                await self.full.wait()
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1


@pytest.mark.anyio
async def test_unknown_outcomes_are_sent_again_several_at_once_each_replayed(
    kind: str, gateway: MockGateway, shared_serve: Any, tmp_path: Path
) -> None:
    gathering = Gathering(gateway, size=4)
    journal = tmp_path / "journal.sqlite"
    # On real time: requests the budget's start window holds back wait for answers, which a
    # fake sleep on the event loop would never let come.
    cls = Client if kind == "sync" else AsyncClient
    client = Driven(
        cls(
            CANARY_KEY,
            shared_serve(gathering),
            journal=journal,
            poll=FAST,
            retry=RetryPolicy(max_attempts=1),
        )
    )
    keys = [f"resent-{i}" for i in range(8)]
    try:
        for i, key in enumerate(keys):
            await lost_submit(client, gateway, f"picture {i}", key)
        gathering.armed = True

        subs = await client.unfinished()

        assert gathering.peak >= 4  # one at a time, each would have waited in vain
        assert sorted(s.idempotency_key for s in subs) == sorted(keys)
        assert gateway.stats()["tasks_created"] == 8  # each replayed, none billed twice
        assert all(r["task_id"] is not None for r in rows(journal))
        # Each carries what was asked, from the journal: no need to read it.
        asked = {s.idempotency_key: s.request for s in subs}
        assert asked[keys[3]] == ImageRequest("picture 3")
    finally:
        await client.close()


@pytest.mark.anyio
async def test_a_resend_that_fails_stays_that_rows_and_the_others_are_resumed(
    kind: str,
    fake_time: FakeTime,
    shared_serve: Any,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A gateway of its own: one of its answers is dropped on purpose below.
    gw = MockGateway(api_keys=[CANARY_KEY], clock=ManualClock(), duration_min=1, duration_max=1)
    journal = tmp_path / "journal.sqlite"
    client = make_client(kind, fake_time, base_url=shared_serve(gw), journal=journal, poll=FAST)
    try:
        for i in range(3):
            await lost_submit(client, gw, f"picture {i}", f"key-{i}")
        # The resend of one of them loses its answer again (the gateway replays it, unread).
        handle = gw.handle

        def flaky(request: MockRequest) -> MockResponse:
            answer = handle(request)
            if request.method == "POST" and b"picture 1" in request.body:
                return MockResponse(0, drop=True)
            return answer

        gw.handle = flaky  # type: ignore[method-assign]
        caplog.set_level(logging.WARNING, logger="imggw_client")

        subs = await client.unfinished()

        assert sorted(s.idempotency_key for s in subs) == ["key-0", "key-2"]
        assert "key-1" in caplog.text
        assert "was not resumed" in caplog.text
        left = [r for r in rows(journal) if r["task_id"] is None]
        assert [r["idempotency_key"] for r in left] == ["key-1"]  # kept for the next call
        assert gw.stats()["tasks_created"] == 3
    finally:
        await client.close()
