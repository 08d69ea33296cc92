"""Polls that learn, end to end over a loopback socket against the reference gateway: a
client's later tasks cost fewer queries than ``learn=False`` spends on the same tasks, and a
gateway's ``Retry-After`` on an active task is read from the real header and never makes a
wait query more."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable

import anyio
import pytest

from imggw_client import AsyncClient, Client, PollPolicy
from imggw_client.mock import MockGateway, MockRequest, MockResponse

# Seconds a test: tens of real tasks, waited for twice to compare (the slow lane, tests/conftest.py).
pytestmark = pytest.mark.slow


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


def queries_after_warm_up(learn: bool, hint: str | None = None) -> tuple[int, int]:
    """16 tasks to learn from, then 16 counted: (queries of the counted, counted tasks)."""
    gw = MockGateway(duration_min=0.4, duration_max=0.6, seed=3)
    queries = counting(gw, hint)
    with gw.serve() as url:

        async def main() -> None:
            poll = PollPolicy(**FAST, learn=learn)
            async with AsyncClient(
                api_key=gw.config.api_keys[0], base_url=url, poll=poll
            ) as client:
                await many(client, 16)
                queries.clear()
                await many(client, 16)

        anyio.run(main)
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


@pytest.mark.parametrize("hint", ["0", "3600"])
def test_a_retry_after_on_active_tasks_never_costs_a_query_more(hint: str, learned: int) -> None:
    hinted, _ = queries_after_warm_up(learn=True, hint=hint)
    # The tasks run on the wall clock, so a loaded machine moves both counts by a few queries a
    # task; a hint that made waits spin would cost hundreds (a query per round trip).
    assert hinted <= 1.3 * learned + 4, (hinted, learned)


def test_the_threads_of_a_blocking_client_teach_one_model() -> None:
    gw = MockGateway(duration_min=0.3, duration_max=0.4, seed=4)
    counting(gw)
    with (
        gw.serve() as url,
        Client(api_key=gw.config.api_keys[0], base_url=url, poll=PollPolicy(**FAST)) as client,
    ):
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
        assert all(0.0 <= lower <= upper and upper >= 0.3 for lower, upper in seen)
        assert model.first_query_at(kind, now=0.0) > 0.0  # enough history: it waits first
