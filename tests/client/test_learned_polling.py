"""Polls that learn, end to end against the reference gateway: a client's later tasks cost
fewer queries than ``learn=False`` spends on the same tasks, and a gateway's ``Retry-After`` on
an active task is read from the real header and never makes a wait query more. The async
client and the gateway run on one virtual clock (``VirtualTime``), so how busy the machine is
moves no count; the threads of a blocking client run over a loopback socket."""

from __future__ import annotations

import heapq
import itertools
import random
import threading
from collections import Counter
from collections.abc import Awaitable, Callable

import anyio
import httpx
import pytest
from anyio import wait_all_tasks_blocked

from imggw_client import AsyncClient, Client, PollPolicy
from imggw_client.mock import MockGateway, MockRequest, MockResponse

FAST = {"initial_interval": 0.05, "max_interval": 0.5}


def counting(gw: MockGateway, hint: str | None = None) -> Counter[str]:
    """Counts the queries per task the gateway answers; with ``hint``, active answers carry
    ``Retry-After: hint``."""
    queries: Counter[str] = Counter()
    handle, lock = gw.handle, threading.Lock()

    def answer(request: MockRequest) -> MockResponse:
        response = handle(request)
        if request.method == "GET" and "/tasks/" in request.path:
            with lock:
                queries[request.path.rsplit("/", 1)[-1]] += 1
            if hint is not None and b"processing" in response.body:
                headers = (*response.headers, ("retry-after", hint))
                return MockResponse(response.status, response.body, headers)
        return response

    gw.handle = answer  # type: ignore[method-assign]
    return queries


async def many(client: AsyncClient, n: int) -> None:
    async with anyio.create_task_group() as group:
        for i in range(n):
            group.start_soon(lambda i=i: client.generate(f"prompt {i}", wait_timeout=30))


class VirtualTime:
    """A clock that moves only when every task of the event loop waits on it, and then to the
    earliest wake-up: the client's sleeps and the gateway's clock both read it."""

    def __init__(self) -> None:
        self.now = 0.0
        self._sleepers: list[tuple[float, int, anyio.Event]] = []
        self._order = itertools.count()

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float, arm: object = None) -> None:
        woken = anyio.Event()
        heapq.heappush(self._sleepers, (self.now + max(0.0, seconds), next(self._order), woken))
        await woken.wait()

    async def run(self, main: Callable[[], Awaitable[None]]) -> None:
        done = anyio.Event()

        async def body() -> None:
            await main()
            done.set()

        async with anyio.create_task_group() as group:
            group.start_soon(body)
            idle = 0  # rounds in which every task waited and none on this clock
            while not done.is_set():
                await wait_all_tasks_blocked()
                if not self._sleepers:  # a task's end not yet told to whoever awaits it
                    idle += 1
                    assert idle < 1000, "every task waits, on nothing this clock moves"
                    await anyio.sleep(0)
                    continue
                idle = 0
                at, _, woken = heapq.heappop(self._sleepers)
                self.now = max(self.now, at)
                woken.set()


def queries_after_warm_up(learn: bool, hint: str | None = None) -> tuple[int, int]:
    """16 tasks to learn from, then 16 counted: (queries of the counted, counted tasks)."""
    time = VirtualTime()
    gw = MockGateway(duration_min=0.4, duration_max=0.6, seed=3, clock=time.clock)
    queries = counting(gw, hint)

    async def main() -> None:
        poll = PollPolicy(**FAST, learn=learn)
        http = httpx.AsyncClient(transport=gw.transport())
        async with (
            AsyncClient(
                api_key=gw.config.api_keys[0],
                base_url="http://gateway.test",
                poll=poll,
                http_client=http,
            ) as client,
            http,
        ):
            client._sleep = time.sleep  # type: ignore[method-assign]
            client._flows.clock = time.clock
            client._flows.rng = random.Random(5)  # the polls' jitter, drawn the same each run
            await many(client, 16)
            queries.clear()
            await many(client, 16)

    anyio.run(time.run, main)
    return sum(queries.values()), len(queries)


@pytest.fixture(scope="module")
def learned() -> int:
    queries, tasks = queries_after_warm_up(learn=True)
    assert tasks == 16
    return queries


def test_a_learning_client_spends_far_fewer_queries_on_its_later_tasks(learned: int) -> None:
    today, _ = queries_after_warm_up(learn=False)
    assert learned <= 0.65 * today, (learned, today)  # about 3.5 against 7.5 a task
    assert learned >= 16  # each task was asked at least once


def test_the_same_tasks_on_the_same_clock_cost_the_same_queries(learned: int) -> None:
    assert queries_after_warm_up(learn=True) == (learned, 16)  # nothing here reads real time


@pytest.mark.parametrize("hint", ["0", "3600"])
def test_a_retry_after_on_active_tasks_never_costs_a_query_more(hint: str, learned: int) -> None:
    hinted, _ = queries_after_warm_up(learn=True, hint=hint)
    # A hint that made waits spin would cost hundreds (a query per round trip).
    assert hinted <= learned, (hinted, learned)


@pytest.mark.slow  # a dozen real tasks of 0.3 to 0.4 s (the slow lane, tests/conftest.py)
@pytest.mark.gateway(duration_min=0.3, duration_max=0.4, seed=4)
def test_the_threads_of_a_blocking_client_teach_one_model(
    served_gateway: tuple[MockGateway, str],
) -> None:
    gw, url = served_gateway
    counting(gw)
    with Client(api_key=gw.config.api_keys[0], base_url=url, poll=PollPolicy(**FAST)) as client:
        run: Callable[[int], object] = lambda i: client.generate(f"p {i}", wait_timeout=30)  # noqa: E731
        threads = [threading.Thread(target=run, args=(i,)) for i in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        kind = (client.surface, "1k")
        model = client._flows.durations
        seen = model.observations(kind, now=0.0)
        assert len(seen) == 12
        # Each task was seen active at most its 0.4 s after it was accepted (real time: the
        # later bound moves with the machine's load, the earlier cannot pass the task's end).
        assert all(0.0 <= lower < 0.4 and lower <= upper for lower, upper in seen)
        assert model.first_query_at(kind, now=0.0) > 0.0  # enough history: it waits first
