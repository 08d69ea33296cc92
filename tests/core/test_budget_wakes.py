"""The request budget wakes its sleepers (``Budget.arm``): a wait ends on the news that ends
it, an answer, a taken request or a new schedule, never by polling, and never as a herd."""

from __future__ import annotations

import pytest

from imggw_client import RateLimit
from imggw_client._core import budget as B
from imggw_client._core.budget import QUERY, SUBMIT, Budget, Ticket


class Sleeper:
    """A driver's sleep: armed on a ticket, woken (or not) by the budget."""

    def __init__(self, budget: Budget, ticket: Ticket, now: float) -> None:
        self.ticket, self.woken = ticket, 0
        self.wait = budget.wait_time(ticket, now)
        assert self.wait > 0
        assert budget.arm(ticket, self.wake) >= self.wait

    def wake(self) -> None:
        self.woken += 1


def full_window(budget: Budget, now: float, held: int) -> tuple[list[Ticket], list[Sleeper]]:
    """The start window's requests in flight, and ``held`` more asleep behind them."""
    flying = [budget.reserve(QUERY, now) for _ in range(B.START_WINDOW)]
    assert all(t.sent_at == now for t in flying)
    return flying, [Sleeper(budget, budget.reserve(QUERY, now), now) for _ in range(held)]


def test_an_answer_wakes_the_requests_its_places_go_to_oldest_first() -> None:
    budget = Budget(RateLimit())
    flying, asleep = full_window(budget, 1.0, held=20)
    lane = budget._lanes[QUERY]
    budget.finished(flying[0], 1.5)
    free = lane.window - lane.in_flight  # one answer's place, and the window widened by one
    assert free == 2
    assert [s.woken for s in asleep] == [1] * free + [0] * (20 - free)  # not a herd of twenty
    assert [budget.wait_time(s.ticket, 1.5) for s in asleep[:free]] == [0.0] * free  # they go
    budget.release(asleep[free].ticket)  # the next in line gives its place up: no one to wake
    assert sum(s.woken for s in asleep) == free
    budget.finished(flying[1], 1.6)
    more = lane.window - lane.in_flight
    woken = [s.woken for s in asleep]
    assert woken[free] == 0  # given up: armed no more
    assert woken[free + 1 :] == [1] * more + [0] * (20 - free - 1 - more)


def test_a_wake_comes_once_and_a_sleeper_asking_again_is_armed_anew() -> None:
    budget = Budget(RateLimit())
    flying, (sleeper, behind) = full_window(budget, 1.0, held=2)
    budget.finished(flying[0], 1.5)
    budget.finished(flying[1], 1.6)
    assert (sleeper.woken, behind.woken) == (1, 1)
    budget.finished(flying[2], 1.7)
    assert (sleeper.woken, behind.woken) == (1, 1)  # disarmed by its wake: asked no more


def test_news_between_asking_and_arming_says_ask_again() -> None:
    budget = Budget(RateLimit())
    flying = [budget.reserve(QUERY, 1.0) for _ in range(B.START_WINDOW)]
    held = budget.reserve(QUERY, 1.0)
    assert budget.wait_time(held, 1.0) > 0
    budget.finished(flying[0], 1.2)  # from another thread, before the driver arms
    woken: list[int] = []
    assert budget.arm(held, lambda: woken.append(1)) == 0.0  # no sleep: its place is free
    assert budget.wait_time(held, 1.2) == 0.0
    assert woken == []


def test_a_request_sent_is_never_armed() -> None:
    budget = Budget(RateLimit())
    sent = budget.reserve(SUBMIT, 1.0)
    assert sent.sent_at == 1.0
    assert budget.arm(sent, lambda: None) == 0.0


def test_a_429s_hint_sleeper_wakes_when_a_later_request_is_taken() -> None:
    budget = Budget(RateLimit())
    lone = budget.reserve(SUBMIT, 0.0)
    later = budget.reserve(SUBMIT, 0.01)
    budget.finished(lone, 0.02, limited=True, retry_after=30.0)
    retry = Sleeper(budget, budget.reserve(SUBMIT, 0.02), 0.02)
    assert retry.wait <= 30.0
    other = budget.reserve(SUBMIT, 0.02)  # sent before the 429 came back: no news
    budget.finished(other, 0.025, limited=True, retry_after=None)
    assert retry.woken == 0
    budget.finished(later, 0.03)  # sent after the refused one, and taken: chance, not a limit
    assert retry.woken == 1
    assert budget.wait_time(retry.ticket, 0.03) == 0.0  # 30 s of hint not slept


def test_paced_sleepers_wake_when_an_overload_moves_the_schedule() -> None:
    budget = Budget(RateLimit(submits_per_second=10.0))
    asleep = []
    for _ in range(5):
        ticket = budget.reserve(SUBMIT, 0.0)
        if budget.wait_time(ticket, 0.0) == 0.0:
            first = ticket
        else:
            asleep.append(Sleeper(budget, ticket, 0.0))
    assert len(asleep) == 4
    budget.finished(first, 0.05, limited=True, retry_after=3.0)  # a pause: every wait moves
    assert [s.woken for s in asleep] == [1, 1, 1, 1]
    waits = [budget.wait_time(s.ticket, 0.05) for s in asleep]
    assert min(waits) >= 3.0 - 1e-9  # they sleep the pause, as told anew


def test_an_answer_that_moves_nothing_paced_wakes_no_paced_sleeper() -> None:
    budget = Budget(RateLimit(submits_per_second=10.0))
    first = budget.reserve(SUBMIT, 0.0)
    assert budget.wait_time(first, 0.0) == 0.0
    sleeper = Sleeper(budget, budget.reserve(SUBMIT, 0.0), 0.0)
    budget.finished(first, 0.02)
    assert sleeper.woken == 0  # its turn is a time: nothing to wake it for


def test_an_armed_sleeper_sleeps_until_its_news_not_a_guess_of_when_it_comes() -> None:
    budget = Budget(RateLimit())
    for _ in range(B.START_WINDOW):
        budget.reserve(QUERY, 1.0)  # in flight
    held = budget.reserve(QUERY, 1.0)
    told = budget.wait_time(held, 1.0)  # a guess at the answer that frees its place ...
    assert 0 < told < B.ARMED_WAIT
    assert budget.arm(held, lambda: None) == B.ARMED_WAIT  # ... which an armed sleeper awaits
    lone = budget.reserve(SUBMIT, 2.0)
    budget.reserve(SUBMIT, 2.01)  # in flight: news of the limit to come
    budget.finished(lone, 2.02, limited=True, retry_after=30.0)
    retry = budget.reserve(SUBMIT, 2.02)
    told = budget.wait_time(retry, 2.02)  # asks again a round trip on, for news
    assert told < 1.0
    assert budget.arm(retry, lambda: None) == pytest.approx(30.0)  # armed: the hint, or woken


def test_a_place_given_back_wakes_the_sleepers_behind_it_only() -> None:
    budget = Budget(RateLimit(queries_per_second=2))
    assert budget.wait_time(budget.reserve(QUERY, 0.0), 0.0) == 0.0
    asleep = [Sleeper(budget, budget.reserve(QUERY, 0.0), 0.0) for _ in range(5)]
    budget.release(asleep[4].ticket)  # the last: no one behind it moves
    assert [s.woken for s in asleep] == [0] * 5
    budget.release(asleep[1].ticket)
    assert [s.woken for s in asleep[:4]] == [0, 0, 1, 1]  # these two now go a turn sooner
    assert budget.wait_time(asleep[2].ticket, 0.0) == pytest.approx(2 * 0.5 * 1.01)
