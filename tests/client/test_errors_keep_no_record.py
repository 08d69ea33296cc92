"""An error's task keeps no gateway record (``raw`` empty): a ``TaskFailedError``'s ``task``
and a ``WaitTimeoutError``'s ``last_task``. The record as received may echo the API key, which
the error's message blanks but a pickle of the error (sent from a worker process) or a dump of
its task would carry whole; and it may nest deeper than ``pickle`` goes, when every error must
survive pickling. A task a call returns or yields keeps its record. Both clients, on respx."""

from __future__ import annotations

import json
import pickle
from typing import Any

import httpx
import pytest
import respx

from imggw_client import AsyncClient, TaskFailedError, TaskStatus, WaitTimeoutError

from ..conftest import CANARY_KEY, Driven

pytestmark = pytest.mark.anyio

QUERY = "/beta/v1/tasks/42"
# Deeper than pickle's recursion goes (a list in a list, 600 times over).
DEPTH = 600


def echoing(status: str) -> Any:
    """A gateway whose task record echoes the Authorization header its query came with."""

    def answer(request: httpx.Request) -> httpx.Response:
        said = request.headers["authorization"]
        error = {"code": "denied", "message": f"refused: {said}"}
        data = {"id": "42", "status": status, "progress": 10, "error": error}
        data["debug"] = {"authorization": said}
        return httpx.Response(200, json={"code": 200, "data": data})

    return answer


def nested(status: str) -> httpx.Response:
    """A task record with a field nested :data:`DEPTH` levels deep (parseable JSON)."""
    deep = "[" * DEPTH + "]" * DEPTH
    record = f'{{"id":"42","status":"{status}","progress":5,"x":{deep}}}'
    return httpx.Response(200, content=f'{{"code":200,"data":{record}}}'.encode())


async def raised(client: Driven, status: str) -> TaskFailedError | WaitTimeoutError:
    with pytest.raises((TaskFailedError, WaitTimeoutError)) as info:
        await client.wait("42", wait_timeout=5)
    err = info.value
    assert isinstance(err, TaskFailedError if status == "failed" else WaitTimeoutError)
    return err


def task_of(err: TaskFailedError | WaitTimeoutError) -> Any:
    return err.task if isinstance(err, TaskFailedError) else err.last_task


@pytest.mark.parametrize("status", ["failed", "processing"])
async def test_an_error_from_a_record_echoing_the_key_pickles_without_it(
    client: Driven, respx_gateway: respx.MockRouter, status: str
) -> None:
    respx_gateway.get(QUERY).mock(side_effect=echoing(status))
    err = await raised(client, status)
    assert CANARY_KEY not in str(err)
    blob = pickle.dumps(err)
    assert CANARY_KEY.encode() not in blob
    assert CANARY_KEY not in task_of(err).model_dump_json()
    back = pickle.loads(blob)
    task = task_of(back)
    assert task.raw == {}
    assert (task.id, task.surface, task.progress) == ("42", "beta", 10)
    assert vars(back) == vars(err)
    if status == "failed":
        assert task.status is TaskStatus.FAILED
        assert task.error is not None
        assert task.error.code == "denied"  # what the task said, made safe to show
        assert back.code == "denied"


@pytest.mark.parametrize("status", ["failed", "processing"])
async def test_an_error_from_a_deeply_nested_record_pickles_and_unpickles(
    client: Driven, respx_gateway: respx.MockRouter, status: str
) -> None:
    respx_gateway.get(QUERY).mock(return_value=nested(status))
    err = await raised(client, status)
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is type(err)
    assert vars(back) == vars(err)
    assert task_of(back).id == "42"
    json.loads(task_of(err).model_dump_json())  # its task dumps too


async def test_as_completed_yields_a_failed_task_with_its_record(
    client: Driven, respx_gateway: respx.MockRouter
) -> None:
    # A failed task is one of as_completed's results, as a succeeded one is: it keeps the
    # record, as get() would give it; only an error's task leaves it behind.
    respx_gateway.get(QUERY).mock(side_effect=echoing("failed"))
    inner = client.inner
    if isinstance(inner, AsyncClient):
        got = [task async for task in inner.as_completed(["42"], timeout=5)]
    else:
        got = list(inner.as_completed(["42"], timeout=5))
    assert [task.status for task in got] == [TaskStatus.FAILED]
    assert got[0].raw["data"]["debug"] == {"authorization": f"Bearer {CANARY_KEY}"}
