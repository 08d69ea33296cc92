"""Every wait is jittered, learned or not (DESIGN 18): two waits started together never poll in
lockstep, while the duration model is empty (the first wait of a kind) and when
``initial_interval == max_interval`` (where today's floor binds), and no jittered sleep is
shorter than today's shortest, longer than ``max_interval``, or late for the promise. On a fake
clock with seeded randomness: nothing sleeps."""

from __future__ import annotations

import heapq
import itertools
import random
from datetime import datetime, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from imggw_client import PollPolicy, Submission
from imggw_client._core.durations import DurationModel
from imggw_client._core.flows import Flows
from imggw_client._core.poll import JITTER_LOW, plan_wait, promise_gap, today_gap
from imggw_client._core.wire import Send, Sleep

from .test_core_flows import Script, flows, task

EPOCH = 1e9  # the fake wall clock at monotonic 0
KIND = ("beta", "1k")


def run_together(f: Flows, durations: list[float], now: list[float]) -> list[list[float]]:
    """Waits on tasks submitted together (one per duration), driven at once on one virtual
    clock as one client's tasks would be; the gateway answers at once. Returns each wait's
    query times."""
    at = datetime.fromtimestamp(EPOCH + now[0], timezone.utc)
    waits = []
    for i in range(len(durations)):
        sub = Submission(
            task_id=str(i + 1),
            idempotency_key=f"k{i}",
            surface="beta",
            resolution="1k",
            submitted_at=at,
        )
        sub._accepted_at = now[0]
        waits.append(f.wait(sub, surface=None, timeout=3600))
    start = now[0]
    queries: list[list[float]] = [[] for _ in durations]
    ready: list[tuple[float, int, Any]] = [(start, i, None) for i in range(len(durations))]
    heapq.heapify(ready)
    while ready:
        now[0], i, outcome = heapq.heappop(ready)
        try:
            action = waits[i].send(outcome)
            while not isinstance(action, (Send, Sleep)):  # Observe, Notify: nothing to do
                action = waits[i].send(None)
        except StopIteration:
            continue
        if isinstance(action, Sleep):
            heapq.heappush(ready, (now[0] + action.seconds, i, None))
            continue
        queries[i].append(now[0])
        done = now[0] - start >= durations[i]
        answer = task("completed" if done else "processing", task_id=str(i + 1))
        heapq.heappush(ready, (now[0], i, answer))
    return queries


def gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(times)]


def client_flows(now: list[float], policy: PollPolicy, seed: int = 5) -> Flows:
    f = flows(Script(task("pending")), poll=policy)
    f.clock = lambda: now[0]
    f.wall = lambda: EPOCH + now[0]
    f.rng = random.Random(seed)
    return f


def test_two_first_waits_of_a_kind_do_not_poll_in_lockstep() -> None:
    """An empty model: each wait starts on today's schedule, where the floor binds. Before
    DESIGN 18 every sleep after the first was exactly today's unjittered gap."""
    now = [0.0]
    f = client_flows(now, PollPolicy())
    a, b = run_together(f, [60.0, 60.0], now)
    assert f.durations.observation_count() == 2  # both were first waits of their kind
    assert set(a).isdisjoint(b)
    assert gaps(a) != pytest.approx(gaps(b))
    for times in (a, b):
        for n, gap in enumerate(gaps(times)):  # each jittered: none exactly today's gap
            assert gap != pytest.approx(today_gap(PollPolicy(), n + 1), rel=1e-6)
    # And two clients (two processes started together) with the same seed-less start too.
    now2 = [0.0]
    c = run_together(client_flows(now2, PollPolicy(), seed=11), [60.0], now2)[0]
    now3 = [0.0]
    d = run_together(client_flows(now3, PollPolicy(), seed=12), [60.0], now3)[0]
    assert gaps(c)[1:] != pytest.approx(gaps(d)[1:])


def test_waits_whose_interval_never_grows_do_not_poll_in_lockstep() -> None:
    """``initial_interval == max_interval``: today's gap is the cap from the start; learned or
    not, every sleep is drawn below it."""
    policy = PollPolicy(initial_interval=5.0, max_interval=5.0)
    now = [0.0]
    f = client_flows(now, policy)
    a, b = run_together(f, [120.0, 120.0], now)
    assert set(a).isdisjoint(b)
    for times in (a, b):
        spacing = gaps(times)
        assert len(set(spacing)) == len(spacing)  # no two sleeps alike
        assert all(JITTER_LOW * 5.0 <= g <= 5.0 for g in spacing)
    # With a history the same holds: the first query waits, then the gaps are jittered.
    f.durations.seed(KIND, [(100.0, 104.0)] * 20, now=now[0])
    c, d = run_together(f, [120.0, 120.0], now)
    assert c[0] != d[0]
    assert gaps(c) != pytest.approx(gaps(d))
    assert all(JITTER_LOW * 5.0 <= g <= 5.0 for g in gaps(c) + gaps(d))


policies = st.builds(
    lambda initial, cap, multiplier: PollPolicy(
        initial_interval=initial, max_interval=initial * cap, multiplier=multiplier
    ),
    st.floats(0.05, 10.0),
    st.one_of(st.just(1.0), st.floats(1.0, 50.0)),  # initial == max half the time or so
    st.floats(1.0, 2.0),
)


@settings(max_examples=300, deadline=None)
@given(
    policy=policies,
    history=st.one_of(st.just(0), st.integers(10, 50)),
    fastest=st.floats(0.5, 100.0),
    duration=st.floats(0.0, 600.0),
    seed=st.integers(0, 2**32),
)
@pytest.mark.slow
def test_every_jittered_gap_is_within_todays_bounds_and_the_promise(
    policy: PollPolicy, history: int, fastest: float, duration: float, seed: int
) -> None:
    """One wait from its submit against an instant gateway, the model empty or warm: every
    sleep after an answer lies between today's shortest (``JITTER_LOW`` times today's gap) and
    ``max_interval``, and the task is seen within the promise when it is at least as slow as
    the fastest the model timed (every task, with no history)."""
    model = DurationModel()
    if history:
        model.seed(KIND, [(fastest, fastest * 1.1)] * history, now=0.0)
    rng = random.Random(seed)
    plan = plan_wait(policy, model, KIND, started=0.0, accepted=0.0, now=0.0, rng=rng)
    now = plan.first_sleep(0.0)
    assert 0.0 <= now <= max(policy.max_interval, fastest)
    last_active, polls = None, 0
    while now < duration:
        polls += 1
        sleep = plan.active(now, now)
        n = getattr(plan, "polls", polls) - 1
        assert JITTER_LOW * today_gap(policy, n) * (1 - 1e-9) <= sleep <= policy.max_interval
        assert sleep <= promise_gap(policy, now) + 1e-9
        last_active, now = now, now + sleep
        assert polls < 100_000
    covered = not history or duration >= fastest
    if covered and last_active is not None:
        allowed = promise_gap(policy, duration)
        assert now - duration <= allowed + 1e-9


@settings(max_examples=100, deadline=None)
@given(policy=policies, seed=st.integers(0, 2**32))
def test_two_waits_started_together_never_share_a_gap(policy: PollPolicy, seed: int) -> None:
    """Any policy, an empty model, one client's randomness: the second wait's sleeps are never
    the first's."""
    rng = random.Random(seed)
    plans = [
        plan_wait(policy, DurationModel(), KIND, started=0.0, accepted=0.0, now=0.0, rng=rng)
        for _ in range(2)
    ]
    schedules = []
    for plan in plans:
        now, sleeps = plan.first_sleep(0.0), []
        for _ in range(12):
            sleeps.append(plan.active(now, now))
            now += sleeps[-1]
        schedules.append(sleeps)
    assert all(x != y for x, y in zip(*schedules, strict=True))
