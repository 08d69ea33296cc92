"""The shared store's holds (DESIGN 16, 25) at their edges: a question cancelled while it sleeps
for a place, a store that dies while questions sleep, and the blocking driver's hold on a thread
that runs an event loop. Pinned when both drivers' operations became one set of coroutines."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import anyio
import pytest

from imggw_client import AsyncClient, Client, RateLimit, _rate_store

from ..loopback import RedisServer

KEY = "sk-store-driver-review-5c1e"
ENDED = {"limited": False, "retry_after": None, "backoff": (0.5, 8.0)}


def line(service: Any, kind: str = "submit") -> tuple[int, bool]:
    """The questions asleep for a place, and whether one of them polls."""
    return len(service._sleepers[kind]), service._poller[kind] is not None


@pytest.mark.anyio
async def test_a_question_cancelled_in_its_hold_leaves_the_line_and_hands_on_its_polling(
    redis_store: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_rate_store, "HOLD", 60.0)  # no question is handed back meanwhile
    limit = RateLimit(store=redis_store.url)  # no ceiling: a start window of four
    client = AsyncClient(api_key=KEY, base_url="https://gateway.test", rate_limit=limit)
    service: Any = client._flows.budget.service  # type: ignore[union-attr]
    flying = [await service.reserve("submit") for _ in range(4)]
    assert [wait for _, wait in flying] == [0.0] * 4
    got: dict[str, tuple[Any, float]] = {}
    cancelled: list[str] = []
    scopes: dict[str, anyio.CancelScope] = {}

    async def until(done: Any) -> None:
        with anyio.fail_after(10):
            while not done():
                await anyio.sleep(0.005)

    async def waiter(name: str) -> None:
        with anyio.CancelScope() as scopes[name]:
            got[name] = await service.reserve("submit")
        if scopes[name].cancelled_caught:
            cancelled.append(name)

    async with anyio.create_task_group() as group:
        group.start_soon(waiter, "first")
        await until(lambda: line(service) == (1, True))  # the first asleep polls
        first_poller = service._poller["submit"]
        group.start_soon(waiter, "second")
        await until(lambda: line(service)[0] == 2)
        scopes["first"].cancel()  # the poller, cancelled in its hold
        await until(lambda: cancelled == ["first"])
        # Out of the line at once, and the next in line woke, asked, and polls in its turn.
        await until(lambda: line(service) == (1, True))
        assert service._poller["submit"] is not first_poller
        assert got == {}
        await service.finished(flying[0][0], **ENDED)  # a place frees: the second has it
        await until(lambda: "second" in got)
    assert got["second"][1] == 0.0
    assert line(service) == (0, False)
    for ticket, _ in [*flying[1:], got["second"]]:
        await service.finished(ticket, **ENDED)
    with redis_store.client() as store:
        assert store.zcard(service.keys["submit"][1]) == 0
    await client.close()


def test_a_store_that_dies_while_questions_sleep_sends_them_on_alone(
    redis_store: RedisServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(_rate_store, "HOLD", 60.0)
    limit = RateLimit(store=redis_store.url)
    client = Client(api_key=KEY, base_url="https://gateway.test", rate_limit=limit)
    service: Any = client._flows.budget.service  # type: ignore[union-attr]
    flying = [service.reserve("submit") for _ in range(4)]
    out: dict[int, Any] = {}

    def ask(n: int) -> None:
        try:
            out[n] = service.reserve("submit")
        except BaseException as exc:  # an AssertionError here: the blocking driver suspended
            out[n] = exc

    threads = [threading.Thread(target=ask, args=(n,)) for n in range(2)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 10
    while line(service) != (2, True) and time.monotonic() < deadline:
        time.sleep(0.005)
    assert line(service) == (2, True)
    redis_store.stop()
    with caplog.at_level(logging.WARNING, logger="imggw_client"):
        service.finished(flying[0][0], **ENDED)  # fails quietly; the woken one asks and fails
        for thread in threads:
            thread.join(10)
    assert all(isinstance(answer, tuple) for answer in out.values()), out
    assert all(ticket.local is not None for ticket, _ in out.values())  # paced alone
    assert line(service) == (0, False)
    warned = [r.getMessage() for r in caplog.records if "rate store" in r.getMessage()]
    (warning,) = warned
    assert "not usable (ConnectionError)" in warning
    client.close()


def test_the_blocking_drivers_hold_runs_on_a_thread_with_a_running_event_loop(
    redis_store: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A Client used inside async code: its operations are coroutines run with one send, which
    # must neither touch the running loop nor suspend, even through a hold.
    monkeypatch.setattr(_rate_store, "HOLD", 0.2)
    limit = RateLimit(store=redis_store.url)
    client = Client(api_key=KEY, base_url="https://gateway.test", rate_limit=limit)
    service: Any = client._flows.budget.service  # type: ignore[union-attr]

    async def inside() -> tuple[list[float], float, float]:
        waits = [service.reserve("submit")[1] for _ in range(4)]
        began = time.monotonic()
        _, wait = service.reserve("submit")  # a full window: held here, asleep, for HOLD
        return waits, wait, time.monotonic() - began

    waits, wait, took = anyio.run(inside)
    assert waits == [0.0] * 4
    assert wait > 0
    assert took >= 0.15
    assert line(service) == (0, False)
    client.close()
