"""A limit with no Retry-After (surface A's provider), met with no ceiling (DESIGN 20): the lane
learns the gateway's window from its probes and times its pauses to it. Pure, on a fake clock."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

from imggw_client import RateLimit
from imggw_client._core import budget as B
from imggw_client._core.budget import SUBMIT, Budget, Ticket

from .test_core_budget import gateway_run, sliding_limit


def sent(budget: Budget, now: float) -> Ticket:
    ticket = budget.reserve(SUBMIT, now)
    assert budget.wait_time(ticket, now) == 0.0
    return ticket


def lane(budget: Budget) -> B._Lane:
    return budget._lanes[SUBMIT]


def test_at_a_window_with_no_hint_one_429_a_window_not_a_probe_each_doubling() -> None:
    # 100 submits at once against 20 per 10 s, 429s with no Retry-After: each window cost four
    # 429s (the one that found it full, then probes 0.5, 1 and 2 s later, refused) and the last
    # probe, 4 s later still, came up to 2.6 s after the window had freed: 23 429s, 49.7 s.
    budget = Budget(RateLimit())
    last, limited = gateway_run(
        budget, 100, workers=100, refuse=sliding_limit(20, 10.0), hinted=False
    )
    assert limited <= 16  # 11 to find the first window, then about one a window
    assert last <= 1.15 * 40  # the floor: four windows of 10 s after the first 20
    assert 9.0 <= lane(budget).cycle_lo < 10.0 <= lane(budget).cycle_hi <= 11.0


def test_a_longer_run_at_a_window_with_no_hint_costs_about_one_429_a_window() -> None:
    budget = Budget(RateLimit())
    last, limited = gateway_run(
        budget, 300, workers=8, refuse=sliding_limit(20, 10.0), hinted=False
    )
    assert limited <= 30  # 14 windows (67 429s before)
    assert last <= 1.1 * 140


def test_the_pause_after_a_full_run_is_timed_halfway_between_the_bounds_learned() -> None:
    budget = Budget(RateLimit())
    run = [sent(budget, 0.0) for _ in range(4)]
    for ticket in run:
        budget.finished(ticket, 0.01)  # a run of 4 taken, begun at 0
    budget.finished(sent(budget, 0.02), 0.03, limited=True)  # full: no hint, 0.5 s in doubt
    probe = budget.reserve(SUBMIT, 0.6)
    budget.wait_time(probe, 0.6)
    budget.finished(probe, 0.61, limited=True)  # refused 0.6 s after the run began
    probe = budget.reserve(SUBMIT, 2.0)
    budget.wait_time(probe, 2.0)
    budget.finished(probe, 2.01, limited=True)  # refused at 2.0 s: CONFIRM, a real limit
    probe = budget.reserve(SUBMIT, 5.0)
    budget.wait_time(probe, 5.0)
    budget.finished(probe, 5.01)  # taken 5 s after the run began: the window is 2 to 5 s
    state = lane(budget)
    assert (state.cycle_lo, state.cycle_hi) == (2.0, 5.0)
    assert (state.run_at, state.last_run) == (5.0, 4)
    # The next run: four more taken (paced), then the window is full again.
    at = 5.0
    for _ in range(3):
        at = max(at, budget.reserve(SUBMIT, at).slot)
        ticket = budget.reserve(SUBMIT, at)
        while (wait := budget.wait_time(ticket, at)) > 0:
            at += wait
        budget.finished(ticket, at + 0.01)
    ticket = budget.reserve(SUBMIT, at)
    while (wait := budget.wait_time(ticket, at)) > 0:
        at += wait
    budget.finished(ticket, at + 0.01, limited=True)
    assert state.paused_until == 5.0 + 3.5  # halfway: no probe wasted at 0.5, 1.5, 3.5 s
    probe = budget.reserve(SUBMIT, 8.5)
    assert budget.wait_time(probe, 8.5) == 0.0
    budget.finished(probe, 8.51, limited=True)  # refused at 3.5 s: the window is 3.5 to 5
    assert state.cycle_lo == 3.5
    assert state.paused_until == 5.0 + 5.0  # the next one where a probe was taken before


def test_a_429_well_before_the_run_is_full_is_not_timed() -> None:
    # A run that goes faster than the last one left the window meets a request of it still
    # there: the window is not full again, so no long pause; the run goes on after it.
    budget = Budget(RateLimit())
    state = lane(budget)
    state.run_at, state.run, state.last_run = 10.0, 2, 20
    state.cycle_lo, state.cycle_hi = 9.0, 10.0
    budget.finished(sent(budget, 10.5), 10.51, limited=True)
    assert state.paused_until <= 10.51 + 0.5  # the backoff's first step, not 10 + 9.5
    assert not state.cycling
    assert (state.run_at, state.cycle_lo, state.cycle_hi) == (10.0, 9.0, 10.0)


def test_429s_at_random_with_no_hint_teach_no_window() -> None:
    # A probe refused by chance (one in 30 at 3%) must not teach a window: each later 429
    # would pause the lane for most of it. Two in a row (one in 1,000) are needed.
    for seed in range(4):
        for workers in (1, 4, 32):
            budget = Budget(RateLimit())
            gateway_run(budget, 600, workers=workers, refuse=at_random(seed), hinted=False)
            assert lane(budget).cycle_hi == math.inf


def at_random(seed: int, share: float = 0.03) -> Callable[[float], float | None]:
    rng = random.Random(seed)
    return lambda _: 1.0 if rng.random() < share else None
