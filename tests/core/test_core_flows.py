"""The core flows driven by a scripted fake driver on a fake clock: nothing sleeps, no I/O."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

import pytest

from imggw_client import (
    PollPolicy,
    RetryPolicy,
    TaskFailedError,
    TaskStatus,
    UnknownOutcomeError,
    WaitTimeoutError,
)
from imggw_client._core.config import resolve_settings
from imggw_client._core.flows import Flows
from imggw_client._core.wire import Flow, Notify, Reply, Send, Sleep, TransportFailure


class Script:
    """Answers each Send with the next scripted outcome (a Reply, a TransportFailure, or a
    callable of the clock); Sleep advances the clock; Notify is recorded."""

    def __init__(self, *outcomes: Any) -> None:
        self.outcomes = list(outcomes)
        self.now = 0.0
        self.sent: list[tuple[float, Send]] = []
        self.slept: list[float] = []
        self.updates: list[tuple[TaskStatus, int | None]] = []

    def run(self, flow: Flow[Any]) -> Any:
        outcome: Any = None
        while True:
            try:
                action = flow.send(outcome)
            except StopIteration as done:
                return done.value
            outcome = None
            if isinstance(action, Send):
                self.sent.append((self.now, action))
                nxt = self.outcomes.pop(0) if len(self.outcomes) > 1 else self.outcomes[0]
                outcome = nxt(self.now) if callable(nxt) else nxt
            elif isinstance(action, Sleep):
                assert action.seconds >= 0
                self.slept.append(action.seconds)
                self.now += action.seconds
            elif isinstance(action, Notify):
                self.updates.append((action.task.status, action.task.progress))


def flows(script: Script, **settings: Any) -> Flows:
    resolved = resolve_settings(
        "key-0123456789",
        "http://gw",
        surface=settings.pop("surface", "beta"),
        timeout=30.0,
        max_retries=5,
        retry=settings.pop("retry", RetryPolicy(max_attempts=4)),
        poll=settings.pop("poll", PollPolicy()),
    )
    return Flows(resolved, clock=lambda: script.now, wall=lambda: 1e9, rng=random.Random(5))


def task(status: str, progress: int | None = None, task_id: str = "9") -> Reply:
    data: dict[str, Any] = {"id": task_id, "status": status}
    if progress is not None:
        data["progress"] = progress
    if status == "completed":
        data["result"] = {"images": [{"url": ["http://cdn/x.png"]}]}
    return Reply(200, {}, json.dumps({"code": 200, "data": data}).encode())


def error(status: int, code: str = "x") -> Reply:
    return Reply(status, {}, json.dumps({"error": {"code": code, "message": "m"}}).encode())


LOST = TransportFailure(sent=True, timeout=False, error=ConnectionResetError())
REFUSED = TransportFailure(sent=False, timeout=False, error=ConnectionRefusedError())
TIMED_OUT = TransportFailure(sent=True, timeout=True, error=TimeoutError())


def finishing_at(seconds: float) -> Callable[[float], Reply]:
    def answer(now: float) -> Reply:
        if now >= seconds:
            return task("completed", 100)
        return task("processing", int(100 * now / seconds))

    return answer


def test_wait_polls_on_a_bounded_jittered_schedule_until_success() -> None:
    script = Script(finishing_at(60.0))
    result = script.run(flows(script).wait("9", surface=None, timeout=600))
    assert result.status is TaskStatus.SUCCEEDED
    assert all(s <= 30.0 for s in script.slept)
    assert script.slept[0] <= 1.0
    assert 60.0 <= script.now <= 60.0 * 1.15 + 1  # seen within 15% of its duration + 1 s
    assert len(script.sent) < 25  # far fewer than fixed 2 s polling (30)
    assert script.updates[-1] == (TaskStatus.SUCCEEDED, 100)
    assert all(send.request.method == "GET" for _, send in script.sent)  # a wait never submits


def test_on_update_sees_each_change_once() -> None:
    script = Script(
        task("pending"),
        task("pending"),
        task("processing", 10),
        task("processing", 10),
        task("processing", 50),
        task("completed", 100),
    )
    script.run(flows(script).wait("9", surface=None, timeout=600))
    assert script.updates == [
        (TaskStatus.PENDING, None),
        (TaskStatus.RUNNING, 10),
        (TaskStatus.RUNNING, 50),
        (TaskStatus.SUCCEEDED, 100),
    ]


def test_wait_deadline_raises_wait_timeout_with_the_last_task_and_checks_once_more() -> None:
    script = Script(finishing_at(10_000.0))
    with pytest.raises(WaitTimeoutError) as info:
        script.run(flows(script).wait("9", surface=None, timeout=120))
    err = info.value
    assert not isinstance(err, TaskFailedError)
    assert err.task_id == "9"
    assert err.last_task is not None
    assert err.last_task.status is TaskStatus.RUNNING
    assert script.now == pytest.approx(120.0)  # ends exactly at the deadline...
    assert script.sent[-1][0] == pytest.approx(119.0)  # ...after a last query 1 s before it
    # Every query is bounded by what is left of the wait: none can run past the deadline.
    assert all(at + send.timeout <= 120.0 + 1e-9 for at, send in script.sent)
    assert script.sent[-1][1].timeout == pytest.approx(1.0)


def test_a_short_wait_polls_until_just_before_its_deadline() -> None:
    script = Script(finishing_at(10_000.0))
    fast = PollPolicy(initial_interval=0.05, max_interval=0.1)
    with pytest.raises(WaitTimeoutError):
        script.run(flows(script, poll=fast).wait("9", surface=None, timeout=0.5))
    assert script.now == pytest.approx(0.5)
    assert len(script.sent) >= 5
    assert all(at + send.timeout <= 0.5 + 1e-9 for at, send in script.sent)


def test_wait_with_zero_timeout_queries_once() -> None:
    script = Script(task("processing", 5))
    with pytest.raises(WaitTimeoutError):
        script.run(flows(script).wait("9", surface=None, timeout=0))
    assert len(script.sent) == 1  # "check once": bounded by the client's own timeout
    assert script.sent[0][1].timeout == 30.0
    assert script.now == 0.0


def test_unknown_states_count_as_active_and_the_deadline_still_bounds_them() -> None:
    script = Script(task("warming_up"))
    with pytest.raises(WaitTimeoutError) as info:
        script.run(flows(script).wait("9", surface=None, timeout=30))
    assert info.value.last_task is not None
    assert info.value.last_task.status is TaskStatus.RUNNING


@pytest.mark.parametrize("state", ["failed", "cancelled"])
def test_terminal_failure_stops_polling(state: str) -> None:
    script = Script(task("processing", 20), task(state))
    with pytest.raises(TaskFailedError) as info:
        script.run(flows(script).wait("9", surface=None, timeout=600))
    assert len(script.sent) == 2
    assert info.value.task.status is TaskStatus.FAILED
    assert info.value.task.error is not None


def test_query_faults_inside_a_wait_are_retried_beyond_max_attempts() -> None:
    faults = [TIMED_OUT, error(500), LOST, error(503), REFUSED, error(502), TIMED_OUT]
    script = Script(*faults, task("completed", 100))
    result = script.run(
        flows(script, retry=RetryPolicy(max_attempts=2)).wait("9", surface=None, timeout=600)
    )
    assert result.status is TaskStatus.SUCCEEDED
    assert len(script.sent) == len(faults) + 1


def test_a_gateway_down_until_the_deadline_ends_in_wait_timeout_not_failure() -> None:
    script = Script(task("processing", 30), TIMED_OUT)
    with pytest.raises(WaitTimeoutError) as info:
        script.run(flows(script).wait("9", surface=None, timeout=60))
    assert info.value.last_task is not None
    assert info.value.last_task.progress == 30
    assert script.now == pytest.approx(60.0)


def test_non_retryable_query_errors_end_the_wait_at_once() -> None:
    from imggw_client import NotFoundError

    script = Script(error(404, "task_not_found"))
    with pytest.raises(NotFoundError):
        script.run(flows(script).wait("9", surface=None, timeout=600))
    assert len(script.sent) == 1


def test_submit_retries_reuse_one_key_and_end_in_unknown_outcome() -> None:
    script = Script(LOST, TIMED_OUT, error(502), LOST)
    flow = flows(script).submit(
        "a cat", aspect_ratio="auto", resolution="1k", surface=None, idempotency_key=None
    )
    with pytest.raises(UnknownOutcomeError) as info:
        script.run(flow)
    keys = {send.request.headers["Idempotency-Key"] for _, send in script.sent}  # type: ignore[index]
    assert len(script.sent) == 4
    assert keys == {info.value.idempotency_key}
    assert len(info.value.idempotency_key) == 32
    assert info.value.request.prompt == "a cat"
    bodies = {send.request.body for _, send in script.sent}
    assert len(bodies) == 1  # byte-identical retries


def test_generate_is_submit_then_wait_and_never_resubmits_a_slow_task() -> None:
    submitted = Reply(200, {}, b'{"code":200,"data":[{"status":"submitted","task_id":"9"}]}')
    answers = iter([submitted])

    def answer(now: float) -> Reply:
        return next(answers, None) or finishing_at(900.0)(now)

    script = Script(answer)
    with pytest.raises(WaitTimeoutError):
        script.run(
            flows(script).generate(
                "a cat",
                aspect_ratio="auto",
                resolution="1k",
                surface=None,
                idempotency_key=None,
                timeout=600,
            )
        )
    posts = [s for _, s in script.sent if s.request.method == "POST"]
    assert len(posts) == 1
