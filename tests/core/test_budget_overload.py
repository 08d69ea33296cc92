"""Overload read from the share of recent answers refused (DESIGN 25), with no ceiling: random
429s cost a retry each and never a pace; a real limit paces within a few windows. Pure, on a
fake clock: ``gateway_run`` drives a budget against a simulated gateway."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from imggw_client import RateLimit
from imggw_client._core import budget as B
from imggw_client._core.budget import SUBMIT, Budget

from .test_core_budget import gateway_run, sliding_limit


def at_random(seed: int, share: float = 0.03, hint: float = 1.0) -> Callable[[float], float | None]:
    """A gateway refusing ``share`` of its requests at random (Retry-After ``hint``)."""
    rng = random.Random(seed)
    return lambda _: hint if rng.random() < share else None


class Watched(Budget):
    """A budget that notes whether its submit lane was ever paced."""

    paced = False

    def finished(self, ticket: B.Ticket, now: float, **ended: object) -> None:
        super().finished(ticket, now, **ended)  # type: ignore[arg-type]
        self.paced = self.paced or self.pace(SUBMIT) is not None


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1), workers=st.sampled_from([1, 4, 32, 100]), hinted=st.booleans()
)
def test_random_429s_at_3_percent_never_pace_a_lane(seed: int, workers: int, hinted: bool) -> None:
    # Two refusals anywhere used to read as overload: at 1,000 requests a second two come
    # within 70 ms, and 3 runs in 6 fell to tens a second (8.5x the clean run).
    budget = Watched(RateLimit())
    _, limited = gateway_run(budget, 2000, workers=workers, refuse=at_random(seed), hinted=hinted)
    assert limited > 0
    assert not budget.paced
    assert budget._lanes[SUBMIT].paused_until == -float("inf")  # not even a pause


@pytest.mark.parametrize("hinted", [True, False])
def test_random_429s_cost_a_retry_each_not_a_pause(hinted: bool) -> None:
    # 1,000 submits, 32 at a time, 3% refused with and without Retry-After (surface A's
    # provider gives none): within a tenth of the clean run, every seed.
    clean, _ = gateway_run(Budget(RateLimit()), 1000, workers=32, refuse=lambda _: None)
    for seed in range(6):
        noisy, limited = gateway_run(
            Budget(RateLimit()), 1000, workers=32, refuse=at_random(seed), hinted=hinted
        )
        assert 15 <= limited <= 60
        assert noisy <= 1.1 * clean


@pytest.mark.parametrize("hinted", [True, False])
@pytest.mark.parametrize(("count", "seconds"), [(20, 10.0), (10, 1.0), (50, 5.0)])
def test_a_real_limit_paces_the_lane_within_a_few_windows(
    count: int, seconds: float, hinted: bool
) -> None:
    # Every request past N in any S seconds refused: the share of 429s is made within a few
    # of them, in the first window, and the lane is paced from there.
    budget = Watched(RateLimit())
    first_paced: list[float] = []
    original = budget.finished

    def finished(ticket: B.Ticket, now: float, **ended: object) -> None:
        original(ticket, now, **ended)
        if budget.paced and not first_paced:
            first_paced.append(now)

    budget.finished = finished  # type: ignore[method-assign]
    n = 10 * count
    last, limited = gateway_run(
        budget, n, workers=n, refuse=sliding_limit(count, seconds), hinted=hinted
    )
    assert first_paced
    assert first_paced[0] <= seconds
    floor = (n / count - 1) * seconds
    assert last <= 2 * floor  # (a pace is not a window: N at once, then none, is faster)
    assert limited <= 0.25 * n  # a handful to find the limit, then a few a window


def test_isolated_429s_stay_isolated_and_a_share_makes_an_overload() -> None:
    budget = Budget(RateLimit())
    for i in range(40):  # 40 accepted, then refusals, each retried at once, until a share
        t = budget.reserve(SUBMIT, i / 100)
        assert budget.wait_time(t, i / 100) == 0.0
        budget.finished(t, i / 100 + 0.005)
    refused = 0
    while budget.pace(SUBMIT) is None:
        t = budget.reserve(SUBMIT, 0.5)
        assert budget.wait_time(t, 0.5) == 0.0  # each isolated one: no pause for the lane
        budget.finished(t, 0.51, limited=True, retry_after=None)
        refused += 1
    assert refused == 9  # 9 of about the last 50 answers (decayed): OVERLOAD_SHARE
    assert budget.pace(SUBMIT) == pytest.approx(40 * B.FIRST_DECREASE)
    waiting = budget.reserve(SUBMIT, 0.52)
    assert waiting.slot >= 0.51 + B.DEFAULT_BACKOFF[0]  # now the whole lane pauses
    assert budget.wait_time(waiting, 0.52) > 0
