"""What a task was made from travels with it (DESIGN 22, "Recovery is per task"): a
``Submission`` carries its ``request``; a ``Task`` from a wait on a submission (``wait``,
``generate``, ``as_completed``, a timed-out wait resumed) carries the request and the
idempotency key, so recovered tasks map back to their requests without reading the journal.
Pickling, JSON and equality stay sane. Both clients, over a real loopback socket."""

from __future__ import annotations

import pickle

import pytest

from imggw_client import (
    ImageRequest,
    PollPolicy,
    Submission,
    Task,
    TaskStatus,
    UnknownOutcomeError,
    WaitTimeoutError,
)
from imggw_client.mock import MockGateway

from ..conftest import CANARY_KEY, FakeTime, make_client

FAST = PollPolicy(initial_interval=0.02, max_interval=0.1)
FOX = ImageRequest("a red fox in snow", aspect_ratio="3:2", resolution="2K")
# Tasks end only when a test moves the gateway's clock.
pytestmark = pytest.mark.gateway(api_keys=[CANARY_KEY], manual_clock=True)


@pytest.mark.anyio
@pytest.mark.gateway(duration_min=1, duration_max=1)
async def test_submissions_and_the_tasks_waited_from_them_carry_their_request_and_key(
    kind: str, fake_time: FakeTime, gateway: MockGateway, shared_gateway_url: str
) -> None:
    client = make_client(kind, fake_time, base_url=shared_gateway_url, poll=FAST)
    try:
        sub = await client.submit("a red fox in snow", aspect_ratio="3:2", resolution="2k")
        assert sub.request == FOX
        handed: list[Submission] = []
        seen: list[Task] = []
        gateway.advance(2)
        task = await client.wait(sub, on_update=seen.append)
        assert (task.request, task.idempotency_key) == (FOX, sub.idempotency_key)
        assert all(t.request == FOX for t in seen)  # every sighting, not only the last
        with pytest.raises(WaitTimeoutError) as timed_out:  # its task still runs
            await client.generate("a lighthouse", on_submit=handed.append, wait_timeout=0)
        asked = ImageRequest("a lighthouse")
        assert handed[0].request == asked
        last = timed_out.value.last_task
        assert last is not None
        assert last.request == asked
        gateway.advance(2)
        resumed = await client.wait(timed_out.value)  # a timed-out wait resumed keeps them
        assert (resumed.request, resumed.idempotency_key) == (asked, handed[0].idempotency_key)
        # A bare get knows neither; a wait on a task keeps the task's.
        bare = await client.get(resumed.id)
        assert (bare.request, bare.idempotency_key) == (None, None)
        again = await client.wait(resumed)
        assert (again.request, again.idempotency_key) == (asked, handed[0].idempotency_key)
    finally:
        await client.close()


@pytest.mark.anyio
async def test_an_unknown_outcome_resent_carries_its_request(
    kind: str, fake_time: FakeTime, gateway: MockGateway, shared_gateway_url: str
) -> None:
    client = make_client(kind, fake_time, base_url=shared_gateway_url, poll=FAST)
    try:
        gateway.configure(fault_rate=1.0, faults=("lost",))
        with pytest.raises(UnknownOutcomeError) as lost:
            await client.submit("a red fox in snow", aspect_ratio="3:2", resolution="2k")
        gateway.configure(fault_rate=0.0)
        sub = await client.submit(lost.value)
        assert sub.request == FOX
        assert gateway.stats()["tasks_created"] == 1
    finally:
        await client.close()


def test_a_submission_keeps_its_request_through_json_and_pickle_and_compares_by_it() -> None:
    sub = Submission(task_id="7", idempotency_key="k-1", surface="beta", request=FOX)
    assert Submission.model_validate_json(sub.model_dump_json()) == sub
    assert pickle.loads(pickle.dumps(sub)) == sub
    assert sub != Submission(task_id="7", idempotency_key="k-1", surface="beta")
    assert "a red fox" not in repr(sub)  # the prompt never shows in a repr
    assert "a red fox" not in sub.model_dump_json(exclude={"request"})
    # A request sent unchecked (validate=False) reads back as it was sent, not judged again.
    odd = ImageRequest.unchecked("a cat", "7:5", "8k")
    kept = Submission.model_validate_json(sub.model_copy(update={"request": odd}).model_dump_json())
    assert kept.request == odd
    task = Task(
        id="7", surface="beta", status=TaskStatus.SUCCEEDED, request=FOX, idempotency_key="k-1"
    )
    assert pickle.loads(pickle.dumps(task)) == task
    assert Task.model_validate_json(task.model_dump_json()) == task
    assert hash(task) == hash(task.model_copy(update={"request": None}))  # same sighting
    assert Task(id="7", surface="beta", status=TaskStatus.RUNNING).request is None  # as before
