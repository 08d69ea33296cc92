"""Queries that wait for a saturated budget go most-likely-finished first (DESIGN 15), and no
waiting query is passed over for longer than one ``max_interval``; priorities reorder who goes
when, never how many go or how fast."""

from __future__ import annotations

import heapq
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from imggw_client import RateLimit
from imggw_client._core.budget import QUERY, SUBMIT, Budget, Ticket
from imggw_client._core.poll import query_priority

from .test_core_budget import GUARD, most_in_window

MAX_INTERVAL = 30.0


def key(now: float, chance: float | None) -> float:
    """A wait's priority, as the flow makes it: when it was asked, plus up to one
    max_interval the less likely its task has finished."""
    return now + query_priority(chance, 0.0, MAX_INTERVAL)


def drive(budget: Budget, arrivals: list[tuple[float, float | None]]) -> list[tuple[float, int]]:
    """Each arrival (time, chance) reserves with its priority, sleeps as told, then sends:
    (send time, arrival index) in the order they went, on a virtual clock."""
    heap: list[tuple[float, int, int, Ticket | None]] = []
    order = itertools.count()
    for n, (at, _) in enumerate(arrivals):
        heapq.heappush(heap, (at, next(order), n, None))
    sent: list[tuple[float, int]] = []
    while heap:
        now, _, n, ticket = heapq.heappop(heap)
        if ticket is None:
            ticket = budget.reserve(QUERY, now, priority=key(now, arrivals[n][1]))
        wait = budget.wait_time(ticket, now)
        if wait > 0:
            heapq.heappush(heap, (now + wait, next(order), n, ticket))
            continue
        sent.append((now, n))
        budget.finished(ticket, now)
    return sent


def test_the_query_most_likely_to_find_its_task_finished_takes_the_next_slot() -> None:
    budget = Budget(RateLimit(queries_per_second=1))
    first = budget.reserve(QUERY, 0.0)  # takes the free slot now
    assert budget.wait_time(first, 0.0) == 0.0
    unlikely = budget.reserve(QUERY, 0.0, priority=key(0.0, 0.05))
    likely = budget.reserve(QUERY, 0.0, priority=key(0.0, 0.95))
    unknown = budget.reserve(QUERY, 0.0, priority=key(0.0, None))
    interval = 1.0 + GUARD
    assert budget.wait_time(likely, 0.0) == pytest.approx(interval)
    assert budget.wait_time(unknown, 0.0) == pytest.approx(2 * interval)
    assert budget.wait_time(unlikely, 0.0) == pytest.approx(3 * interval)
    assert budget.wait_time(likely, interval) == 0.0  # it goes at the first slot


def test_a_newcomer_more_likely_to_find_a_result_moves_ahead_of_those_waiting() -> None:
    budget = Budget(RateLimit(queries_per_second=1))
    sent = drive(budget, [(0.0, 0.5), (0.0, 0.1), (0.0, 0.2), (0.5, 0.99)])
    assert [n for _, n in sent] == [0, 3, 2, 1]
    times = [t for t, _ in sent]
    assert times == pytest.approx([0.0, 1.01, 2.02, 3.03])  # the same slots, reordered


def test_without_priorities_a_lane_keeps_request_order() -> None:
    budget = Budget(RateLimit(submits_per_second=2))
    tickets = [budget.reserve(SUBMIT, 0.0) for _ in range(5)]
    waits = [budget.wait_time(t, 0.0) for t in tickets]
    assert waits == sorted(waits)
    assert waits[-1] == pytest.approx(4 * 0.5 * (1 + GUARD))


def test_a_query_given_back_leaves_the_others_in_their_order_and_the_last_place_free() -> None:
    budget = Budget(RateLimit(queries_per_second=1))
    budget.wait_time(budget.reserve(QUERY, 0.0), 0.0)
    a = budget.reserve(QUERY, 0.0, priority=key(0.0, 0.9))
    b = budget.reserve(QUERY, 0.0, priority=key(0.0, 0.1))
    c = budget.reserve(QUERY, 0.0, priority=key(0.0, 0.5))
    budget.release(b)  # last in priority: its place, the last one, is given back
    d = budget.reserve(QUERY, 0.0, priority=key(0.0, 0.0))
    assert budget.wait_time(a, 0.0) == pytest.approx(1.01)
    assert budget.wait_time(c, 0.0) == pytest.approx(2.02)
    assert budget.wait_time(d, 0.0) == pytest.approx(3.03)  # no hole where b was


def test_a_query_that_cannot_be_likely_still_goes_within_one_max_interval_of_newcomers() -> None:
    # Saturated: one query a second, a new sure-to-be-finished query every second. The one
    # whose task is surely still running (chance 0) waits behind newcomers for at most one
    # max_interval's worth of them, then goes.
    budget = Budget(RateLimit(queries_per_second=1))
    arrivals: list[tuple[float, float | None]] = [(0.0, 0.0)]
    arrivals += [(float(t), 1.0) for t in range(0, 120)]
    sent = drive(budget, arrivals)
    went = {n: t for t, n in sent}
    overtook = [n for n in range(1, len(arrivals)) if went[n] < went[0]]
    assert all(arrivals[n][0] <= MAX_INTERVAL for n in overtook)
    assert went[0] <= MAX_INTERVAL + 3


@settings(max_examples=80, deadline=None)
@given(
    rate=st.floats(min_value=0.5, max_value=20),
    gaps=st.lists(st.floats(min_value=0, max_value=1), min_size=2, max_size=80),
    chances=st.lists(
        st.one_of(st.none(), st.floats(min_value=0, max_value=1)), min_size=80, max_size=80
    ),
    width=st.floats(min_value=0.1, max_value=10),
)
@pytest.mark.slow
def test_priorities_never_break_the_pace_nor_let_a_query_be_passed_for_long(
    rate: float, gaps: list[float], chances: list[float | None], width: float
) -> None:
    budget = Budget(RateLimit(queries_per_second=rate))
    times = list(itertools.accumulate(gaps))
    arrivals = list(zip(times, chances, strict=False))
    sent = drive(budget, arrivals)
    assert sorted(n for _, n in sent) == list(range(len(arrivals)))  # every query goes
    assert most_in_window([t for t, _ in sent], width) <= rate * width + 1
    went = {n: t for t, n in sent}
    for early, (asked, _) in enumerate(arrivals):
        for late in range(early + 1, len(arrivals)):
            if arrivals[late][0] > asked + MAX_INTERVAL:
                assert went[late] >= went[early]  # asked a max_interval later: not before
