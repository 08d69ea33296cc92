"""Retry classification and backoff: which failures are retried, and how long to wait.

Retried: connection errors, timeouts, incomplete or unparseable responses, 408, 409 while the
same key is in flight, 429, 5xx. Never retried: other 4xx. A failure is *unknown* when the
request may have been applied; a submit that gives up after an unknown failure raises
UnknownOutcomeError. The reasons whose row in ``reasons`` *decides* (a reused key, an
indeterminate or unavailable idempotency check) are read before the status, whatever it is.
"""

from __future__ import annotations

import email.utils
import math
import random
from dataclasses import dataclass

from . import reasons
from .config import RetryPolicy
from .exceptions import (
    APIConnectionError,
    APIError,
    ClientClosedError,
    ConflictError,
    IdempotencyConflictError,
    ImggwError,
    RateLimitError,
    ServerError,
)


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether a failure is retried, whether its request may have been applied, and the
    server's ``Retry-After`` hint.
    """

    retry: bool
    unknown: bool  # the failed request may have been applied
    retry_after: float | None = None


def classify(err: ImggwError) -> Verdict:
    """What to do after a failed attempt."""
    if isinstance(err, APIConnectionError):
        return Verdict(retry=True, unknown=err.request_sent)
    if isinstance(err, ClientClosedError):
        return Verdict(retry=False, unknown=err.request_sent)
    if not isinstance(err, APIError):
        return Verdict(retry=False, unknown=False)
    reason = reasons.find(err.code)
    if reason is not None and reason.decides:
        retry = reason.retry
        return Verdict(retry.retried, retry.unknown, err.retry_after if retry.retried else None)
    if isinstance(err, IdempotencyConflictError):
        return Verdict(retry=False, unknown=False)
    if isinstance(err, RateLimitError):
        return Verdict(retry=True, unknown=False, retry_after=err.retry_after)
    if isinstance(err, ConflictError):
        # The first request with this key is still running: it may yet create the task.
        return Verdict(retry=True, unknown=True, retry_after=err.retry_after)
    if isinstance(err, ServerError):
        # A 5xx can come from a proxy after the gateway committed; only an explicit
        # "not executed" reason (read above) proves nothing happened.
        return Verdict(retry=True, unknown=True, retry_after=err.retry_after)
    if err.status_code == 408:
        return Verdict(retry=True, unknown=True, retry_after=err.retry_after)
    return Verdict(retry=False, unknown=False)


def backoff(policy: RetryPolicy, attempt: int, rng: random.Random) -> float:
    """Full jitter: uniform in [0, min(max_backoff, initial_backoff * 2**(attempt-1))]."""
    exponent = min(attempt - 1, 60)
    return rng.uniform(0.0, min(policy.max_backoff, policy.initial_backoff * 2.0**exponent))


def honour_retry_after(
    retry_after: float, policy: RetryPolicy, attempt: int, rng: random.Random
) -> float:
    """At least the server's hint, plus up to 10% (at most 1 s) so that clients spread out;
    never less than the policy's own backoff (a hint of 0, a negative one or a date in the
    past must not make a client spin)."""
    hinted = retry_after + rng.uniform(0.0, min(1.0, retry_after * 0.1))
    return max(hinted, backoff(policy, attempt, rng))


def next_delay(
    policy: RetryPolicy, attempt: int, verdict: Verdict, rng: random.Random
) -> float | None:
    """Seconds to sleep before the next attempt, or None to give up."""
    if not verdict.retry or attempt >= policy.max_attempts:
        return None
    if verdict.retry_after is not None:
        if verdict.retry_after > policy.max_retry_after:
            return None
        return honour_retry_after(verdict.retry_after, policy, attempt, rng)
    return backoff(policy, attempt, rng)


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds from a ``Retry-After`` value: delay-seconds or an HTTP-date (relative to
    ``now``, epoch seconds). Past dates give 0; anything unreadable gives None."""
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            return None
        seconds = when.timestamp() - now
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)
