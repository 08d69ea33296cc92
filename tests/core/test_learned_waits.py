"""Polls that learn (DESIGN 15), as the wait flow uses them: a client's waits teach one model
and later waits of the same kind spend fewer queries, keeping the promise; ``learn=False`` and
waits that do not know their task's start poll exactly as before; a ``Retry-After`` on an
active task is a hint within the promise. Driven on a fake clock: nothing sleeps."""

from __future__ import annotations

import random
from datetime import datetime, timezone
from typing import Any

import pytest

from imggw_client import PollPolicy, Submission, TaskFailedError, TaskStatus
from imggw_client._core.durations import DurationModel
from imggw_client._core.flows import Flows
from imggw_client._core.poll import JITTER_LOW, poll_interval
from imggw_client._core.wire import Reply

from .test_core_flows import Script, flows, task

EPOCH = 1e9  # the fake wall clock at monotonic 0


def submission(
    script: Script, *, resolution: str | None = "1k", how: str = "here", replayed: bool = False
) -> Submission:
    """A submission just answered, as ``submit`` returns it (``how="here"``: with this process's
    monotonic stamp) or as read back from JSON in another process (``"json"``: wall time only)."""
    at = datetime.fromtimestamp(EPOCH + script.now, timezone.utc)
    sub = Submission(
        task_id="9",
        idempotency_key="k",
        surface="beta",
        resolution=resolution,
        submitted_at=None if replayed else at,
        replayed=replayed,
    )
    if how == "here":
        sub._accepted_at = script.now
    return sub


def learning_flows(script: Script, **settings: Any) -> Flows:
    f = flows(script, **settings)
    f.wall = lambda: EPOCH + script.now
    return f


def run_task(f: Flows, script: Script, duration: float, **sub: Any) -> tuple[int, float]:
    """One task of ``duration`` seconds submitted now and waited on: (queries, delay between
    its finish and the wait's return)."""
    start, sent_before = script.now, len(script.sent)
    script.outcomes = [lambda now: done_after(now - start, duration)]
    result = script.run(f.wait(submission(script, **sub), surface=None, timeout=3600))
    assert result.status is TaskStatus.SUCCEEDED
    return len(script.sent) - sent_before, script.now - (start + duration)


def done_after(elapsed: float, duration: float) -> Reply:
    return task("completed", 100) if elapsed >= duration else task("processing", 50)


def test_a_client_learns_and_its_later_waits_query_far_less_keeping_the_promise() -> None:
    rng = random.Random(7)
    script = Script(task("pending"))
    learned = learning_flows(script)
    queries, late = [], []
    for n in range(60):
        duration = rng.uniform(30.0, 90.0)
        count, delay = run_task(learned, script, duration)
        if n >= 20:  # warmed up
            queries.append(count)
            late.append(delay / (0.15 * duration + 1.0))
        script.now += 0.5
    today_script = Script(task("pending"))
    today = learning_flows(today_script, poll=PollPolicy(learn=False))
    rng = random.Random(7)
    today_queries = []
    for n in range(60):
        count, _ = run_task(today, today_script, rng.uniform(30.0, 90.0))
        if n >= 20:
            today_queries.append(count)
    assert max(late) <= 1.0  # every task seen within 15% of its running time plus 1 s
    assert sorted(queries)[len(queries) // 2] <= 7  # median queries per task
    assert sorted(today_queries)[len(today_queries) // 2] >= 15  # today's, same tasks
    assert sum(queries) < 0.5 * sum(today_queries)
    assert learned.durations.observation_count() == 50  # the window: bounded


@pytest.mark.parametrize("how", ["here", "json"])
def test_a_submission_read_back_from_json_learns_like_one_made_here(how: str) -> None:
    script = Script(task("pending"))
    f = learning_flows(script)
    for _ in range(12):
        run_task(f, script, 40.0, how=how)
    assert f.durations.first_query_at(("beta", "1k"), script.now) >= 30.0
    count, delay = run_task(f, script, 40.0, how=how)
    assert count <= 4
    assert 0 <= delay <= 0.15 * 40 + 1


def test_learn_false_polls_exactly_as_the_fixed_schedule() -> None:
    script = Script(lambda now: done_after(now, 60.0))
    f = flows(script, poll=PollPolicy(learn=False))
    sub = submission(script)
    script.run(f.wait(sub, surface=None, timeout=600))
    rng = random.Random(5)  # the seed flows() gives its client
    expected = [poll_interval(PollPolicy(), n, rng) for n in range(len(script.slept))]
    assert script.slept == pytest.approx(expected)  # the first before any query: just submitted
    assert f.durations.observation_count() == 0  # and nothing learned


@pytest.mark.parametrize("target", ["id", "replayed", "no resolution"])
def test_a_wait_that_does_not_know_its_tasks_start_or_kind_polls_as_today(target: str) -> None:
    script = Script(lambda now: done_after(now, 60.0))
    f = learning_flows(script)
    for _ in range(12):  # history it could have used, had it known its task
        f.durations.observe(("beta", "1k"), 55.0, 61.0, script.now)
    waited: Any = {
        "id": "9",
        "replayed": submission(script, replayed=True),
        "no resolution": submission(script, resolution=None),
    }[target]
    script.run(f.wait(waited, surface=None, timeout=600))
    rng = random.Random(5)
    # A submission just answered sleeps today's first interval before its first query; a bare
    # id is queried at once, then sleeps it: the sleeps are today's, one by one.
    expected = [poll_interval(PollPolicy(), n, rng) for n in range(len(script.slept))]
    assert script.slept == pytest.approx(expected)
    assert len(script.sent) == len(script.slept) + (1 if target == "id" else 0)
    assert f.durations.observation_count() == 12  # nothing taught


def test_without_history_a_learning_wait_is_no_busier_than_today() -> None:
    script = Script(lambda now: done_after(now, 60.0))
    f = learning_flows(script)
    script.run(f.wait(submission(script), surface=None, timeout=600))
    assert script.slept[0] >= JITTER_LOW * PollPolicy().initial_interval  # not at once: pending
    today = Script(lambda now: done_after(now, 60.0))
    script_today = flows(today, poll=PollPolicy(learn=False))
    today.run(script_today.wait(submission(today), surface=None, timeout=600))
    assert len(script.sent) <= len(today.sent) + 1
    assert f.durations.observations(("beta", "1k"), script.now) != []  # it taught the model


def test_a_failed_task_teaches_nothing() -> None:
    script = Script(task("processing", 10), task("failed"))
    f = learning_flows(script)
    with pytest.raises(TaskFailedError):
        script.run(f.wait(submission(script), surface=None, timeout=600))
    assert f.durations.observation_count() == 0


def hinted(seconds: str, duration: float = 60.0) -> Any:
    def answer(now: float) -> Reply:
        reply = done_after(now, duration)
        if b"processing" not in reply.content:
            return reply
        return Reply(reply.status, {"retry-after": seconds}, reply.content)

    return answer


def test_a_retry_after_on_an_active_task_is_heeded_by_the_fixed_schedule() -> None:
    script = Script(hinted("4"))
    f = learning_flows(script, poll=PollPolicy(learn=False))
    script.run(f.wait(submission(script), surface=None, timeout=600))
    # Today's sleeps (1 s, x1.15) are shorter than the hint until they pass it: 4 s each.
    assert script.slept[1:4] == pytest.approx([4.0, 4.0, 4.0])
    assert all(s <= PollPolicy().max_interval for s in script.slept)


def test_a_retry_after_stretches_a_learned_sleep_only_within_the_promise() -> None:
    plain, hint = Script(lambda now: done_after(now, 60.0)), Script(hinted("4"))
    for script in (plain, hint):
        script.run(learning_flows(script).wait(submission(script), surface=None, timeout=600))
    # The same draws: each sleep at least as long as without the hint (never a reason to
    # query sooner), and the task still seen within 15% of its running time plus 1 s.
    for with_hint, without in zip(hint.slept, plain.slept, strict=False):
        assert with_hint >= without - 1e-9
    assert hint.now - 60.0 <= 0.15 * 60.0 + 1.0 + 1e-9
    assert len(hint.sent) <= len(plain.sent)


# The fake wall clock stands at EPOCH (2001-09-09): a date in its past.
@pytest.mark.parametrize("hint", ["0", "-5", "junk", "Sat, 08 Sep 2001 07:28:00 GMT"])
def test_a_hint_of_nothing_or_the_past_never_makes_a_wait_spin(hint: str) -> None:
    script = Script(hinted(hint))
    f = learning_flows(script)
    script.run(f.wait(submission(script), surface=None, timeout=600))
    plain = Script(lambda now: done_after(now, 60.0))
    plain.run(learning_flows(plain).wait(submission(plain), surface=None, timeout=600))
    assert len(script.sent) == len(plain.sent)  # the same schedule as with no hint at all
    assert min(script.slept) >= JITTER_LOW * PollPolicy().initial_interval - 1e-9


def test_a_huge_hint_is_capped_by_the_promise_not_obeyed() -> None:
    script = Script(hinted("3600"))
    f = learning_flows(script)
    script.run(f.wait(submission(script), surface=None, timeout=600))
    assert max(script.slept) <= PollPolicy().max_interval
    assert script.now - 60.0 <= 0.15 * 60.0 + 1.0 + 1e-9


def test_with_options_copies_share_what_the_client_learned() -> None:
    from imggw_client import Client

    with Client(api_key="k" * 12, base_url="http://127.0.0.1:9") as client:
        copy = client.with_options(poll=PollPolicy(initial_interval=2.0))
        assert copy._flows.durations is client._flows.durations
        assert isinstance(client._flows.durations, DurationModel)


def test_a_wall_clock_from_the_future_counts_as_just_submitted() -> None:
    script = Script(lambda now: done_after(now, 5.0))
    f = learning_flows(script)
    sub = Submission(
        task_id="9",
        idempotency_key="k",
        surface="beta",
        resolution="1k",
        submitted_at=datetime.fromtimestamp(EPOCH + 3600, timezone.utc),
    )
    result = script.run(f.wait(sub, surface=None, timeout=600))
    assert result.status is TaskStatus.SUCCEEDED
    assert script.now <= 5.0 * 1.15 + 1.0
