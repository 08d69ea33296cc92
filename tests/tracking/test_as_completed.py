"""``as_completed`` (DESIGN 19): many waits in one driver, each task yielded once as soon as it
is terminal (a failed one too), in the order they finish; past ``timeout`` a
``WaitTimeoutError`` naming every task still running; ``on_submit`` before any wait. Sync and
async, over a real loopback socket."""

from __future__ import annotations

import pickle
import threading
import time
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from imggw_client import (
    AsyncClient,
    Client,
    NotFoundError,
    PollPolicy,
    Submission,
    Task,
    TaskStatus,
    WaitTimeoutError,
)
from imggw_client.mock import ManualClock, MockGateway, MockRequest, MockResponse

from ..conftest import CANARY_KEY, Driven, FakeTime, make_client

KEY = "sk-completed-0b8e2f4a6c1d3957"
FAST = PollPolicy(initial_interval=0.02, max_interval=0.1)


@pytest.fixture
def gateway() -> Iterator[tuple[MockGateway, str]]:
    gw = MockGateway(api_keys=[KEY], seed=5, duration_min=0.05, duration_max=0.5,
                     failure_rate=0.3)  # fmt: skip
    with gw.serve() as url:
        yield gw, url


def finished_by(gw: MockGateway) -> dict[str, float]:
    """When the gateway first answered each task terminal (monotonic, by task id)."""
    seen: dict[str, float] = {}
    handle = gw.handle

    def spy(request: MockRequest) -> MockResponse:
        response = handle(request)
        terminal = b'"completed"' in response.body or b'"failed"' in response.body
        if request.method == "GET" and terminal:
            seen.setdefault(request.path.rsplit("/", 1)[-1], time.monotonic())
        return response

    gw.handle = spy  # type: ignore[method-assign]
    return seen


def test_sync_yields_every_task_once_as_it_finishes_failed_ones_included(
    gateway: tuple[MockGateway, str],
) -> None:
    gw, url = gateway
    with Client(KEY, url, poll=FAST) as client:
        subs = [client.submit(f"p{i}") for i in range(30)]
        order = finished_by(gw)
        threads_before = threading.active_count()
        got: list[Task] = []
        peak = 0
        for task in client.as_completed([*subs, subs[0], subs[1].task_id]):
            got.append(task)
            peak = max(peak, threading.active_count())
    assert sorted(t.id for t in got) == sorted(s.task_id for s in subs)  # each once
    assert {t.status for t in got} == {TaskStatus.SUCCEEDED, TaskStatus.FAILED}
    # Yielded in the order the gateway first answered each one terminal (answers read in one
    # step of queries are handed back together: only those apart in time are ordered).
    position = {t.id: n for n, t in enumerate(got)}
    for a in order:
        for b in order:
            if order[a] + 0.05 < order[b]:
                assert position[a] < position[b], (a, b)
    assert peak <= threads_before + 16


def test_async_yields_every_task_once_and_shares_one_budget(
    gateway: tuple[MockGateway, str],
) -> None:
    gw, url = gateway

    async def main() -> list[Task]:
        async with AsyncClient(KEY, url, poll=FAST) as client:
            subs = [await client.submit(f"p{i}") for i in range(30)]
            return [task async for task in client.as_completed(subs)]

    got = anyio.run(main)
    assert len(got) == len({t.id for t in got}) == 30
    assert all(t.status in (TaskStatus.SUCCEEDED, TaskStatus.FAILED) for t in got)
    assert gw.stats()["tasks_created"] == 30  # a wait never submits


@pytest.mark.slow
def test_past_its_timeout_it_names_every_task_still_running(tmp_path: Any) -> None:
    gw = MockGateway(api_keys=[KEY], duration_min=0.05, duration_max=0.1)
    with gw.serve() as url, Client(KEY, url, poll=FAST) as client:
        quick = [client.submit(f"quick {i}") for i in range(2)]
        gw.configure(duration_min=60, duration_max=60)
        slow = [client.submit(f"slow {i}") for i in range(3)]
        got: list[str] = []

        def collect() -> None:
            for task in client.as_completed([*slow, *quick], timeout=1.0):
                got.append(task.id)

        with pytest.raises(WaitTimeoutError) as timed_out:
            collect()
        assert sorted(got) == sorted(s.task_id for s in quick)
        assert sorted(timed_out.value.still_running) == sorted(s.task_id for s in slow)
        assert timed_out.value.task_id in timed_out.value.still_running
        assert all(s.task_id in str(timed_out.value) for s in slow)
        # Waiting on the error again resumes: the task is still there, never resubmitted.
        assert gw.stats()["tasks_created"] == 5


async def completed(
    client: Driven, items: list[Submission], timeout: float, got: list[str]
) -> None:
    """Runs ``as_completed`` on either client to its end, adding to ``got`` the id of each
    task it yields (kept when it raises)."""
    tasks = client.inner.as_completed(items, timeout=timeout)
    if isinstance(tasks, Iterator):
        for task in tasks:
            got.append(task.id)
    else:
        async for task in tasks:
            got.append(task.id)


@pytest.mark.anyio
@pytest.mark.parametrize("slow_count", [3, 13])
async def test_its_timeout_error_names_every_task_left_running_and_carries_their_ids(
    kind: str, fake_time: FakeTime, shared_serve: Any, slow_count: int
) -> None:
    clock = ManualClock()
    gw = MockGateway(api_keys=[CANARY_KEY], clock=clock, duration_min=1, duration_max=1)
    client = make_client(kind, fake_time, base_url=shared_serve(gw), poll=FAST)
    try:
        quick = [await client.submit(f"quick {i}") for i in range(2)]
        gw.configure(duration_min=3600, duration_max=3600)
        slow = [await client.submit(f"slow {i}") for i in range(slow_count)]
        clock.advance(2)  # the quick ones are done at the gateway; the slow ones run on
        got: list[str] = []
        with pytest.raises(WaitTimeoutError) as timed_out:
            await completed(client, [*slow, *quick], 5, got)
        err = timed_out.value
        assert sorted(got) == sorted(s.task_id for s in quick)
        assert sorted(err.still_running) == sorted(s.task_id for s in slow)
        assert err.still_running[0] == err.task_id  # the error's own task first
        named = ", ".join(err.still_running[:10])
        more = f" and {slow_count - 10} more" if slow_count > 10 else ""
        assert str(err) == err.message
        assert err.message == (
            f"{slow_count} tasks still active after waiting 5s: {named}{more}; they may "
            "still succeed: wait on them again (still_running holds their ids)"
        )
        again = pickle.loads(pickle.dumps(err))
        assert (again.still_running, str(again)) == (err.still_running, str(err))
        assert gw.stats()["tasks_created"] == 2 + slow_count  # a wait never submits
    finally:
        await client.close()


@pytest.mark.anyio
async def test_one_task_left_running_is_named_as_a_single_wait_names_it(
    kind: str, fake_time: FakeTime, shared_serve: Any
) -> None:
    gw = MockGateway(api_keys=[CANARY_KEY], clock=ManualClock(), duration_min=60,
                     duration_max=60)  # fmt: skip
    client = make_client(kind, fake_time, base_url=shared_serve(gw), poll=FAST)
    try:
        sub = await client.submit("slow")
        with pytest.raises(WaitTimeoutError) as timed_out:
            await completed(client, [sub], 5, [])
        assert timed_out.value.still_running == (sub.task_id,)
        assert str(timed_out.value) == (
            f"task {sub.task_id} still active after waiting 5s, last seen pending; it may still "
            "succeed: wait on it again"
        )
    finally:
        await client.close()


def test_an_unknown_task_id_ends_the_call(gateway: tuple[MockGateway, str]) -> None:
    _, url = gateway
    with Client(KEY, url, poll=FAST) as client, pytest.raises(NotFoundError):
        list(client.as_completed(["999999"]))


@pytest.mark.slow
def test_on_submit_sees_the_submission_before_any_wait(gateway: tuple[MockGateway, str]) -> None:
    gw, url = gateway
    queries_at_callback: list[int] = []
    subs: list[Submission] = []

    def on_submit(sub: Submission) -> None:
        subs.append(sub)
        queries_at_callback.append(gw.stats()["requests"].get("GET /beta/tasks/{task_id}", 0))

    with Client(KEY, url, poll=FAST) as client:
        task = client.generate("a fox", on_submit=on_submit)
    assert [s.task_id for s in subs] == [task.id]
    assert queries_at_callback == [0]

    async def main() -> Task:
        async with AsyncClient(KEY, url, poll=FAST) as client:

            async def kept(sub: Submission) -> None:
                await anyio.sleep(0)
                subs.append(sub)

            return await client.generate("a cat", on_submit=kept)

    task = anyio.run(main)
    assert subs[-1].task_id == task.id
