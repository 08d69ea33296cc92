"""The tracker's run loop (``tracking/_loop.py``): a bounded window of items in flight, and an
item's wait given what its submit made (so its polls go by what the client learned)."""

from __future__ import annotations

import functools
from datetime import datetime, timezone
from pathlib import Path

import anyio
import httpx
import pytest

from imggw_client import AsyncClient, Submission
from imggw_client.batch import arun_batch
from imggw_client.batch._ledger import Ledger
from imggw_client.batch._lines import COLLECT
from imggw_client.batch._states import PENDING, RUNNING
from imggw_client.mock import IN_PROCESS_URL, MockGateway
from imggw_client.tracking import _loop
from imggw_client.tracking._loop import waited

from ..batch.ledgers import row


class HeldQueries(httpx.AsyncBaseTransport):
    """The gateway in process, its status queries held until released: a line in flight
    stays in flight, without a poll going round."""

    def __init__(self, gw: MockGateway) -> None:
        self.inner = gw.transport()
        self.released = anyio.Event()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            await self.released.wait()
        return await self.inner.handle_async_request(request)


@pytest.mark.anyio
async def test_no_more_lines_are_in_flight_than_the_window_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_loop, "MIN_IN_FLIGHT", 3)
    monkeypatch.setattr(_loop, "IN_FLIGHT_PER_SLOT", 1)
    gw = MockGateway(manual_clock=True)  # no task finishes unless told
    held = HeldQueries(gw)
    source = [f"p{n}" for n in range(10)]
    client = AsyncClient(api_key=gw.config.api_keys[0], base_url=IN_PROCESS_URL, transport=held)
    async with client, anyio.create_task_group() as group:
        group.start_soon(functools.partial(arun_batch, source, tmp_path / "out",
                                           client=client, concurrency=2))  # fmt: skip
        with anyio.fail_after(60):  # a run that never sends three fails, never hangs
            while gw.stats()["tasks_created"] < 3:
                await anyio.sleep(0.01)
        await anyio.wait_all_tasks_blocked()  # every line that could go has gone
        assert gw.stats()["tasks_created"] == 3  # max(3, 2 x 1): the window is full
        group.cancel_scope.cancel()
    with Ledger.open(tmp_path / "out") as ledger:
        assert ledger.totals().counts == {RUNNING: 3, PENDING: 7}


def test_a_lines_wait_is_given_its_submission_or_a_collected_tasks_id() -> None:
    sent = row(1, RUNNING, task_id="71", submitted_at=1_700_000_000.0, resolution="2k")
    given = waited(sent)
    assert isinstance(given, Submission)
    assert (given.task_id, given.idempotency_key, given.resolution) == ("71", "key-1", "2k")
    assert given.submitted_at == datetime.fromtimestamp(1_700_000_000.0, timezone.utc)
    assert not given.replayed
    replayed = waited(row(2, RUNNING, task_id="72", submitted_at=None))
    assert isinstance(replayed, Submission)
    assert replayed.replayed
    assert waited(row(3, RUNNING, task_id="73", kind=COLLECT, idempotency_key=None)) == "73"
