"""The client-wide request budget (DESIGN 9): how fast submits and queries may go out.

Pure: every call takes ``now`` (monotonic seconds) and nothing sleeps; the flows turn a wait
into a ``Sleep`` action. One lock makes a budget safe to share by the threads of a ``Client``
and the tasks of an ``AsyncClient`` (no call blocks or awaits while holding it).

Each kind of request (submits, queries) has its own lane. A request **reserves** a place in
it, asks when its time comes whether it may go (:meth:`Budget.wait_time`), and reports how it
ended (:meth:`Budget.finished`). The places waiting go in the order of their requests'
priorities: by default a request's priority is the moment it was made, so places go in
request order; a wait's query says when it would rather go (sooner when its task has likely
finished, DESIGN 15), never more than one ``max_interval`` after it was made, so no waiting
request starves. A place's time is not fixed when it is reserved: the lane's schedule is an
anchor (a place and its time) and the pace, and it is anchored again whenever the pace
changes, a 429 pauses the lane, or a request goes out more than an interval late (a busy event
loop). So a queue of thousands follows a lowered or recovered pace at once, and a late queue
goes out one by one, in order, instead of waking all together at every interval.

- With a **ceiling** (``RateLimit``), requests are spaced evenly at it: a request goes only once
  the last one of its kind went at least one interval ago, so in any window of *w* seconds at
  most ``rate * w + 1`` go out, even when some wake late or the pace was lowered meanwhile.
- With **no ceiling**, nothing is known of the gateway's limits, and a storm is what must not
  happen: up to :data:`START_WINDOW` requests in flight go at once (one-at-a-time use is never
  slowed); past that they are paced from :data:`START_RATE`, doubling each second that requests
  queue, and left unpaced past :data:`FREE_RATE`.
- A **429** pauses the lane for the whole client: ``Retry-After`` when given, but never less
  than the retry policy's own backoff, which grows with each 429 in a row (so a hint of 0 never
  makes a client spin). When 429s are a real share of the lane's recent answers (a gateway over
  its limit, not one 429 by chance), the pace is lowered too, at most once a recovery period:
  a guessed pace by half (from what the gateway accepted lately, if more), a known one to the
  share that got through. It then recovers a step at a time while requests queue for it, up to
  where the overload came, and (that pace having held) faster past it, up to the ceiling.

The constants were chosen with a discrete-event simulation of many waits against sliding-window
limits and against random 429s (BENCHMARKS.md has the figures).
"""

from __future__ import annotations

import bisect
import math
import threading
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Protocol

from .._config import RateLimit, RetryPolicy

SUBMIT = "submit"
QUERY = "query"

START_WINDOW = 16  # requests in flight that go unpaced while a lane knows nothing
START_RATE = 10.0  # requests/s past that window, at first
FREE_RATE = 1024.0  # past this, a lane that never met a 429 is left unpaced
PACE_FLOOR = 1 / 60  # the pace never falls below one request a minute
FIRST_DECREASE = 0.5  # the first overload halves a pace that was a guess
DECREASE = 0.8  # later ones, and one at a ceiling, lower it to the share that got through
# (at most to this, at least by half), and no more than once a recovery period
RECOVERY_STEP = 0.1  # the pace grows by a tenth every 5 s in which requests queued for it
RECOVERY_PERIOD = 5.0  # and it was not lowered, up to where the last overload came; past that
# (the pace held, so the limit was elsewhere) it doubles each such second, as at the start
# A gateway over its limit answers most requests with 429; one that throws a few at random
# does not, and slowing down would not help: the pace is lowered only when 429s make up
# DECREASE_SHARE of the lane's last RECENT answers (counted out of at least MIN_ANSWERS).
RECENT = 50
DECREASE_SHARE = 0.06
MIN_ANSWERS = 20
# The retry policy's own first and longest backoff, when a caller gives none.
DEFAULT_BACKOFF = (RetryPolicy.initial_backoff, RetryPolicy.max_backoff)
MAX_PAUSE = 60.0  # the longest pause a Retry-After may impose on the whole client
# Every paced interval is this much longer than the pace says: a gateway that counts N requests
# in any S-second window sees our N+1st 1% of S past it (10 ms of a 1 s window, 100 ms of a
# 10 s one), so jitter on the way cannot push one request into the window of another.
GUARD = 0.01

# Lane modes.
FIXED = "fixed"  # at the configured ceiling
STARTING = "starting"  # no ceiling, no 429 yet: a window in flight, then growing from START_RATE
FREE = "free"  # no ceiling, no 429, grown past FREE_RATE: unpaced
RECOVERING = "recovering"  # after a 429: below the ceiling (if any), growing back
_NEVER = -math.inf


@dataclass(slots=True)
class Ticket:
    """One request's place in its lane; ``slot`` is when it was due as it was reserved."""

    kind: str
    slot: float
    place: int  # the place it reserved in the lane's order (paced tickets)
    paced: bool  # False for a request let through unpaced (free lane, or the start window)
    sent_at: float | None = None
    counted: bool = False  # counted in the lane's requests in flight
    priority: float = 0.0  # smaller goes sooner (paced tickets)


@dataclass(slots=True)
class _Lane:
    ceiling: float | None
    rate: float | None  # None: unpaced
    mode: str
    in_flight: int = 0
    next_place: int = 0  # the place the next paced reservation gets
    anchor_place: int = 0  # the schedule: place ``anchor_place`` is due at ``anchor_at`` ...
    anchor_at: float = _NEVER  # ... and each later one an interval after the one before
    last_sent: float = _NEVER
    paused_at: float = _NEVER
    paused_until: float = _NEVER
    strikes: int = 0
    decreased_at: float = _NEVER
    overloaded_at: float = 0.0  # the pace at which the last overload came
    grow_at: float = _NEVER
    queued: bool = False  # a request had to wait for its slot since the last growth check
    second: int = 0  # accepted answers, counted per whole second: this one and the last
    accepted: int = 0
    accepted_before: int = 0
    answers: deque[bool] = field(default_factory=lambda: deque(maxlen=RECENT))  # True: a 429
    # The paced tickets not sent yet: their places, and their (priority, place) in the order
    # they go. The one ranked r-th goes at the r-th of those places, so priorities reorder who
    # goes when and never how many go.
    held: list[int] = field(default_factory=list)
    ranked: list[tuple[float, int]] = field(default_factory=list)

    def place_of(self, ticket: Ticket) -> int:
        """The place a waiting paced ticket goes at, by its rank among those waiting."""
        rank = bisect.bisect_left(self.ranked, (ticket.priority, ticket.place))
        return self.held[rank]

    def forget(self, ticket: Ticket) -> int:
        """Takes a waiting ticket out of the order; returns the place it was to go at."""
        rank = bisect.bisect_left(self.ranked, (ticket.priority, ticket.place))
        del self.ranked[rank]
        return self.held.pop(rank)

    @property
    def interval(self) -> float:
        return 0.0 if self.rate is None else (1.0 + GUARD) / self.rate

    def due(self, place: int) -> float:
        return self.anchor_at + (place - self.anchor_place) * self.interval

    def anchor(self, place: int, at: float) -> None:
        self.anchor_place, self.anchor_at = place, at

    def earliest(self, now: float) -> float:
        """When the next request may go: an interval after the last, not within a pause."""
        return max(now, self.last_sent + self.interval, self.paused_until)

    def reschedule(self, now: float, old_interval: float) -> None:
        """The places whose time has not come follow the lane's pace (it changed, or a pause
        began) from the earliest moment it allows; those already due keep going."""
        place = self.next_place
        if old_interval > 0 and self.anchor_at > _NEVER:
            ahead = math.ceil((now - self.anchor_at) / old_interval) if now > self.anchor_at else 0
            place = min(place, self.anchor_place + ahead)
        self.anchor(place, self.earliest(now))


def _lane(ceiling: float | None) -> _Lane:
    if ceiling is not None:
        return _Lane(ceiling=float(ceiling), rate=float(ceiling), mode=FIXED)
    return _Lane(ceiling=None, rate=START_RATE, mode=STARTING)


class Budget:
    """The request budget of one client (and of every ``with_options`` copy of it).

    Example::

        budget = Budget(RateLimit(submits_per_second=2))
        first, second = budget.reserve(SUBMIT, 0.0), budget.reserve(SUBMIT, 0.0)
        assert budget.wait_time(first, 0.0) == 0.0      # the first goes at once
        assert budget.wait_time(second, 0.0) == 0.5     # the next, half a second later
    """

    def __init__(self, limit: RateLimit) -> None:
        self._lock = threading.Lock()
        self._lanes = {
            SUBMIT: _lane(limit.submits_per_second),
            QUERY: _lane(limit.queries_per_second),
        }

    def reserve(self, kind: str, now: float, *, priority: float | None = None) -> Ticket:
        """A place of ``kind``. Waiting places go in the order of their ``priority`` (a moment,
        in the clock's seconds; ``now`` if None: request order), ties in request order.
        ``priority`` belongs between ``now`` and ``now + max_interval``: a request then waits
        behind no later one by more than ``max_interval`` (``poll.query_priority``)."""
        with self._lock:
            lane = self._lanes[kind]
            self._grow(lane, now)
            place = lane.next_place
            idle = lane.due(place) <= now and lane.earliest(now) <= now
            if lane.mode == FREE or (
                lane.mode == STARTING and idle and lane.in_flight < START_WINDOW
            ):
                lane.in_flight += 1  # the window counts it from now: a storm fills it at once
                ticket = Ticket(kind, max(now, lane.paused_until), -1, paced=False)
                ticket.counted = True
                return ticket
            lane.next_place += 1
            if lane.due(place) < lane.earliest(now):  # nothing queued ahead: start from now
                lane.anchor(place, lane.earliest(now))
            slot = max(lane.due(place), lane.paused_until)
            # Waiting out a pause says nothing of the pace; waiting for a slot says it is short.
            lane.queued = lane.queued or slot > max(now, lane.paused_until)
            key = now if priority is None or math.isnan(priority) else priority
            ticket = Ticket(kind, slot, place, paced=True, priority=key)
            lane.held.append(place)  # places only grow: the list stays sorted
            bisect.insort(lane.ranked, (key, place))
            return ticket

    def wait_time(self, ticket: Ticket, now: float) -> float:
        """Seconds to wait before sending; 0 means go now (the send is then recorded)."""
        with self._lock:
            lane = self._lanes[ticket.kind]
            due = lane.paused_until
            place = -1
            if ticket.paced:
                self._grow(lane, now)
                place = lane.place_of(ticket) if ticket.sent_at is None else ticket.place
                if lane.due(place) < now - lane.interval:
                    # Its time passed more than an interval ago (a busy loop woke it late): the
                    # schedule moves to it, so the places after it go one by one, in order,
                    # instead of all waking together at every interval.
                    lane.anchor(place, lane.earliest(now))
                due = max(lane.due(place), lane.earliest(now))
            if due > now:
                if ticket.paced and due > lane.paused_until:
                    lane.queued = True
                return due - now
            if ticket.paced and ticket.sent_at is None:
                lane.forget(ticket)
                ticket.place = place
            ticket.sent_at = now
            if ticket.paced:
                lane.last_sent = now
            if not ticket.counted:
                ticket.counted = True
                lane.in_flight += 1
            return 0.0

    def release(self, ticket: Ticket) -> None:
        """Gives back a place that will not be used (its request's deadline came first)."""
        with self._lock:
            lane = self._lanes[ticket.kind]
            self._uncount(lane, ticket)
            if ticket.paced and ticket.sent_at is None:
                place = lane.forget(ticket)  # the others keep their places and their order
                if place == lane.next_place - 1:
                    lane.next_place -= 1  # the last place: given back, it leaves no hole

    def finished(
        self,
        ticket: Ticket,
        now: float,
        *,
        limited: bool = False,
        retry_after: float | None = None,
        backoff: tuple[float, float] = DEFAULT_BACKOFF,
    ) -> None:
        """The request of ``ticket`` ended: answered, failed, or (``limited``) met a 429 with the
        hint ``retry_after``; ``backoff`` is the retry policy's first and longest backoff."""
        with self._lock:
            lane = self._lanes[ticket.kind]
            sent = ticket.sent_at if ticket.sent_at is not None else now
            self._uncount(lane, ticket)
            lane.answers.append(limited)
            if limited:
                self._limited(lane, sent, now, retry_after, backoff)
                return
            if sent >= lane.paused_at:
                lane.strikes = 0
            second = int(now)
            if second != lane.second:
                lane.accepted_before = lane.accepted if second == lane.second + 1 else 0
                lane.second, lane.accepted = second, 0
            lane.accepted += 1

    def pace(self, kind: str) -> float | None:
        """The lane's current pace in requests per second (None: unpaced)."""
        with self._lock:
            lane = self._lanes[kind]
            return None if lane.mode == STARTING and lane.in_flight < START_WINDOW else lane.rate

    @staticmethod
    def _uncount(lane: _Lane, ticket: Ticket) -> None:
        if ticket.counted:
            ticket.counted = False
            lane.in_flight -= 1

    # ------------------------------------------------------------------------ pace changes

    def _limited(
        self,
        lane: _Lane,
        sent: float,
        now: float,
        retry_after: float | None,
        backoff: tuple[float, float],
    ) -> None:
        if sent >= lane.paused_at:  # a new episode, not an echo of one already met
            lane.strikes += 1
        first, longest = backoff
        pause = min(longest, first * 2.0 ** min(lane.strikes - 1, 30))
        if retry_after is not None:
            pause = max(pause, min(retry_after, MAX_PAUSE))
        until = now + pause
        if until > lane.paused_until:
            lane.paused_until, lane.paused_at = until, now
            lane.reschedule(now, lane.interval)  # the places waiting go after it, in order
        share = sum(lane.answers) / max(len(lane.answers), MIN_ANSWERS)
        settled = now - lane.decreased_at >= RECOVERY_PERIOD  # the last change had its effect
        if sent > lane.decreased_at and share >= DECREASE_SHARE and settled:
            self._decrease(lane, now, share)
            lane.answers.clear()
            lane.grow_at = now + RECOVERY_PERIOD

    def _decrease(self, lane: _Lane, now: float, share: float) -> None:
        if lane.mode in (RECOVERING, FIXED):  # a pace that was close: to what got through
            assert lane.rate is not None
            overloaded_at = lane.rate
            rate = lane.rate * max(FIRST_DECREASE, min(DECREASE, 1.0 - share))
        else:  # a guess so far: start again from what the gateway accepted lately, but
            # never from less than the starting pace: a client that had sent little (or only
            # for part of a second) says nothing of what the gateway would accept.
            start = min(lane.rate or START_RATE, START_RATE)
            overloaded_at = max(_accepted_per_second(lane, now), start)
            rate = overloaded_at * FIRST_DECREASE
        rate = max(PACE_FLOOR, rate)
        if lane.ceiling is not None:
            rate = min(rate, lane.ceiling)
        old_interval = lane.interval
        lane.overloaded_at = overloaded_at
        lane.rate, lane.mode, lane.decreased_at = rate, RECOVERING, now
        lane.reschedule(now, old_interval)

    def _grow(self, lane: _Lane, now: float) -> None:
        if now < lane.grow_at:
            return
        rate, old_interval = lane.rate, lane.interval
        if lane.queued and lane.rate is not None:
            if lane.mode == STARTING:
                lane.rate *= 2.0
                if lane.rate > FREE_RATE:
                    lane.rate, lane.mode = None, FREE
            elif lane.mode == RECOVERING:
                careful = lane.rate < lane.overloaded_at
                lane.rate *= 1.0 + RECOVERY_STEP if careful else 2.0
                if lane.ceiling is not None and lane.rate >= lane.ceiling:
                    lane.rate, lane.mode = lane.ceiling, FIXED
        if lane.rate != rate:
            lane.reschedule(now, old_interval)
        lane.queued = False
        careful = lane.mode == RECOVERING and (lane.rate or 0) < lane.overloaded_at
        lane.grow_at = now + (RECOVERY_PERIOD if careful or lane.mode == FIXED else 1.0)


def _accepted_per_second(lane: _Lane, now: float) -> float:
    """Answers accepted in the last whole second (or in this one, if more)."""
    second = int(now)
    if second == lane.second:
        return float(max(lane.accepted, lane.accepted_before))
    if second == lane.second + 1:
        return float(lane.accepted)
    return 0.0


class BudgetService(Protocol):
    """A :class:`Budget` held elsewhere, asked over the network (by the driver, never by the
    flows), as an ``AsyncClient`` asks it: the same four operations, awaited, on the holder's
    clock. A Dask scheduler plugin holds one for a whole run (``imggw_client.batch``); any
    service that can hold one may do. Its blocking twin, for a ``Client``, is
    :class:`SyncBudgetService`.

    Example::

        class Unpaced:                             # the shape of one: every request goes now
            async def reserve(self, kind: str) -> tuple[Hashable, float]:
                return kind, 0.0                   # a ticket (never None), no wait
            async def wait_time(self, ticket: Hashable) -> float:
                return 0.0
            async def release(self, ticket: Hashable) -> None: ...
            async def finished(self, ticket, *, limited, retry_after, backoff) -> None: ...

        async_client.share_budget(Unpaced())
    """

    async def reserve(self, kind: str) -> tuple[Hashable, float]:
        """A new slot of ``kind``: its ticket, and the seconds to wait before it (0: go now)."""

    async def wait_time(self, ticket: Hashable) -> float:
        """Seconds the ticket must still wait (0: go now; the send is then recorded)."""

    async def release(self, ticket: Hashable) -> None:
        """Gives back a slot that will not be used."""

    async def finished(
        self,
        ticket: Hashable,
        *,
        limited: bool,
        retry_after: float | None,
        backoff: tuple[float, float],
    ) -> None:
        """The request of ``ticket`` ended (see :meth:`Budget.finished`)."""


class SyncBudgetService(Protocol):
    """:class:`BudgetService` for a blocking ``Client``: the same four operations, each a plain
    call that blocks until the holder answers (threads of one client may call at once).

    Example::

        class Unpaced:                             # the shape of one: every request goes now
            def reserve(self, kind: str) -> tuple[Hashable, float]:
                return kind, 0.0                   # a ticket (never None), no wait
            def wait_time(self, ticket: Hashable) -> float:
                return 0.0
            def release(self, ticket: Hashable) -> None: ...
            def finished(self, ticket, *, limited, retry_after, backoff) -> None: ...

        client.share_budget(Unpaced())
    """

    def reserve(self, kind: str) -> tuple[Hashable, float]:
        """See :meth:`BudgetService.reserve`."""

    def wait_time(self, ticket: Hashable) -> float:
        """See :meth:`BudgetService.wait_time`."""

    def release(self, ticket: Hashable) -> None:
        """See :meth:`BudgetService.release`."""

    def finished(
        self,
        ticket: Hashable,
        *,
        limited: bool,
        retry_after: float | None,
        backoff: tuple[float, float],
    ) -> None:
        """See :meth:`BudgetService.finished`."""


class RemoteBudget:
    """The budget of a client that shares one with other processes: the flows then hand each
    slot to the driver (``Pace`` and ``Paced`` actions), which asks ``service`` (awaited by an
    ``AsyncClient``, called by a ``Client``). The logic stays in the :class:`Budget` the service
    holds; a local client never sees this class.

    Example::

        client.share_budget(service)   # every request now waits for service
    """

    def __init__(self, service: BudgetService | SyncBudgetService) -> None:
        self.service = service
