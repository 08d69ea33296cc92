"""The request budget in use: on a fake clock through the flows, and over a real loopback
socket with threads of a Client, tasks of an AsyncClient, and the reference gateway's limits."""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Hashable, Iterator
from typing import Any

import anyio
import httpx
import pytest

from imggw_client import (
    AsyncClient,
    Client,
    ConfigurationError,
    PollPolicy,
    RateLimit,
    RetryPolicy,
    TaskFailedError,
    WaitTimeoutError,
)
from imggw_client._core.budget import RemoteBudget
from imggw_client._core.interruptions import interrupt
from imggw_client._core.wire import Observe, Pace, Reply, Send, Sleep
from imggw_client.mock import MockGateway

from ..conftest import Driven, beta_error, beta_task
from ..core.test_core_flows import Script, error, flows, task
from ..loopback import http_json, raw_server

QUICK = RetryPolicy(max_attempts=5, initial_backoff=0.01, max_backoff=0.05)


def flows_with(script: Script, limit: RateLimit, **settings: Any) -> Any:
    made = flows(script, **settings)
    made.budget = type(made.budget)(limit)
    return made


# ---------------------------------------------------------------------------- fake clock


def test_a_wait_under_a_tiny_budget_still_ends_exactly_at_its_deadline() -> None:
    script = Script(task("processing", 5))
    waiting = flows_with(script, RateLimit(queries_per_second=0.1))  # one query every 10 s
    with pytest.raises(WaitTimeoutError) as info:
        script.run(waiting.wait("9", surface=None, timeout=5))
    assert not isinstance(info.value, TaskFailedError)
    assert script.now == pytest.approx(5.0)  # not 10, when the budget's next slot comes
    assert len(script.sent) == 1  # the one query that fit


def test_a_poll_the_budget_delayed_counts_its_next_interval_from_when_it_was_sent() -> None:
    fixed = PollPolicy(initial_interval=1.0, max_interval=1.0, multiplier=1.0)
    script = Script(task("processing", 5))
    # Nine other waits took the next slots: this wait's queries go out a little late.
    waiting = flows_with(script, RateLimit(queries_per_second=0.5), poll=fixed)
    for _ in range(3):
        waiting.budget.reserve("query", 0.0)
    with pytest.raises(WaitTimeoutError):
        script.run(waiting.wait("9", surface=None, timeout=20))
    sent = [at for at, _ in script.sent]
    assert sent[0] == pytest.approx(6.0, rel=0.02)  # after the three reserved slots
    for before, after in itertools.pairwise(sent):
        # never sooner than the budget allows, and no burst to make up for lost time
        assert after - before >= 2.0 - 1e-6


# ---------------------------------------------------------------------------- 429 shared


def limited_then_fine(first: bytes) -> tuple[Any, list[tuple[int, float]]]:
    """A server answering its first query with ``first`` and every other with a running task,
    noting when each request arrived."""
    arrivals: list[tuple[int, float]] = []
    running = json.dumps({"code": 200, "data": {"id": "7", "status": "processing"}}).encode()

    def answer(conn: socket.socket, n: int, request: bytes) -> None:
        arrivals.append((n, time.monotonic()))
        conn.sendall(first if n == 1 else http_json(200, running))

    return answer, arrivals


@contextlib.contextmanager
def on_retry(callback: Callable[[], None]) -> Iterator[None]:
    """Calls ``callback`` when a client says it will retry: it says so once the answer that
    failed is in the budget, so a 429 has paused the whole client by then."""

    class Hook(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("retrying "):
                callback()

    logger, hook = logging.getLogger("imggw_client"), Hook()
    level = logger.level
    logger.addHandler(hook)
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(hook)
        logger.setLevel(level)


BETA_429 = (
    b"HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
    b'Content-Length: 61\r\n\r\n{"code":429,"error":{"code":"rate_limited","message":"slow"}}'
)
ALPHA_429 = http_json(200, b'{"code":429,"msg":"Too many requests","data":null}')  # no hint


# A paced lane (a ceiling, or a limit met) has met a limit: any 429 pauses it for the whole
# client. With no ceiling and no limit met yet, an isolated 429 costs a retry and no pause
# (DESIGN 25: ``tests/core/test_budget_overload.py``).
PACED = RateLimit(queries_per_second=100)


@pytest.mark.slow
def test_a_429_seen_by_one_thread_pauses_every_thread() -> None:
    answer, arrivals = limited_then_fine(BETA_429)
    limited = threading.Event()
    with raw_server(answer) as url, on_retry(limited.set):
        client = Client(api_key="k" * 12, base_url=url, retry=QUICK, rate_limit=PACED)
        with client:
            first = threading.Thread(target=client.get, args=("7",))
            first.start()
            assert limited.wait(timeout=10), "the first query never met its 429"
            limited_at = arrivals[0][1]
            others = [threading.Thread(target=client.get, args=("7",)) for _ in range(4)]
            for thread in [*others]:
                thread.start()
            for thread in [first, *others]:
                thread.join(timeout=10)
    later = [at for n, at in arrivals if n > 1]
    assert len(later) == 5  # the retry of the first, and the four others
    assert all(at - limited_at >= 1.0 for at in later)  # none before the pause was over


@pytest.mark.anyio
async def test_a_429_on_surface_a_as_http_200_pauses_every_task() -> None:
    answer, arrivals = limited_then_fine(ALPHA_429)
    limited = anyio.Event()  # set on the event loop's thread, where the flow logs
    with raw_server(answer) as url, on_retry(limited.set):
        client = AsyncClient(
            api_key="k" * 12, base_url=url, surface="alpha", retry=QUICK, rate_limit=PACED
        )
        async with client, anyio.create_task_group() as group:
            group.start_soon(client.get, "7")
            with anyio.fail_after(10):
                await limited.wait()
            limited_at = arrivals[0][1]
            for _ in range(4):
                group.start_soon(client.get, "7")
    later = [at for n, at in arrivals if n > 1]
    assert len(later) == 5
    # No Retry-After: the pause is the retry policy's own first backoff, for everyone.
    assert all(at - limited_at >= QUICK.initial_backoff for at in later)


# ---------------------------------------------------------------------------- the gateway


# The same rates over 2 s windows: this gateway runs in the test's own process, where the
# GIL can delay its clock by more than the 10 ms a 1 s window leaves.
@pytest.mark.gateway(submit_limit="10/2", query_limit="40/2", duration_min=0.2, duration_max=0.3)
@pytest.mark.anyio
@pytest.mark.slow
async def test_a_budget_at_the_gateways_limit_meets_no_429(
    served_gateway: tuple[MockGateway, str],
) -> None:
    gateway, url = served_gateway
    limit = RateLimit(submits_per_second=5, queries_per_second=20)
    fast = PollPolicy(initial_interval=0.05, max_interval=0.1)
    async with AsyncClient(api_key="test-key", base_url=url, rate_limit=limit, poll=fast) as client:
        started = time.monotonic()
        async with anyio.create_task_group() as group:
            for i in range(15):
                group.start_soon(client.generate, f"image {i}")
        took = time.monotonic() - started
    stats = gateway.stats()
    assert stats["tasks_created"] == 15
    assert stats["rate_limited"] == 0
    assert took >= 14 / 5  # 15 submits at 5/s: the first at once, the last 2.8 s later


@pytest.mark.gateway(submit_limit="4/1", duration_min=0.05, duration_max=0.1)
@pytest.mark.anyio
@pytest.mark.slow
async def test_without_a_ceiling_a_client_converges_on_the_gateways_limit(
    served_gateway: tuple[MockGateway, str],
) -> None:
    gateway, url = served_gateway
    fast = PollPolicy(initial_interval=0.05, max_interval=0.1)
    patient = RetryPolicy(max_attempts=20, initial_backoff=0.05, max_backoff=0.5)
    client = AsyncClient(api_key="test-key", base_url=url, poll=fast, retry=patient)
    async with client, anyio.create_task_group() as group:
        for i in range(40):
            group.start_soon(client.submit, f"image {i}")
    stats = gateway.stats()
    assert stats["tasks_created"] == 40
    # A storm of 40 at once would meet 36 429s; the start window (4 in flight, at most
    # doubling a round trip), the share of 429s that reads overload within a few of them, and
    # the pause and pace for the whole client then keep it to about 16 (12 before DESIGN 25).
    assert stats["rate_limited"] <= 20


@pytest.mark.gateway(latency=0.2, fault_rate=1.0, faults=["latency"])
@pytest.mark.anyio
async def test_requests_cancelled_in_flight_give_back_their_places(gateway: MockGateway) -> None:
    # Cancelled calls must not stay counted in flight: with no ceiling, four of them would
    # fill the start window and hold every later call back for an answer that never comes.
    async with gateway.async_client() as client:
        sub = await client.submit("a cat")
        for _ in range(20):
            with anyio.move_on_after(0.01):
                await client.get(sub.task_id)
        lane = client._flows.budget._lanes["query"]
        assert lane.in_flight == 0
        assert client._flows.budget.pace("query") is None  # one at a time: never slowed


def counting_waits(client: Client | AsyncClient) -> list[float]:
    """Notes each time the client's budget is asked how long a request still waits."""
    budget, asked = client._flows.budget, []
    wait_time = budget.wait_time

    def counted(ticket: Any, now: float) -> float:
        asked.append(now)
        return wait_time(ticket, now)

    budget.wait_time = counted  # type: ignore[method-assign, union-attr]
    return asked


HELD = 24  # queries at once, against a start window of 4


@pytest.mark.gateway(latency=0.2, fault_rate=1.0, faults=["latency"])
@pytest.mark.anyio
async def test_tasks_held_back_by_the_window_sleep_until_an_answer_frees_a_place(
    served_gateway: tuple[MockGateway, str],
) -> None:
    # Before the budget woke its sleepers, each held-back request guessed when its place would
    # free (a share of the round trip per answer) and asked again: 3 to 4 times a request.
    gateway, url = served_gateway
    async with AsyncClient(api_key="test-key", base_url=url) as client:
        sub = await client.submit("a cat")
        asked = counting_waits(client)
        async with anyio.create_task_group() as group:
            for _ in range(HELD):
                group.start_soon(client.get, sub.task_id)
    assert sum(gateway.stats()["requests"].values()) == HELD + 1
    assert len(asked) <= 2 * HELD


@pytest.mark.gateway(latency=0.2, fault_rate=1.0, faults=["latency"])
def test_threads_held_back_by_the_window_sleep_until_an_answer_frees_a_place(
    served_gateway: tuple[MockGateway, str],
) -> None:
    gateway, url = served_gateway
    with Client(api_key="test-key", base_url=url) as client:
        sub = client.submit("a cat")
        asked = counting_waits(client)
        threads = [threading.Thread(target=client.get, args=(sub.task_id,)) for _ in range(HELD)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert sum(gateway.stats()["requests"].values()) == HELD + 1
    assert len(asked) <= 2 * HELD


@pytest.mark.anyio
async def test_calls_cancelled_oldest_first_hand_their_turns_to_the_calls_behind() -> None:
    # 20 calls queued at 2/s, the oldest 19 cancelled as a task group cancels: the one left
    # waited out the 19 empty turns (10 s), asleep until its old time. It now goes at once,
    # woken to take the turn of the first.
    arrived: list[float] = []
    came = anyio.Event()

    def handler(request: httpx.Request) -> httpx.Response:
        arrived.append(time.monotonic())
        if len(arrived) == 2:
            came.set()
        return beta_task("7")

    limit = RateLimit(queries_per_second=2)
    transport = httpx.MockTransport(handler)
    async with AsyncClient(
        api_key="sk-test", base_url="http://gw.test", rate_limit=limit, transport=transport
    ) as client:
        await client.get("7")  # the first turn, taken
        async with anyio.create_task_group() as kept:
            async with anyio.create_task_group() as cancelled:
                for _ in range(19):
                    cancelled.start_soon(client.get, "7")
                await anyio.wait_all_tasks_blocked()
                kept.start_soon(client.get, "7")
                await anyio.wait_all_tasks_blocked()
                cancelled.cancel_scope.cancel()
            with anyio.fail_after(5):  # its old turn was 10 s away
                await came.wait()
    assert arrived[1] - arrived[0] < 2.0


def test_a_request_refused_again_backs_off_where_its_first_429_was_retried_at_once() -> None:
    # One caller alone at a limit with no Retry-After: too few answers for the budget to read
    # a share of 429s from, so the request itself backs off from its second 429 on.
    script = Script(*[error(429, "rate_limited")] * 4, task("pending"))
    policy = RetryPolicy(max_attempts=5, initial_backoff=0.5, max_backoff=8.0)
    script.run(flows(script, retry=policy).get("9", surface=None))
    times = [at for at, _ in script.sent]
    assert len(times) == 5
    assert times[1] == times[0]  # the first 429: chance's, retried at once
    gaps = [b - a for a, b in itertools.pairwise(times)][1:]
    assert all(0 < gap <= 0.5 * 2**attempt for attempt, gap in enumerate(gaps, start=2)), gaps


def test_a_hint_of_zero_backs_off_as_no_hint_does() -> None:
    # Retry-After: 0 left the wait to a budget that had none to make: five sends at once.
    zero = Reply(429, {"retry-after": "0"}, error(429, "rate_limited").content)
    script = Script(zero, zero, zero, task("pending"))
    script.run(flows(script).get("9", surface=None))
    times = [at for at, _ in script.sent]
    assert times[1] == times[0]  # the first 429: chance's
    assert all(b > a for a, b in itertools.pairwise(times[1:]))


def test_a_request_refused_with_a_hint_leaves_the_wait_to_the_budget() -> None:
    hinted = Reply(429, {"retry-after": "2"}, error(429, "rate_limited").content)
    script = Script(hinted, hinted, task("pending"))
    script.run(flows(script).get("9", surface=None))
    times = [at for at, _ in script.sent]
    assert len(times) == 3
    # Each retry waits the hint as the budget holds it (plus its spread), no backoff on top.
    assert all(2.0 <= b - a <= 2.2 for a, b in itertools.pairwise(times)), times


def test_a_hint_longer_than_the_budgets_longest_pause_is_waited_whole() -> None:
    # The budget pauses a client 60 s at most; a request told to come back in 120 s, which
    # its policy allows, came back at 60 s and was refused again.
    hinted = Reply(429, {"retry-after": "120"}, error(429, "rate_limited").content)
    script = Script(hinted, task("pending"))
    script.run(flows(script, retry=RetryPolicy(max_retry_after=300)).get("9", surface=None))
    (first, _), (retried, _) = script.sent
    assert 120.0 <= retried - first <= 121.0


def test_a_wait_retrying_up_to_its_deadline_sends_nothing_with_no_time_left() -> None:
    # Retries inside a wait sleep up to the deadline; a query then would get a timeout of 0
    # (a caller's own httpx client refuses it with a ValueError).
    script = Script(error(503))
    waiting = flows(script, retry=RetryPolicy(initial_backoff=0.5, max_backoff=2.0))
    with pytest.raises(WaitTimeoutError):
        script.run(waiting.wait("9", surface=None, timeout=3))
    assert script.now == pytest.approx(3.0)
    assert all(send.timeout > 0 for _, send in script.sent)


# ---------------------------------------------------------------------------- held elsewhere


class Holder:
    """A budget held elsewhere (a SyncBudgetService) that notes every question; the first slot
    it hands out comes ``first_wait`` seconds later, every other at once."""

    def __init__(self, first_wait: float = 0.0) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.first_wait = first_wait

    def reserve(self, kind: str) -> tuple[Hashable, float]:
        self.calls.append(("reserve", kind))
        ticket = sum(1 for call in self.calls if call[0] == "reserve")
        return ticket, self.first_wait if ticket == 1 else 0.0

    def wait_time(self, ticket: Hashable) -> float:
        self.calls.append(("wait_time", ticket))
        return 0.0

    def release(self, ticket: Hashable) -> None:
        self.calls.append(("release", ticket))

    def finished(self, ticket: Hashable, **how: Any) -> None:  # limited, retry_after, backoff
        self.calls.append(("finished", ticket, how["limited"], how["retry_after"]))


class AsyncHolder:
    """The same, as a BudgetService: every method a coroutine function."""

    def __init__(self, holder: Holder) -> None:
        self.holder = holder

    async def reserve(self, kind: str) -> tuple[Hashable, float]:
        return self.holder.reserve(kind)

    async def wait_time(self, ticket: Hashable) -> float:
        return self.holder.wait_time(ticket)

    async def release(self, ticket: Hashable) -> None:
        self.holder.release(ticket)

    async def finished(self, ticket: Hashable, **how: Any) -> None:
        self.holder.finished(ticket, **how)


def service_for(client: Driven, holder: Holder) -> Any:
    return holder if isinstance(client.inner, Client) else AsyncHolder(holder)


@pytest.mark.anyio
async def test_both_clients_ask_a_shared_budget_for_every_request(
    client: Driven, respx_gateway: Any
) -> None:
    holder = Holder(first_wait=2.0)
    client.inner.share_budget(service_for(client, holder))
    respx_gateway.get("/beta/v1/tasks/42").mock(
        side_effect=[beta_error(429, "rate_limited", retry_after="1"), beta_task("42")]
    )
    task = await client.get("42")
    assert task.id == "42"
    assert holder.calls == [
        ("reserve", "query"),
        ("wait_time", 1),  # after the wait the holder asked for
        ("finished", 1, True, 1.0),  # the 429 and its hint, for the holder's whole budget
        ("reserve", "query"),
        ("finished", 2, False, None),
    ]
    assert client.fake.slept[0] == 2.0
    copy = client.inner.with_options(timeout=5)  # a copy made from now on shares it too
    assert copy._flows.budget is client.inner._flows.budget


@pytest.mark.anyio
async def test_a_shared_budget_of_the_wrong_kind_is_refused(client: Driven) -> None:
    wrong = AsyncHolder(Holder()) if isinstance(client.inner, Client) else Holder()
    with pytest.raises(ConfigurationError, match="BudgetService"):
        client.inner.share_budget(wrong)


@pytest.mark.gateway(latency=5.0, fault_rate=1.0, faults=["latency"])
@pytest.mark.anyio
async def test_a_request_cancelled_in_flight_gives_back_its_shared_slot(
    gateway: MockGateway,
) -> None:
    # Its slot would count in flight at the holder (a Redis store, a Dask scheduler) until a
    # lease or a TTL ran out: given back as the cancel passes, shielded from it.
    holder = Holder()
    async with gateway.async_client() as client:
        client.share_budget(AsyncHolder(holder))
        with anyio.move_on_after(0.05):
            await client.get("42")
    assert holder.calls == [("reserve", "query"), ("release", 1)]


@pytest.mark.anyio
async def test_a_request_cancelled_while_it_waits_for_a_shared_slot_gives_it_back() -> None:
    holder = Holder(first_wait=60.0)
    async with AsyncClient(api_key="test-key", base_url="http://127.0.0.1:9") as client:
        client.share_budget(AsyncHolder(holder))
        with anyio.move_on_after(0.05):
            await client.get("42")
    assert holder.calls == [("reserve", "query"), ("release", 1)]


def test_a_flow_stopped_as_it_tells_its_budget_wait_gives_its_slot_back() -> None:
    # With telemetry on, a flow tells how long it waited for its slot before it sends: stopped
    # there (a client closed, a cancel), the slot it holds counts no more, here or elsewhere.
    made = flows(Script())
    made.observe = True
    flow = made.get("42", surface=None)
    assert isinstance(flow.send(None), Observe)  # the slot came at once: its wait is told
    lane = made.budget._lanes["query"]
    assert lane.in_flight == 1
    flow.close()
    assert lane.in_flight == 0
    made.budget = RemoteBudget(Holder())
    flow = made.get("42", surface=None)
    assert isinstance(flow.send(None), Pace)
    assert isinstance(flow.send(("t1", 0.0)), Observe)
    flow.close()
    assert list(made.budget.abandoned) == ["t1"]


def test_a_flow_stopped_while_it_holds_a_shared_slot_leaves_it_to_the_driver() -> None:
    # A stopped flow cannot ask its driver anything: it names the slot, the driver releases it.
    made = flows(Script())
    made.budget = RemoteBudget(Holder())
    flow = made.get("42", surface=None)
    assert isinstance(flow.send(None), Pace)
    assert isinstance(flow.send(("t1", 0.0)), Send)  # the slot came: the query is in flight
    interrupt(flow, KeyboardInterrupt())
    assert list(made.budget.abandoned) == ["t1"]
    waiting = made.get("42", surface=None)
    waiting.send(None)
    assert isinstance(waiting.send(("t2", 3.0)), Sleep)  # waits for its slot
    waiting.close()
    assert list(made.budget.abandoned) == ["t1", "t2"]
