"""wait and generate through both clients: polling, updates, failures, deadlines."""

from __future__ import annotations

import httpx
import pytest
import respx

from imggw_client import (
    NotFoundError,
    Task,
    TaskFailedError,
    TaskStatus,
    WaitTimeoutError,
)

from ..conftest import (
    Driven,
    FakeTime,
    alpha_done,
    alpha_submitted,
    alpha_task,
    beta_done,
    beta_error,
    beta_submitted,
    beta_task,
    make_client,
)

pytestmark = pytest.mark.anyio

QUERY = "/beta/v1/tasks/42"


async def test_wait_polls_until_success_and_reports_every_change(
    client: Driven, respx_gateway: respx.MockRouter
) -> None:
    route = respx_gateway.get(QUERY).mock(
        side_effect=[
            beta_task("42", "pending"),
            beta_task("42", "processing", progress=30),
            beta_task("42", "processing", progress=30),
            beta_task("42", "processing", progress=80),
            beta_done("42"),
        ]
    )
    seen: list[tuple[str, int | None]] = []
    task = await client.wait("42", on_update=lambda t: seen.append((t.status.value, t.progress)))
    assert task.status is TaskStatus.SUCCEEDED
    assert task.image_urls == ["http://cdn.test/r/42.png"]
    assert (task.cost, task.credits) == (0.04, 4.0)
    assert route.call_count == 5
    assert seen == [("pending", None), ("running", 30), ("running", 80), ("succeeded", 100)]
    assert len(client.fake.slept) == 4
    assert all(0 < s <= 30.0 for s in client.fake.slept)


async def test_async_on_update_may_be_a_coroutine(
    fake_time: FakeTime, respx_gateway: respx.MockRouter
) -> None:
    client = make_client("async", fake_time)  # coroutine callbacks are an AsyncClient feature
    respx_gateway.get(QUERY).mock(
        side_effect=[beta_task("42", "processing", progress=5), beta_done("42")]
    )
    seen: list[int | None] = []

    async def on_update(task: Task) -> None:
        seen.append(task.progress)

    await client.wait("42", on_update=on_update)
    assert seen == [5, 100]
    await client.close()


async def test_wait_accepts_a_submission_and_keeps_its_surface(
    client: Driven, respx_gateway: respx.MockRouter
) -> None:
    respx_gateway.post("/alpha/api/v1/jobs/createTask").mock(return_value=alpha_submitted("42"))
    route = respx_gateway.get("/alpha/api/v1/jobs/recordInfo").mock(
        side_effect=[alpha_task("42", "queuing"), alpha_task("42", "generating"), alpha_done("42")]
    )
    sub = await client.submit("a cat", surface="alpha")
    task = await client.wait(sub)
    assert task.surface == "alpha"
    assert task.image_urls == ["http://cdn.test/r/42.png"]
    assert task.credits == 4.0
    assert route.call_count == 3


async def test_query_timeouts_and_5xx_are_retried_inside_the_wait(
    client: Driven, respx_gateway: respx.MockRouter
) -> None:
    route = respx_gateway.get(QUERY).mock(
        side_effect=[
            beta_task("42", "processing", progress=10),
            httpx.ReadTimeout("slow"),
            beta_error(500, "internal"),
            httpx.ConnectError("refused"),
            beta_error(503, "busy", retry_after="2"),
            httpx.RemoteProtocolError("dropped"),
            beta_error(502, "bad_gateway"),
            beta_done("42"),
        ]
    )
    task = await client.wait("42")  # more faults in a row than max_attempts=4
    assert task.status is TaskStatus.SUCCEEDED
    assert route.call_count == 8


async def test_terminal_failure_raises_task_failed_with_public_error(
    client: Driven, respx_gateway: respx.MockRouter
) -> None:
    route = respx_gateway.get(QUERY).mock(
        side_effect=[
            beta_task("42", "processing"),
            beta_task("42", "failed", error={"code": "content_policy", "message": "Refused."}),
        ]
    )
    with pytest.raises(TaskFailedError) as info:
        await client.wait("42")
    err = info.value
    assert err.task.error is not None
    assert (err.code, err.task.error.message) == ("content_policy", "Refused.")
    assert "Refused." in str(err)
    assert route.call_count == 2


async def test_alpha_failure(client: Driven, respx_gateway: respx.MockRouter) -> None:
    respx_gateway.get("/alpha/api/v1/jobs/recordInfo").mock(
        return_value=alpha_task("42", "fail", failCode="nsfw", failMsg="Not allowed.")
    )
    with pytest.raises(TaskFailedError) as info:
        await client.wait("42", surface="alpha")
    assert info.value.task.error is not None
    assert info.value.task.error.code == "nsfw"


async def test_cancelled_counts_as_failed(client: Driven, respx_gateway: respx.MockRouter) -> None:
    respx_gateway.get(QUERY).mock(return_value=beta_task("42", "cancelled"))
    with pytest.raises(TaskFailedError) as info:
        await client.wait("42")
    assert info.value.code == "cancelled"


async def test_deadline_raises_wait_timeout_not_failure(
    client: Driven, respx_gateway: respx.MockRouter
) -> None:
    route = respx_gateway.get(QUERY).mock(return_value=beta_task("42", "processing", progress=50))
    with pytest.raises(WaitTimeoutError) as info:
        await client.wait("42", wait_timeout=45)
    err = info.value
    assert not isinstance(err, TaskFailedError)
    assert err.task_id == "42"
    assert err.last_task is not None
    assert err.last_task.progress == 50
    assert sum(client.fake.slept) == pytest.approx(45.0)
    assert route.call_count >= 5
    assert "wait on it again" in str(err)


async def test_unknown_state_is_active_until_the_deadline(
    client: Driven, respx_gateway: respx.MockRouter
) -> None:
    respx_gateway.get(QUERY).mock(return_value=beta_task("42", "warming_up"))
    with pytest.raises(WaitTimeoutError):
        await client.wait("42", wait_timeout=20)


async def test_not_found_ends_the_wait(client: Driven, respx_gateway: respx.MockRouter) -> None:
    route = respx_gateway.get(QUERY).mock(return_value=beta_error(404, "task_not_found"))
    with pytest.raises(NotFoundError):
        await client.wait("42")
    assert route.call_count == 1


async def test_generate_submits_once_and_waits(
    client: Driven, respx_gateway: respx.MockRouter
) -> None:
    submit = respx_gateway.post("/beta/v1/images/generations").mock(
        side_effect=[httpx.ReadTimeout("lost"), beta_submitted("42")]
    )
    query = respx_gateway.get(QUERY).mock(
        side_effect=[beta_task("42", "processing"), beta_done("42")]
    )
    updates: list[TaskStatus] = []
    task = await client.generate("a cat", on_update=lambda t: updates.append(t.status))
    assert task.status is TaskStatus.SUCCEEDED
    assert submit.call_count == 2
    keys = {c.request.headers["idempotency-key"] for c in submit.calls}
    assert len(keys) == 1
    assert query.call_count == 2
    assert updates == [TaskStatus.RUNNING, TaskStatus.SUCCEEDED]


async def test_generate_timeout_never_resubmits(
    client: Driven, respx_gateway: respx.MockRouter
) -> None:
    submit = respx_gateway.post("/beta/v1/images/generations").mock(
        return_value=beta_submitted("42")
    )
    respx_gateway.get(QUERY).mock(return_value=beta_task("42", "processing"))
    with pytest.raises(WaitTimeoutError) as info:
        await client.generate("a cat", wait_timeout=30)
    assert submit.call_count == 1
    assert info.value.task_id == "42"


@pytest.mark.parametrize("timeout", [-1, "soon", float("nan"), True])
async def test_bad_wait_timeout(
    client: Driven, respx_gateway: respx.MockRouter, timeout: object
) -> None:
    from imggw_client import RequestValidationError

    with pytest.raises(RequestValidationError):
        await client.wait("42", wait_timeout=timeout)
    with pytest.raises(RequestValidationError):
        await client.generate("a cat", wait_timeout=timeout)  # refused before the (paid) submit
    assert len(respx_gateway.calls) == 0


async def test_generate_waits_before_its_first_query(
    client: Driven, respx_gateway: respx.MockRouter
) -> None:
    respx_gateway.post("/beta/v1/images/generations").mock(return_value=beta_submitted("42"))
    query = respx_gateway.get(QUERY).mock(return_value=beta_done("42"))
    await client.generate("a cat")
    assert query.call_count == 1  # no query at t=0: the task was just created
    assert 0.8 <= client.fake.slept[0] <= 1.0


async def test_waiting_on_a_fresh_submission_skips_the_pointless_first_query(
    client: Driven, respx_gateway: respx.MockRouter
) -> None:
    respx_gateway.post("/beta/v1/images/generations").mock(return_value=beta_submitted("42"))
    query = respx_gateway.get(QUERY).mock(return_value=beta_done("42"))
    sub = await client.submit("a cat")
    client.fake.now += 0.3  # the caller did something else for a while
    await client.wait(sub)
    assert query.call_count == 1
    assert 0.5 <= client.fake.slept[0] <= 0.7  # only the rest of the first interval
    client.fake.slept.clear()
    await client.wait("42")  # a bare id: the task may be old, so ask at once
    assert client.fake.slept == []
    client.fake.now += 5
    await client.wait(sub)  # an old submission: ask at once too
    assert client.fake.slept == []
