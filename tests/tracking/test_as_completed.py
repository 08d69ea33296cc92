"""``as_completed`` (DESIGN 19): many waits in one driver, each task yielded once as soon as it
is terminal (a failed one too), in the order they finish; past ``timeout`` a
``WaitTimeoutError`` naming every task still running; ``on_submit`` before any wait. Recovery
is per task (DESIGN 22): a task the gateway forgot, or whose query is refused, is that task's
outcome, yielded with its id and key, and the others go on; the documented start-up pattern
saves every result still there. Sync and async, over a real loopback socket."""

from __future__ import annotations

import pickle
import threading
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import pytest

from imggw_client import (
    AsyncClient,
    AuthenticationError,
    Client,
    ImageRequest,
    NotFoundError,
    PollPolicy,
    RequestValidationError,
    ResultExpiredError,
    Submission,
    Task,
    TaskStatus,
    WaitTimeoutError,
)
from imggw_client.mock import MockGateway, MockRequest, MockResponse

from ..conftest import CANARY_KEY, Driven, FakeTime, make_client

KEY = "sk-completed-0b8e2f4a6c1d3957"
FAST = PollPolicy(initial_interval=0.02, max_interval=0.1)


pytestmark = pytest.mark.gateway(
    api_keys=[KEY], seed=5, duration_min=0.05, duration_max=0.5, failure_rate=0.3
)
# Tests whose gateway moves only when they move its clock, for the canary key, no failures.
ON_ITS_CLOCK: dict[str, Any] = {
    "api_keys": [CANARY_KEY],
    "seed": 0,
    "failure_rate": 0.0,
    "manual_clock": True,
}


@pytest.mark.slow  # ten steps of the clock, each polled by every running task
@pytest.mark.gateway(manual_clock=True)  # tasks finish only as the test moves the clock
def test_sync_yields_every_task_once_as_it_finishes_failed_ones_included(
    served_gateway: tuple[MockGateway, str],
) -> None:
    # The gateway's clock moves a step at a time; the next step waits until every running task
    # was asked about at this one and every task answered terminal was yielded. Tasks finished
    # in an earlier step must come first, whatever order they were submitted in and however
    # late a loaded machine runs a thread.
    gw, url = served_gateway
    step: list[int] = [0]
    polled: dict[str, int] = {}  # the step at which each task was last asked about
    finished_in: dict[str, int] = {}  # the step at which the gateway first answered it terminal
    got: list[Task] = []
    moved = threading.Condition()  # guards all four: a step never moves during an answer
    handle = gw.handle

    def spy(request: MockRequest) -> MockResponse:
        if request.method != "GET":
            return handle(request)
        with moved:
            response = handle(request)
            task_id = request.path.rsplit("/", 1)[-1]
            polled[task_id] = step[0]
            if b'"completed"' in response.body or b'"failed"' in response.body:
                finished_in.setdefault(task_id, step[0])
            moved.notify_all()
        return response

    gw.handle = spy  # type: ignore[method-assign]
    stalled: list[int] = []

    def ready(ids: list[str]) -> bool:
        asked = all(polled.get(t, -1) >= step[0] for t in ids if t not in finished_in)
        return asked and len(got) >= len(finished_in)

    def drive(ids: list[str]) -> None:  # a step of 0.05 s at a time
        while len(finished_in) < len(ids):
            with moved:
                # Each task is asked about every 0.1 s at most: 10 s without is a stall.
                if not moved.wait_for(lambda: ready(ids), timeout=10):
                    stalled.append(step[0])
                    return
                step[0] += 1
                gw.advance(0.05)

    with Client(KEY, url, poll=FAST) as client:
        subs = [client.submit(f"p{i}") for i in range(30)]
        driver = threading.Thread(target=drive, args=([s.task_id for s in subs],), daemon=True)
        threads_before = threading.active_count()
        driver.start()
        peak = 0
        for task in client.as_completed([*subs, subs[0], subs[1].task_id], timeout=30):
            with moved:
                got.append(task)
                moved.notify_all()
            peak = max(peak, threading.active_count())
        driver.join(timeout=10)
    assert not stalled
    assert sorted(t.id for t in got) == sorted(s.task_id for s in subs)  # each once
    assert {t.status for t in got} == {TaskStatus.SUCCEEDED, TaskStatus.FAILED}
    steps = [finished_in[t.id] for t in got]
    assert steps == sorted(steps)  # an earlier step's tasks always first
    assert len(set(steps)) >= 4  # the order was put to the test: tasks finished apart
    assert peak <= threads_before + 1 + 16


def test_async_yields_every_task_once_and_shares_one_budget(
    served_gateway: tuple[MockGateway, str],
) -> None:
    gw, url = served_gateway

    async def main() -> list[Task]:
        async with AsyncClient(KEY, url, poll=FAST) as client:
            subs = [await client.submit(f"p{i}") for i in range(30)]
            return [task async for task in client.as_completed(subs)]

    got = anyio.run(main)
    assert len(got) == len({t.id for t in got}) == 30
    assert all(t.status in (TaskStatus.SUCCEEDED, TaskStatus.FAILED) for t in got)
    assert gw.stats()["tasks_created"] == 30  # a wait never submits


@pytest.mark.slow
@pytest.mark.gateway(seed=0, duration_max=0.1, failure_rate=0.0)
def test_past_its_timeout_it_names_every_task_still_running(
    served_gateway: tuple[MockGateway, str], tmp_path: Any
) -> None:
    gw, url = served_gateway
    with Client(KEY, url, poll=FAST) as client:
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
@pytest.mark.gateway(**ON_ITS_CLOCK, duration_min=1, duration_max=1)
async def test_its_timeout_error_names_every_task_left_running_and_carries_their_ids(
    kind: str,
    fake_time: FakeTime,
    gateway: MockGateway,
    shared_gateway_url: str,
    slow_count: int,
) -> None:
    client = make_client(kind, fake_time, base_url=shared_gateway_url, poll=FAST)
    try:
        quick = [await client.submit(f"quick {i}") for i in range(2)]
        gateway.configure(duration_min=3600, duration_max=3600)
        slow = [await client.submit(f"slow {i}") for i in range(slow_count)]
        gateway.advance(2)  # the quick ones are done at the gateway; the slow ones run on
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
        assert gateway.stats()["tasks_created"] == 2 + slow_count  # a wait never submits
    finally:
        await client.close()


@pytest.mark.anyio
@pytest.mark.gateway(**ON_ITS_CLOCK, duration_min=60, duration_max=60)
async def test_one_task_left_running_is_named_as_a_single_wait_names_it(
    kind: str, fake_time: FakeTime, shared_gateway_url: str
) -> None:
    client = make_client(kind, fake_time, base_url=shared_gateway_url, poll=FAST)
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


def test_an_unknown_task_id_is_that_tasks_outcome_and_the_others_go_on(
    served_gateway: tuple[MockGateway, str], caplog: pytest.LogCaptureFixture
) -> None:
    _, url = served_gateway
    with Client(KEY, url, poll=FAST) as client:
        sub = client.submit("a fox")
        got = {task.id: task for task in client.as_completed(["999999", sub])}
        assert set(got) == {"999999", sub.task_id}
        assert got[sub.task_id].is_terminal
        assert got[sub.task_id].raw
        lost = got["999999"]
        assert lost.status is TaskStatus.FAILED
        assert lost.raw == {}
        assert lost.error is not None
        assert lost.error.code == "task_not_found"
        assert "999999" in caplog.text
        assert KEY not in caplog.text
        # The older rule on request: the first task's error ends the call, naming its task.
        with pytest.raises(NotFoundError) as ended:
            list(client.as_completed(["999999"], errors="raise"))
        assert ended.value.task_id == "999999"
        with pytest.raises(RequestValidationError) as wrong:
            list(client.as_completed([sub], errors="ignore"))  # type: ignore[arg-type]
        assert wrong.value.field == "errors"


def test_an_error_of_the_whole_client_still_ends_the_call(
    served_gateway: tuple[MockGateway, str],
) -> None:
    _, url = served_gateway
    refused = Client("sk-not-this-gateways-key", url, poll=FAST)
    with refused, pytest.raises(AuthenticationError):
        list(refused.as_completed(["1", "2", "3"]))


async def recovered(client: Driven, items: list[Submission]) -> list[Task]:
    """What ``as_completed`` yields on either client, in order."""
    tasks = client.inner.as_completed(items)
    if isinstance(tasks, Iterator):
        return list(tasks)
    return [task async for task in tasks]


@pytest.mark.anyio
@pytest.mark.gateway(**ON_ITS_CLOCK, duration_min=1, duration_max=1)
async def test_the_start_up_pattern_saves_every_result_left_and_reports_the_rest_by_id_and_key(
    kind: str,
    fake_time: FakeTime,
    make_gateway: Callable[..., MockGateway],
    shared_serve: Any,
    tmp_path: Any,
) -> None:
    journal, out = tmp_path / "journal.sqlite", tmp_path / "out"
    # Two tasks made on a gateway that has since lost them (a restart, say): its queries 404.
    # Its clock never moves: they never finish there.
    before = make_gateway(first_task_id=500)
    url = shared_serve(before)
    made = make_client(kind, fake_time, base_url=url, journal=journal, poll=FAST)
    try:
        forgotten = [await made.submit(f"forgotten {i}") for i in range(2)]
        gw = make_gateway(retention=100)
        assert shared_serve(gw) == url  # the same gateway, as far as the journal knows
        stale = await made.submit("kept too long")
        gw.advance(150)  # done long ago: its result is past retention, its link dead
        fine = [await made.submit(f"picture {i}", aspect_ratio="3:2") for i in range(7)]
        gw.advance(2)
    finally:
        await made.close()  # the process ends with ten paid tasks, none saved

    client = make_client(kind, fake_time, base_url=url, journal=journal, poll=FAST)
    try:
        subs = await client.unfinished()
        assert len(subs) == 10
        saved: dict[str, list[Any]] = {}
        reported: dict[str, tuple[str | None, str | None]] = {}
        for task in await recovered(client, subs):  # the pattern the docs show
            if task.status is TaskStatus.SUCCEEDED:
                try:
                    saved[task.id] = await client.download(task, out)
                except ResultExpiredError as err:
                    reported[task.id] = (task.idempotency_key, err.code)
            else:
                reported[task.id] = (task.idempotency_key, task.error.code if task.error else None)
        assert sorted(saved) == sorted(s.task_id for s in fine)
        assert all(len(files) == 1 and files[0].path.exists() for files in saved.values())
        assert reported == {
            forgotten[0].task_id: (forgotten[0].idempotency_key, "task_not_found"),
            forgotten[1].task_id: (forgotten[1].idempotency_key, "task_not_found"),
            stale.task_id: (stale.idempotency_key, "result_expired"),
        }
        # What each was asked for comes with it, without reading the journal.
        by_id = {s.task_id: s for s in subs}
        assert by_id[fine[3].task_id].request == ImageRequest("picture 3", aspect_ratio="3:2")
        assert gw.stats()["tasks_created"] == 8  # nothing sent again
    finally:
        await client.close()


@pytest.mark.slow
def test_on_submit_sees_the_submission_before_any_wait(
    served_gateway: tuple[MockGateway, str],
) -> None:
    gw, url = served_gateway
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
