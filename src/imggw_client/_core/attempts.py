"""One request of a flow, attempted until its answer is read: the loop every flow sends through.

Each attempt first waits for a slot of the client's request budget (this process's, or one
shared by many processes and asked through the driver); a failure is retried as
:func:`~imggw_client._core.retry.classify` judges it, for ``max_attempts`` or, inside a wait,
until the wait's deadline; each outcome is observed for telemetry when the client asks.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from .budget import Budget, RemoteBudget, Ticket
from .config import Settings
from .exceptions import APITimeoutError, ImggwError, RateLimitError
from .retry import Verdict, backoff, classify, honour_retry_after, next_delay
from .wire import BUDGET_WAIT, REQUEST, Action, Fetch, Flow, Observe, Pace, Paced, Send, Sleep, T

# What telemetry calls a request of no budget kind: the only such is a result's download.
DOWNLOAD = "download"

log = logging.getLogger("imggw_client")


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
        attempt, unknown = 0, False
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
                delay = self._delay(verdict, attempt, deadline, budgeted=limited)
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
                yield Sleep(wait)
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
        """Seconds before the next attempt, or None to give up. A 429 the budget has seen is
        paced by the budget (a pause for the whole client), so it adds no sleep of its own."""
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
