"""Retry classification, backoff with full jitter, Retry-After parsing and the poll schedule."""

from __future__ import annotations

import email.utils
import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from imggw_client import (
    APIConnectionError,
    APIError,
    APITimeoutError,
    AuthenticationError,
    ConflictError,
    IdempotencyConflictError,
    InvalidRequestError,
    NotFoundError,
    PollPolicy,
    RateLimitError,
    RetryPolicy,
    ServerError,
)
from imggw_client._core.attempts import (
    Verdict,
    backoff,
    classify,
    next_delay,
    parse_retry_after,
)
from imggw_client._core.poll import poll_interval


@pytest.mark.parametrize(
    ("err", "retry", "unknown"),
    [
        (APIConnectionError("x", request_sent=False), True, False),
        (APIConnectionError("x", request_sent=True), True, True),
        (APITimeoutError("x", request_sent=True), True, True),
        (RateLimitError("x", status_code=429), True, False),
        (ConflictError("x", status_code=409, code="idempotency_in_progress"), True, True),
        (ServerError("x", status_code=500), True, True),
        (ServerError("x", status_code=502), True, True),
        (ServerError("x", status_code=503, code="idempotency_unavailable"), True, False),
        (ServerError("x", status_code=200, code="malformed_response"), True, True),
        (APIError("x", status_code=408), True, True),
        (InvalidRequestError("x", status_code=400), False, False),
        (AuthenticationError("x", status_code=401), False, False),
        (NotFoundError("x", status_code=404), False, False),
        (InvalidRequestError("x", status_code=422), False, False),
        (
            IdempotencyConflictError("x", status_code=409, code="idempotency_key_reused"),
            False,
            False,
        ),
        (
            IdempotencyConflictError("x", status_code=422, code="idempotency_key_reused"),
            False,
            False,
        ),
        (ServerError("x", status_code=500, code="idempotency_result_indeterminate"), False, True),
    ],
)
def test_classify(err: APIError, retry: bool, unknown: bool) -> None:
    verdict = classify(err)
    assert (verdict.retry, verdict.unknown) == (retry, unknown)


def test_backoff_is_full_jitter_capped() -> None:
    policy = RetryPolicy(initial_backoff=0.5, max_backoff=8.0)
    rng = random.Random(7)
    for attempt, cap in [(1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (5, 8.0), (6, 8.0), (500, 8.0)]:
        draws = [backoff(policy, attempt, rng) for _ in range(300)]
        assert all(0.0 <= d <= cap for d in draws)
        assert max(draws) > cap * 0.9  # full jitter reaches the cap...
        assert min(draws) < cap * 0.1  # ...and near zero


def test_next_delay_counts_every_attempt_and_honours_retry_after() -> None:
    policy = RetryPolicy(max_attempts=3, max_retry_after=60.0)
    rng = random.Random(0)
    retryable = Verdict(retry=True, unknown=False)
    assert next_delay(policy, 1, retryable, rng) is not None
    assert next_delay(policy, 2, retryable, rng) is not None
    assert next_delay(policy, 3, retryable, rng) is None  # 3 attempts in all
    assert next_delay(policy, 1, Verdict(retry=False, unknown=False), rng) is None
    hinted = next_delay(policy, 1, Verdict(True, False, retry_after=7.0), rng)
    assert hinted is not None
    assert 7.0 <= hinted <= 7.7
    assert next_delay(policy, 1, Verdict(True, False, retry_after=61.0), rng) is None


def test_parse_retry_after() -> None:
    now = 1_700_000_000.0
    assert parse_retry_after(None, now) is None
    assert parse_retry_after("5", now) == 5.0
    assert parse_retry_after(" 2.5 ", now) == 2.5
    assert parse_retry_after("-3", now) == 0.0
    date = email.utils.formatdate(now + 30, usegmt=True)
    assert parse_retry_after(date, now) == pytest.approx(30.0)
    past = email.utils.formatdate(now - 30, usegmt=True)
    assert parse_retry_after(past, now) == 0.0
    for garbage in ["soon", "", "inf", "nan", "Mon, 99 Foo 2020"]:
        assert parse_retry_after(garbage, now) is None
    # Fields out of any range a datetime holds: a zone of 10**20 hours, a year past 9999.
    for absurd in [
        "Wed, 21 Oct 2015 07:28:00 +99999999999999999999",
        "Wed, 21 Oct 99999999999 07:28:00 GMT",
        "Wed, 21 Oct 2015 07:28:99999999999999999999 GMT",
    ]:
        assert parse_retry_after(absurd, now) is None, absurd


@given(
    st.builds(
        "{}, {} {} {} {}:{}:{} {}".format,
        st.sampled_from(["Mon", "Wed"]),
        st.integers(-(10**25), 10**25),
        st.sampled_from(["Jan", "Oct"]),
        st.integers(-(10**25), 10**25),
        st.integers(-(10**25), 10**25),
        st.integers(-(10**25), 10**25),
        st.integers(-(10**25), 10**25),
        st.sampled_from(["GMT", "+0000", "-2359", "+99999999999999999999"]),
    )
)
def test_parse_retry_after_reads_any_date_shaped_value_or_none(value: str) -> None:
    result = parse_retry_after(value, 1_700_000_000.0)
    assert result is None or (math.isfinite(result) and result >= 0)


@given(st.text(max_size=40))
def test_parse_retry_after_never_crashes(value: str) -> None:
    result = parse_retry_after(value, 1_700_000_000.0)
    assert result is None or result >= 0


def test_poll_schedule_grows_is_jittered_and_capped() -> None:
    policy = PollPolicy()  # 1 s, x1.15, cap 30 s
    assert (policy.initial_interval, policy.multiplier, policy.max_interval) == (1.0, 1.15, 30.0)
    rng = random.Random(3)
    draws = [poll_interval(policy, n, rng) for n in range(60)]
    assert 0.8 <= draws[0] <= 1.0
    assert 0.92 <= draws[1] <= 1.15
    assert all(d <= 30.0 for d in draws)
    assert all(d >= 24.0 for d in draws[25:])  # 1.15**25 > 30: capped from there
    assert len(set(draws)) == len(draws)  # jitter is on
    assert poll_interval(policy, 10**9, rng) <= 30.0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_attempts": 0},
        {"initial_backoff": 0},
        {"initial_backoff": 2.0, "max_backoff": 1.0},
        {"max_retry_after": -1},
        {"max_retry_after": float("inf")},  # a hint of 1e300 would then be slept
        {"max_retry_after": float("nan")},
    ],
)
def test_retry_policy_rejects_nonsense(kwargs: dict[str, float]) -> None:
    from imggw_client import ConfigurationError

    with pytest.raises(ConfigurationError):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_retry_policy_takes_a_max_retry_after_of_zero() -> None:
    assert RetryPolicy(max_retry_after=0).max_retry_after == 0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"initial_interval": 0},
        {"initial_interval": 5.0, "max_interval": 1.0},
        {"multiplier": 0.5},
        {"initial_interval": float("nan")},
    ],
)
def test_poll_policy_rejects_nonsense(kwargs: dict[str, float]) -> None:
    from imggw_client import ConfigurationError

    with pytest.raises(ConfigurationError):
        PollPolicy(**kwargs)
