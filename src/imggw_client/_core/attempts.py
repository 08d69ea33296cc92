"""One request of a flow, attempted until its answer is read: the loop every flow sends through,
and the rules of its retries.

Each attempt first waits for a slot of the client's request budget (this process's, or one
shared by many processes and asked through the driver); a failure is retried as
:func:`classify` judges it, for ``max_attempts`` or, inside a wait, until the wait's deadline;
each outcome is observed for telemetry when the client asks.

Retried: connection errors, timeouts, incomplete or unparseable responses, 408, 409 while the
same key is in flight, 429, 5xx. Never retried: other 4xx. A failure is *unknown* when the
request may have been applied; a submit that gives up after an unknown failure raises
UnknownOutcomeError. The reasons whose row in ``reasons`` *decides* (a reused key, an
indeterminate or unavailable idempotency check) are read before the status, whatever it is.
"""

from __future__ import annotations

import email.utils
import functools
import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from . import reasons
from .budget import MAX_PAUSE, Budget, RemoteBudget, Ticket
from .config import RetryPolicy, Settings
from .exceptions import (
    APIConnectionError,
    APIError,
    APITimeoutError,
    ClientClosedError,
    ConflictError,
    IdempotencyConflictError,
    ImggwError,
    RateLimitError,
    ServerError,
)
from .wire import BUDGET_WAIT, REQUEST, Action, Fetch, Flow, Observe, Pace, Paced, Send, Sleep, T

# What telemetry calls a request of no budget kind: the only such is a result's download.
DOWNLOAD = "download"

log = logging.getLogger("imggw_client")


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
        try:  # a zone, a year or a field out of any range is as unreadable as a typo
            when = email.utils.parsedate_to_datetime(value)
            if when.tzinfo is None:
                return None
            seconds = when.timestamp() - now
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)


class Attempts:
    """The request loop of one client's flows. ``clock`` is monotonic seconds, ``wall`` epoch
    seconds (for ``Retry-After`` dates), ``rng`` draws every jitter. ``budget`` is the request
    budget, shared with the client's ``with_options`` copies (a new one from the settings if
    None); a :class:`RemoteBudget` (one shared by many processes) is asked through the driver."""

    def __init__(
        self,
        settings: Settings,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        budget: Budget | RemoteBudget | None = None,
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.wall = wall
        self.rng = rng if rng is not None else random.Random()
        self.budget: Budget | RemoteBudget = (
            budget if budget is not None else Budget(settings.rate_limit)
        )
        # Whether flows yield Observe actions (DESIGN 17): set by a client whose telemetry is
        # on, so that a client without it pays nothing for them.
        self.observe = False

    def attempts(
        self,
        make_action: Callable[[], Action],
        read: Callable[[Any], T],
        give_up: Callable[[ImggwError, bool], ImggwError] | None = None,
        *,
        kind: str | None = None,
        deadline: float | None = None,
        priority: Callable[[], float] | None = None,
    ) -> Flow[T]:
        """Performs an action until ``read`` accepts its outcome, retrying what ``classify``
        calls retryable: up to ``max_attempts``, or, with a ``deadline``, until it passes.
        Requests of a ``kind`` (submit, query) each wait for a slot of the client's budget, in
        the order of their ``priority`` (see :meth:`Budget.reserve`; by default, their own)."""
        attempt, unknown, refusals = 0, False, 0
        while True:
            attempt += 1
            ticket, asked = None, None
            if kind is not None:
                asked = self.clock() if self.observe else None  # only telemetry asks when
                order = priority() if priority is not None else None
                if isinstance(self.budget, RemoteBudget):
                    ticket = yield from self._remote_slot(kind, deadline)
                else:
                    now = self.clock()
                    ticket = self.budget.reserve(kind, now, priority=order)
                    # Most go as they are reserved (handed out sent): no wait to walk through.
                    if ticket.sent_at is None or (deadline is not None and now >= deadline):
                        ticket = yield from self._slot(ticket, deadline)
                if ticket is None:
                    err = APITimeoutError(
                        "the request budget left no slot before the deadline", request_sent=False
                    )
                    raise (give_up(err, unknown) if give_up else err) from None
            # From here the slot is held: whatever stops the flow before its answer gives it back.
            try:
                if asked is not None and kind is not None:  # telemetry on, a slot asked for
                    yield Observe(BUDGET_WAIT, value=self.clock() - asked, kind=kind)
                action = make_action()
                if isinstance(ticket, Ticket) and isinstance(action, Send):
                    assert isinstance(self.budget, Budget)
                    gate = self.budget.gate(ticket, self.clock)
                    if gate is not None:  # paced: the write itself waits its turn too
                        action = replace(action, gate=gate)
                outcome = yield action
            except BaseException:  # cancelled or closed in flight: its place counts no more
                if isinstance(ticket, Ticket):
                    assert isinstance(self.budget, Budget)
                    self.budget.release(ticket)
                elif ticket is not None:
                    assert isinstance(self.budget, RemoteBudget)
                    self.budget.abandoned.append(ticket)
                raise
            try:
                result = read(outcome)
            except ImggwError as err:
                verdict = classify(err)
                unknown = unknown or verdict.unknown
                if self.observe:
                    yield Observe(
                        REQUEST,
                        kind=kind or DOWNLOAD,
                        outcome=_outcome(err, verdict.unknown),
                        limited=isinstance(err, RateLimitError),
                    )
                limited = isinstance(err, RateLimitError) and ticket is not None
                refusals += limited
                if ticket is not None:
                    hint = err.retry_after if isinstance(err, RateLimitError) else None
                    retry = self.settings.retry
                    backoff = (retry.initial_backoff, retry.max_backoff)
                    if isinstance(ticket, Ticket):
                        assert isinstance(self.budget, Budget)
                        self.budget.finished(
                            ticket, self.clock(), limited=limited, retry_after=hint, backoff=backoff
                        )
                    else:
                        yield Paced(ticket, limited=limited, retry_after=hint, backoff=backoff)
                # The budget paces what a 429 says of the gateway; a request's first 429 is
                # chance's, retried at once. Refused again, that request backs off as for any
                # other failure: one caller alone at a limit reads no share of many answers.
                # A hint longer than any pause the budget imposes is the request's own to wait.
                after = verdict.retry_after or None  # a hint of 0 says no more than none
                budgeted = limited and (
                    (refusals == 1 and after is None) or (after is not None and after <= MAX_PAUSE)
                )
                delay = self._delay(verdict, attempt, deadline, budgeted=budgeted)
                if delay is None:
                    final = give_up(err, unknown) if give_up else err
                    if final is err:
                        raise
                    raise final from err
                log.info(
                    "retrying %s in %.2fs (attempt %d failed: %s)",
                    _describe(action),
                    delay,
                    attempt,
                    err.message,
                )
            else:
                if self.observe:
                    yield Observe(REQUEST, kind=kind or DOWNLOAD, outcome="ok")
                if isinstance(ticket, Ticket):
                    assert isinstance(self.budget, Budget)
                    self.budget.finished(ticket, self.clock())
                elif ticket is not None:
                    yield Paced(ticket)
                return result
            if delay > 0:
                yield Sleep(delay)

    def _slot(self, ticket: Ticket, deadline: float | None) -> Flow[Ticket | None]:
        """Waits for the slot ``ticket`` reserved; None if it comes only past ``deadline`` (the
        wait then sleeps to the deadline: it ends there, not sooner)."""
        assert isinstance(self.budget, Budget)
        try:
            while True:
                now = self.clock()
                if deadline is not None and now >= deadline:  # a request now would get no time
                    self.budget.release(ticket)
                    return None
                if ticket.sent_at is not None:  # let through as it was reserved
                    return ticket
                wait = self.budget.wait_time(ticket, now)
                if wait <= 0:
                    return ticket
                if deadline is not None and now + wait >= deadline:
                    self.budget.release(ticket)
                    if deadline > now:
                        yield Sleep(deadline - now)
                    return None
                yield Sleep(wait, functools.partial(self.budget.arm, ticket))  # woken on news
        except BaseException:  # closed or cancelled while it waited: the place is given back
            self.budget.release(ticket)
            raise

    def _remote_slot(self, kind: str, deadline: float | None) -> Flow[object | None]:
        """The same as :meth:`_slot` for a budget held elsewhere (which hands out its slots in
        request order): the driver asks it; the deadline is still ours."""
        assert isinstance(self.budget, RemoteBudget)
        ticket, wait = yield Pace(kind)
        try:
            while wait > 0:
                now = self.clock()
                if deadline is not None and now + wait >= deadline:
                    break
                yield Sleep(wait)
                ticket, wait = yield Pace(kind, ticket)
            else:
                if deadline is None or self.clock() < deadline:
                    return ticket  # type: ignore[no-any-return]  # what the service handed out
        except BaseException:  # closed or cancelled while it waited: the driver gives it back
            self.budget.abandoned.append(ticket)
            raise
        yield Paced(ticket, sent=False)
        now = self.clock()
        if deadline is not None and deadline > now:
            yield Sleep(deadline - now)
        return None

    def _delay(
        self, verdict: Verdict, attempt: int, deadline: float | None, *, budgeted: bool = False
    ) -> float | None:
        """Seconds before the next attempt, or None to give up; none (0) for a 429 the budget
        paces."""
        if deadline is None:
            delay = next_delay(self.settings.retry, attempt, verdict, self.rng)
            return None if delay is None else (0.0 if budgeted else delay)
        # Inside a wait only the deadline bounds retries: a flaky query must not end a wait.
        remaining = deadline - self.clock()
        if not verdict.retry or remaining <= 0:
            return None
        if budgeted:
            return 0.0
        if verdict.retry_after is not None:
            retry_after = honour_retry_after(
                verdict.retry_after, self.settings.retry, attempt, self.rng
            )
            return min(retry_after, remaining)
        return min(backoff(self.settings.retry, attempt, self.rng), remaining)


def _outcome(err: ImggwError, unknown: bool) -> str:
    """How a failed attempt ended, in a few words (a metric's attribute: few values)."""
    if isinstance(err, RateLimitError):
        return err.code or "limited"  # the reason's own code (rate_limited)
    return "unknown" if unknown else "error"


def _describe(action: Action) -> str:
    """The action a retry log line names: never a result's link (its query may be signed)."""
    if isinstance(action, Send):
        return f"{action.request.method} {action.request.path}"
    if isinstance(action, Fetch):
        return f"download of {action.stem}"
    return type(action).__name__
