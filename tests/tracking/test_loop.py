"""The tracker's run loop (``tracking/_loop.py``): a bounded window of items in flight, an
item's wait given what its submit made (so its polls go by what the client learned), and what
the loop does with an item told by the item itself, through a store and hooks held in memory."""

from __future__ import annotations

import contextlib
import functools
import math
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from imggw_client import AsyncClient, DownloadedFile, ImggwError, RetryPolicy, Submission, Task
from imggw_client._core.states import WORK, State, Work
from imggw_client.batch import arun_batch
from imggw_client.batch._ledger import Ledger
from imggw_client.batch._lines import COLLECT
from imggw_client.batch._schema import RUNNING, UNKNOWN
from imggw_client.mock import IN_PROCESS_URL, MockGateway, MockRequest, MockResponse
from imggw_client.tracking import _loop
from imggw_client.tracking._loop import waited
from imggw_client.tracking._store import Course, in_order

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
@pytest.mark.gateway(manual_clock=True)  # no task finishes unless told
async def test_no_more_lines_are_in_flight_than_the_window_holds(
    gateway: MockGateway, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_loop, "MIN_IN_FLIGHT", 3)
    monkeypatch.setattr(_loop, "IN_FLIGHT_PER_SLOT", 1)
    held = HeldQueries(gateway)
    source = [f"p{n}" for n in range(10)]
    client = AsyncClient(
        api_key=gateway.config.api_keys[0], base_url=IN_PROCESS_URL, transport=held
    )
    async with client, anyio.create_task_group() as group:
        group.start_soon(
            functools.partial(arun_batch, source, tmp_path / "out", client=client, concurrency=2)
        )
        with anyio.fail_after(60):  # a run that never sends three fails, never hangs
            while gateway.stats()["tasks_created"] < 3:
                await anyio.sleep(0.01)
        await anyio.wait_all_tasks_blocked()  # every line that could go has gone
        assert gateway.stats()["tasks_created"] == 3  # max(3, 2 x 1): the window is full
        group.cancel_scope.cancel()
    with Ledger.open(tmp_path / "out") as ledger:
        assert ledger.totals().counts == {RUNNING: 3, UNKNOWN: 7}


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


@dataclass
class _Item:
    """An item held in memory, as a store other than the batch's keeps them."""

    line: int
    fields: dict[str, Any]
    idempotency_key: str | None
    task_id: str | None = None
    made_here: bool = True
    surface: str = "beta"
    submitted_at: float | None = None
    urls: list[str] = field(default_factory=list)
    expires_at: float | None = None
    state: State = State.UNKNOWN


class _Memory:
    """A store and hooks in memory: what the loop needs of a store, and no more."""

    def __init__(self, items: list[_Item], dest: Path) -> None:
        self.items, self.dest = items, dest
        self.failed: dict[int, str] = {}
        self.terminal: list[str] = []
        self.sent: list[int] = []  # lines whose submit was about to leave, each time

    def chunk(self, after: int) -> list[_Item]:
        return in_order(self.items, after)

    def work(self, item: _Item) -> Work | None:
        return WORK[item.state]

    def sending(self, item: _Item) -> None:
        self.sent.append(item.line)

    def reached(self, item: _Item, state: State) -> None:
        item.state = state

    def fail(self, item: _Item, code: str, message: str) -> None:
        item.state, self.failed[item.line] = State.FAILED, code

    def expire(self, item: _Item, message: str) -> None:
        item.state = State.EXPIRED

    def left_for_next_run(self, item: _Item, why: str) -> None:
        raise AssertionError(why)

    def unexpected_fault(self, item: _Item, exc: Exception) -> None:
        raise AssertionError(exc)

    def landing(self, item: _Item) -> Path:
        return self.dest

    def prefix(self, item: _Item) -> str:
        return ""

    async def keep(self, item: _Item, files: list[DownloadedFile]) -> None:
        assert all(f.path.parent == self.dest for f in files)

    @contextlib.asynccontextmanager
    async def admit(self, item: _Item) -> AsyncIterator[bool]:
        yield True

    @contextlib.contextmanager
    def working(self, item: _Item) -> Iterator[None]:
        yield

    async def unsent(self, item: _Item, err: ImggwError | None) -> None:
        raise AssertionError(err)

    async def charged(self, item: _Item, task: Task, *, final: bool) -> None:
        pass

    async def ended(self, item: _Item, task: Task) -> None:
        self.terminal.append(task.id)

    async def saved(self, item: _Item) -> None:
        pass


@pytest.mark.anyio
@pytest.mark.gateway(duration_min=0.01, duration_max=0.02)
async def test_what_an_item_is_says_what_the_loop_does_with_it(
    gateway: MockGateway, tmp_path: Path
) -> None:
    """No mode of the loop: an item with no task id is submitted with its key, one with an id
    is waited on and never submitted, and a NotFound is asked again a few times only for an
    item its store made (a task just made may not be visible everywhere yet)."""
    asked: Counter[str] = Counter()
    handle = gateway.handle

    def spy(request: MockRequest) -> MockResponse:
        if request.method == "GET" and "/tasks/" in request.path:
            asked[request.path.rsplit("/", 1)[1]] += 1
        return handle(request)

    gateway.handle = spy  # type: ignore[method-assign]
    retry = RetryPolicy(max_attempts=2, initial_backoff=0.001, max_backoff=0.002)
    async with gateway.async_client(retry=retry) as client:
        made_elsewhere = await client.submit("made elsewhere")
        fields = {"prompt": "a fox", "aspect_ratio": "auto", "resolution": "1k"}
        items = [
            _Item(1, fields, "key-fox"),
            _Item(
                2, {}, None, task_id=made_elsewhere.task_id, made_here=False, state=State.RUNNING
            ),
            _Item(3, {}, None, task_id="888888", made_here=False, state=State.RUNNING),
            _Item(4, {"resolution": "1k"}, "key-gone", task_id="999999", state=State.RUNNING),
        ]
        memory = _Memory(items, tmp_path)
        course = Course(deadline=math.inf, line_timeout=None, redact=client.redact)
        await _loop.Loop(client, memory, memory, course, concurrency=2).run()
    assert gateway.stats()["tasks_created"] == 2  # the one made elsewhere, and the fox: none resent
    assert memory.sent == [1]  # the store was told before the fox's submit left, and only then
    assert [item.state for item in items[:2]] == [State.SAVED, State.SAVED]
    assert memory.failed == {3: "not_found", 4: "not_found"}  # each fails alone
    assert asked["888888"] == 1  # made elsewhere: its NotFound counts at once
    assert asked["999999"] == _loop.NOT_FOUND_TRIES  # made here: asked again a few times
    assert sorted(memory.terminal) == sorted([made_elsewhere.task_id, items[0].task_id])
