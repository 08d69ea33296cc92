"""The client-wide request budget (DESIGN 9, 20, 25): how fast submits and queries may go out.

Pure (every call takes ``now``; nothing sleeps) and thread-safe. Each kind of request has a lane:
a request reserves a place, asks when it may go and says how it ended. With a ceiling
(``RateLimit``) requests are spaced evenly at it. With none, a lane lets a window of requests fly
(TCP's slow start) until 429s make up a share of its answers; then it pauses, paces at what got
through, and grows back. The policy (:func:`answered`, :func:`grown`) is written once for every
holder of a lane.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from .budget_service import BudgetService as BudgetService
from .budget_service import Ended as Ended
from .budget_service import RemoteBudget as RemoteBudget
from .budget_service import SyncBudgetService as SyncBudgetService
from .config import RateLimit, RetryPolicy

SUBMIT = "submit"
QUERY = "query"

START_WINDOW = 4  # requests in flight a lane with no ceiling lets go before any answer
MIN_ROUND = 0.05  # seconds: the window at most doubles in this time (and in a round trip)
MAX_WINDOW = 64  # more would wait in httpx's pool of 100 connections, at 3x the CPU
RTT_GUESS = 0.02  # seconds an answer is taken to need before one came back
MIN_WAIT = 0.001  # the shortest wait for a place in the window (never spin)
# The longest a sleeper armed for a place in the window sleeps before asking again: a safety
# net only, as every answer or release that frees a place wakes the sleeper it goes to.
ARMED_WAIT = 1.0
# While no answer comes, a round trip is taken to be at least this share of the time since the
# lane last heard one: a request held back by the window (or waiting to learn whether a later
# one was taken) asks less and less often of a gateway that slowed down, never a busy poll, and
# waits at most half as long again as the silence once a place frees.
SILENCE_SHARE = 0.25
# A paced head may be written this much before its turn: a driver woken late by a busy loop
# then does not push every later turn back (half of what GUARD leaves in a 1 s window).
WRITE_SLACK = 0.005
START_RATE = 10.0  # an overload never starts the pace below half this many requests/s
FREE_RATE = 1024.0  # past this, a lane with no ceiling that recovered is unpaced again
PACE_FLOOR = 1 / 60  # the pace never falls below one request a minute
FIRST_DECREASE = 0.5  # the first overload halves what the gateway accepted lately
DECREASE = 0.8  # later ones lower it to the share that got through (at most to this)
# The pace grows by this share every RECOVERY_PERIOD near the pace a limit was met at, else
# each second (with a ceiling: doubles each second past where the overload came).
RECOVERY_STEP = 0.1
RECOVERY_PERIOD = 5.0
# Overload is read from the share of 429s among about the last RECENT answers (out of at least
# MIN_ANSWERS): OVERLOAD_SHARE on a lane not paced yet (13 of 50 at 3% random 429s: 2 in 10^9),
# DECREASE_SHARE on a paced one (a pace a little above the limit).
RECENT = 50
DECREASE_SHARE = 0.06
OVERLOAD_SHARE = 0.25
MIN_ANSWERS = 20
DEFAULT_BACKOFF = (RetryPolicy.initial_backoff, RetryPolicy.max_backoff)
MAX_PAUSE = 60.0  # the longest pause a Retry-After may impose on the whole client
# With no ceiling nor Retry-After the pause doubles from 1 s (a limit's window is a second or
# more: sooner, the retry is refused too) to 4 s (a retry every 4 s at worst).
NO_HINT_PAUSES = (1.0, 4.0)
# Every paced interval is 1% longer than the pace says, so jitter on the way cannot push one
# request into the window of another.
GUARD = 0.01

# Lane modes.
FIXED = "fixed"  # at the configured ceiling
STARTING = "starting"  # no ceiling, no overload yet: a window in flight, growing per answer
RECOVERING = "recovering"  # after a 429: below the ceiling (if any), growing back
_NEVER = -math.inf


@dataclass(slots=True, eq=False)
class Ticket:
    """One request's place in its lane; ``slot`` is when it was due as it was reserved.
    Hashable by identity (a lane keeps the sleepers to wake in dicts)."""

    kind: str
    slot: float
    place: int  # the place it reserved in the lane's order (paced tickets; windowed: its turn)
    paced: bool  # False for a request let through unpaced (by the start window)
    sent_at: float | None = None
    counted: bool = False  # counted in the lane's requests in flight
    priority: float = 0.0  # smaller goes sooner (paced tickets)
    windowed: bool = False  # held back by the start window until an answer frees a place
    # An isolated 429's hint, waited by the lane's next request unless one sent after the
    # refused one (at ``owed_after``) is accepted first.
    not_before: float = -math.inf
    owed_after: float = -math.inf
    seen: int = 0  # the lane's ``moved`` when it last asked ...
    armed_wait: float = 0.0  # ... and the longest its sleep may last once armed
    wake: Callable[[], object] | None = None  # armed (:meth:`Budget.arm`): wakes its sleeper


@dataclass(slots=True)
class Pacing:
    """What the policy (:func:`answered`, :func:`grown`) reads and decides for one lane, kept in
    this process (:class:`Budget`) or in a shared store (``_core.shared_budget``)."""

    ceiling: float | None
    rate: float | None  # None: unpaced
    mode: str
    window: int = START_WINDOW  # requests in flight a starting lane lets go
    rtt: float = RTT_GUESS  # smoothed seconds from send to answer
    round_at: float = _NEVER  # when the window's current round began ...
    round_window: int = START_WINDOW  # ... and its width then: at most double it this round
    halved_at: float = _NEVER  # when a 429 last halved the window (those sent before: echoes)
    paused_at: float = _NEVER
    paused_until: float = _NEVER
    strikes: int = 0  # 429s in a row, each a new episode: the pause grows with them
    decreased_at: float = _NEVER
    overloaded_at: float = 0.0  # the pace at which the last overload came
    grow_at: float = _NEVER
    # Decayed by 1 - 1/RECENT at each answer: ``refused / answers``, the share of recent 429s.
    answers: float = 0.0
    refused: float = 0.0
    second: int = 0  # accepted answers per whole second: this one and the last
    accepted: int = 0
    accepted_before: int = 0
    taken: int = 0  # accepted since the pace was last lowered
    burst: int = 0  # accepted in the burst before a first overload

    @property
    def interval(self) -> float:
        return 0.0 if self.rate is None else (1.0 + GUARD) / self.rate

    @property
    def unpaced(self) -> bool:
        return self.mode == STARTING


@dataclass(slots=True)
class _Lane(Pacing):
    in_flight: int = 0
    turns: int = 0  # turns handed to requests the window held back, in request order
    next_place: int = 0  # the place the next paced reservation gets
    anchor_place: int = 0  # the schedule: place ``anchor_place`` is due at ``anchor_at`` ...
    anchor_at: float = _NEVER  # ... and each later one an interval after the one before
    last_sent: float = _NEVER
    queued: bool = False  # a request had to wait for its slot since the last growth check
    owed: deque[tuple[float, float]] = field(default_factory=deque)  # isolated 429s' hints
    last_went: float = _NEVER  # when the latest request went
    heard_at: float = _NEVER  # the last answer
    taken_after: float = _NEVER  # the latest send time of a request accepted
    # The paced tickets not sent yet: their places, and their (priority, place) in order; the
    # r-th ranked goes at the r-th place, so priorities reorder who goes, never how many.
    held: list[int] = field(default_factory=list)
    ranked: list[tuple[float, int]] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)  # the turns held back by the window
    write_at: float = _NEVER  # the write gate: when the next paced head is due on the wire
    # Sleepers to wake when their wait may end sooner (:meth:`Budget.arm`): those the window
    # holds back (by turn), those waiting a 429's hint, and the rest (the paced). ``moved``
    # counts the events that may end a wait sooner: a ticket that saw an older count asks again.
    window_alarms: dict[int, Ticket] = field(default_factory=dict)
    hint_alarms: dict[Ticket, None] = field(default_factory=dict)
    alarms: dict[Ticket, None] = field(default_factory=dict)
    moved: int = 0

    def _rank(self, ticket: Ticket) -> int:
        """A waiting paced ticket's rank among those waiting."""
        return bisect.bisect_left(self.ranked, (ticket.priority, ticket.place))

    def place_of(self, ticket: Ticket) -> int:
        """The place a waiting paced ticket goes at, by its rank among those waiting."""
        return self.held[self._rank(ticket)]

    def forget(self, ticket: Ticket) -> int:
        """Takes a waiting ticket out of the order; returns the place it was to go at."""
        rank = self._rank(ticket)
        del self.ranked[rank]
        return self.held.pop(rank)

    def due(self, place: int) -> float:
        return self.anchor_at + (place - self.anchor_place) * self.interval

    def anchor(self, place: int, at: float) -> None:
        self.anchor_place, self.anchor_at = place, at

    def earliest(self, now: float) -> float:
        """When the next request may go: an interval after the last, not within a pause."""
        return max(now, self.last_sent + self.interval, self.paused_until)

    def reschedule(self, now: float, old_interval: float) -> None:
        """The places not yet due follow the lane's new pace or pause; those due keep going."""
        place = self.next_place
        if old_interval > 0 and self.anchor_at > _NEVER:
            ahead = math.ceil((now - self.anchor_at) / old_interval) if now > self.anchor_at else 0
            place = min(place, self.anchor_place + ahead)
        self.anchor(place, self.earliest(now))

    def round_trip(self, now: float) -> float:
        """The round trip learned, or longer while neither an answer has come nor a request
        gone for longer than it (one slow request in flight is no silence for a burst)."""
        return max(self.rtt, (now - max(self.heard_at, self.last_went)) * SILENCE_SHARE)

    def window_wait(self, ticket: Ticket, now: float) -> float:
        """0 if the window has a place for this held-back request, else about until the answer
        that frees its place (never a herd), at most two round trips or a share of the lane's
        silence (never a stall, never a busy poll)."""
        rank = bisect.bisect_left(self.waiting, ticket.place)
        short = rank + 1 - (self.window - self.in_flight)  # places to free before it
        if short <= 0:
            return 0.0
        answers = (short + 1) // 2
        rtt = self.round_trip(now)
        per_answer = rtt / max(1, self.in_flight)
        return min(max(MIN_WAIT, answers * per_answer), max(MIN_WAIT, 2 * rtt))

    def fly(self, ticket: Ticket) -> None:
        """Counts a request in flight (the start window's count)."""
        if not ticket.counted:
            ticket.counted = True
            self.in_flight += 1

    def land(self, ticket: Ticket) -> None:
        """Counts a request in flight no more."""
        if ticket.counted:
            ticket.counted = False
            self.in_flight -= 1

    def unwait(self, ticket: Ticket) -> None:
        """Takes a held-back request out of the window's line."""
        ticket.windowed = False
        del self.waiting[bisect.bisect_left(self.waiting, ticket.place)]

    def disarm(self, ticket: Ticket) -> Callable[[], object] | None:
        """Takes an armed ticket's sleeper out of the lane; returns its wake."""
        wake, ticket.wake = ticket.wake, None
        if wake is not None:
            if self.window_alarms.get(ticket.place) is ticket:
                del self.window_alarms[ticket.place]
            self.hint_alarms.pop(ticket, None)
            self.alarms.pop(ticket, None)
        return wake

    def wake(self, tickets: list[Ticket]) -> None:
        """Wakes the sleepers of ``tickets`` (each asks again)."""
        self.moved += 1
        for ticket in tickets:
            wake = self.disarm(ticket)
            if wake is not None:
                wake()

    def wake_window(self) -> None:
        """Wakes the held-back requests the window now has places for, no more (never a herd)."""
        self.moved += 1
        if self.window_alarms:
            free = self.waiting[: max(0, self.window - self.in_flight)]
            self.wake([self.window_alarms[t] for t in free if t in self.window_alarms])

    def wake_all(self) -> None:
        """The schedule moved: every sleeper asks again."""
        self.wake([*self.window_alarms.values(), *self.hint_alarms, *self.alarms])


def _lane(ceiling: float | None) -> _Lane:
    p = lane_of(ceiling)
    return _Lane(ceiling=p.ceiling, rate=p.rate, mode=p.mode)


class Budget:
    """The request budget of one client (and of every ``with_options`` copy of it)."""

    def __init__(self, limit: RateLimit) -> None:
        self._lock = threading.Lock()
        self._lanes = {
            SUBMIT: _lane(limit.submits_per_second),
            QUERY: _lane(limit.queries_per_second),
        }

    def reserve(self, kind: str, now: float, *, priority: float | None = None) -> Ticket:
        """A place of ``kind``, going in the order of ``priority`` (a moment between ``now``, the
        default, and ``now + max_interval``: ``poll.query_priority``), ties in request order."""
        with self._lock:
            lane = self._lanes[kind]
            self._grow(lane, now)
            key = now if priority is None or math.isnan(priority) else priority
            while lane.owed and lane.mode == STARTING:
                until, after = lane.owed.popleft()
                if until > now:  # an isolated 429's hint: this request waits it, alone
                    ticket = Ticket(kind, until, -1, paced=False, priority=key)
                    ticket.not_before, ticket.owed_after = until, after
                    return ticket
            if lane.mode == STARTING:
                free = now >= lane.paused_until
                if lane.in_flight < lane.window and not lane.waiting and free:
                    # Goes now: handed out sent, so the driver asks nothing more before it.
                    ticket = Ticket(kind, now, -1, paced=False, priority=key, sent_at=now)
                    lane.fly(ticket)  # the window counts it from now: a burst fills it at once
                    lane.last_went = now
                    return ticket
                # The window is full, or paused: it goes on a later answer.
                ticket = Ticket(kind, now, lane.turns, paced=False, priority=key)
                ticket.windowed = True
                lane.waiting.append(lane.turns)  # turns only grow: the list stays sorted
                lane.turns += 1
                ticket.slot = max(now + lane.window_wait(ticket, now), lane.paused_until)
                return ticket
            place, slot = self._hold(lane, now, key)
            return Ticket(kind, slot, place, paced=True, priority=key)

    def _hold(self, lane: _Lane, now: float, key: float) -> tuple[int, float]:
        """A paced place, and when it is due: after those reserved before it."""
        place = lane.next_place
        lane.next_place += 1
        if lane.due(place) < lane.earliest(now):  # nothing queued ahead: start from now
            lane.anchor(place, lane.earliest(now))
        slot = max(lane.due(place), lane.paused_until)
        lane.queued = lane.queued or slot > max(now, lane.paused_until)
        lane.held.append(place)  # places only grow: the list stays sorted
        bisect.insort(lane.ranked, (key, place))
        return place, slot

    def wait_time(self, ticket: Ticket, now: float) -> float:
        """Seconds to wait before sending; 0 means go now (the send is then recorded)."""
        with self._lock:
            lane = self._lanes[ticket.kind]
            if ticket.wake is not None:  # awake and asking: its sleeper is done
                lane.disarm(ticket)
            ticket.armed_wait = 0.0
            wait = self._wait(lane, ticket, now)
            ticket.seen = lane.moved  # what :meth:`arm` compares: news after this wakes it
            ticket.armed_wait = max(ticket.armed_wait, wait)
            return wait

    def _wait(self, lane: _Lane, ticket: Ticket, now: float) -> float:
        """:meth:`wait_time`'s answer, under the lock."""
        if ticket.sent_at is None and ticket.not_before > now:
            if lane.taken_after <= ticket.owed_after:
                # Its 429's hint, unless a request sent after it is taken: asked again (or,
                # armed, woken then).
                wait = ticket.armed_wait = ticket.not_before - now
                if lane.in_flight and lane.last_went > ticket.owed_after:
                    wait = min(wait, max(MIN_WAIT, lane.round_trip(now)))
                return wait
            ticket.not_before = _NEVER
        if ticket.windowed and lane.unpaced:
            wait = lane.paused_until - now  # no place in the window is taken in a pause
            if wait <= 0:
                wait = lane.window_wait(ticket, now)
                ticket.armed_wait = ARMED_WAIT  # armed, it is woken when its place frees
            if wait > 0:
                return wait
            lane.fly(ticket)  # its place in the window: it goes now
        if ticket.windowed:
            lane.unwait(ticket)
        if not ticket.paced and ticket.sent_at is None and not lane.unpaced:
            # Held back, or let through while a pause held it, and the lane paced since.
            self._grow(lane, now)
            ticket.place, ticket.slot = self._hold(lane, now, ticket.priority)
            ticket.paced = True
        due = lane.paused_until
        place = -1
        if ticket.paced:
            self._grow(lane, now)
            place = lane.place_of(ticket) if ticket.sent_at is None else ticket.place
            if lane.due(place) < now - lane.interval:
                # Woken late by a busy loop: the places after it go one by one, not together.
                lane.anchor(place, lane.earliest(now))
            due = max(lane.due(place), lane.earliest(now))
            if lane.strikes and lane.ceiling is None and lane.last_sent >= lane.paused_at:
                # After a pause, one goes until its answer (or four round trips) comes.
                due = max(due, lane.last_sent + 4 * lane.rtt)
        if due > now:
            if ticket.paced and due > lane.paused_until:
                lane.queued = True
            if lane.ceiling is None and lane.mode == RECOVERING:  # sooner if the pace grows
                return min(due - now, max(lane.grow_at - now, MIN_WAIT))
            return due - now
        if ticket.paced and ticket.sent_at is None:
            lane.forget(ticket)
            ticket.place = place
        ticket.sent_at = now
        if ticket.paced:
            lane.last_sent = now
        lane.fly(ticket)
        lane.last_went = max(lane.last_went, now)
        return 0.0

    def arm(self, ticket: Ticket, wake: Callable[[], object]) -> float:
        """Has ``wake`` called once, by whichever thread brings the news, as soon as the wait
        :meth:`wait_time` last gave ``ticket`` may end sooner: an answer freed its place in the
        window, a request sent after its 429 was taken, or the schedule moved. Returns how long
        the driver may sleep, unless woken, before it asks again (at least the wait it was
        told; longer where a wake is sure to come); 0.0: that news came already (ask now)."""
        with self._lock:
            lane = self._lanes[ticket.kind]
            if ticket.seen != lane.moved or ticket.sent_at is not None:
                return 0.0
            lane.disarm(ticket)
            ticket.wake = wake
            if ticket.windowed:
                lane.window_alarms[ticket.place] = ticket
            elif ticket.not_before > _NEVER:
                lane.hint_alarms[ticket] = None
            else:
                lane.alarms[ticket] = None
            return ticket.armed_wait

    def release(self, ticket: Ticket) -> None:
        """Gives back a place that will not be used (its request's deadline came first)."""
        with self._lock:
            lane = self._lanes[ticket.kind]
            lane.disarm(ticket)
            lane.land(ticket)
            if ticket.windowed:
                lane.unwait(ticket)
            if ticket.paced and ticket.sent_at is None:
                # The latest place goes, and each ticket after this one moves up one: places
                # given back anywhere (a task group cancelled, oldest first) leave no holes.
                # Their sleepers (not those before it) are woken to take their new turns.
                key = (ticket.priority, ticket.place)
                del lane.ranked[lane._rank(ticket)]
                if lane.held.pop() == lane.next_place - 1:
                    lane.next_place -= 1
                lane.wake([t for t in lane.alarms if (t.priority, t.place) > key])
            else:
                lane.wake_window()

    def gate(self, ticket: Ticket, clock: Callable[[], float]) -> WriteGate | None:
        """The write gate of a paced request whose slot came (None: unpaced)."""
        return WriteGate(self, ticket, clock) if ticket.paced else None

    def writing(self, ticket: Ticket, now: float) -> float:
        """0 if the paced request may be written now, else the seconds to wait. Requests that
        waited for a pooled connection leave together (51 in 1 s at 50/s, measured): so the
        heads themselves are spaced, as GCRA spaces a stream."""
        with self._lock:
            lane = self._lanes[ticket.kind]
            if not ticket.paced or lane.unpaced:
                return 0.0
            due = lane.write_at - WRITE_SLACK
            if due > now:
                return due - now
            lane.write_at = max(lane.write_at, now) + lane.interval
            return 0.0

    def finished(
        self,
        ticket: Ticket,
        now: float,
        *,
        limited: bool = False,
        retry_after: float | None = None,
        backoff: tuple[float, float] = DEFAULT_BACKOFF,
    ) -> None:
        """The request of ``ticket`` ended: answered, failed, or met a 429 (:class:`Ended`)."""
        with self._lock:
            lane = self._lanes[ticket.kind]
            # The window was used (TCP's window validation): it may widen.
            used = bool(lane.waiting) or 2 * lane.in_flight >= lane.window
            lane.land(ticket)
            lane.heard_at = now
            old_interval, struck = lane.interval, lane.strikes
            count(lane, now, limited=limited)
            moved = answered(
                lane,
                now,
                sent=ticket.sent_at,
                limited=limited,
                retry_after=retry_after,
                backoff=backoff,
                used=used,
            )
            if moved:
                lane.reschedule(now, old_interval)  # the places waiting follow, in order
            sent = ticket.sent_at if ticket.sent_at is not None else now
            if not limited:
                lane.taken_after = max(lane.taken_after, sent)
                if lane.hint_alarms:  # a 429's hint is waited no more once a later one is taken
                    lane.wake([t for t in lane.hint_alarms if t.owed_after < lane.taken_after])
            elif lane.mode == STARTING and retry_after is not None and retry_after > 0:
                lane.owed.append((now + min(retry_after, MAX_PAUSE), sent))  # for its retry
            if moved or struck:  # a new pace or pause, or the one after a pause answered
                lane.wake_all()
            else:
                lane.wake_window()

    def pace(self, kind: str) -> float | None:
        """The lane's current pace in requests per second (None: unpaced)."""
        with self._lock:
            lane = self._lanes[kind]
            return None if lane.unpaced else lane.rate

    def _grow(self, lane: _Lane, now: float) -> None:
        """The policy's growth, asked as requests come; the schedule follows a new pace."""
        if now < lane.grow_at:  # due once a second at most: every other request asks no more
            return
        old_interval = lane.interval
        # With no ceiling, places held from before a pause are a queue too.
        queued = lane.queued or (lane.ceiling is None and len(lane.held) > 1)
        lane.queued = False
        if grown(lane, now, queued=queued):
            lane.reschedule(now, old_interval)
            lane.wake_all()


# ---------------------------------------------------------------------------- the policy
# Written once (DESIGN 25): the in-process Budget, the Dask scheduler's (a Budget too) and the
# shared store's drivers call these on a Pacing; the store's scripts only keep its fields.


def lane_of(ceiling: float | None) -> Pacing:
    """A new lane's pacing: at its ceiling, or unpaced within the start window."""
    if ceiling is not None:
        return Pacing(ceiling=float(ceiling), rate=float(ceiling), mode=FIXED)
    return Pacing(ceiling=None, rate=None, mode=STARTING)


def count(p: Pacing, now: float, *, limited: bool) -> None:
    """Counts an answer (a store's script counts the same way)."""
    keep = 1.0 - 1.0 / RECENT
    p.answers = p.answers * keep + 1.0
    p.refused = p.refused * keep + (1.0 if limited else 0.0)
    if limited:
        return
    p.taken += 1
    second = int(now)
    if second != p.second:
        p.accepted_before = p.accepted if second == p.second + 1 else 0
        p.second, p.accepted = second, 0
    p.accepted += 1


def answered(
    p: Pacing,
    now: float,
    *,
    sent: float | None,
    limited: bool,
    retry_after: float | None = None,
    backoff: tuple[float, float] = DEFAULT_BACKOFF,
    used: bool = False,
) -> bool:
    """An answer (counted already) to a request sent at ``sent`` (None: never sent); ``used``:
    the start window may widen. True when the pace or pause changed."""
    took = None if sent is None else max(0.0, now - sent)
    sent = now if sent is None else sent
    if limited:
        return _limited(p, sent, now, retry_after, backoff)
    if sent >= p.paused_at:
        if p.strikes and p.burst and p.ceiling is None and p.mode == RECOVERING:
            if now <= p.decreased_at:  # the overload's own tick of a coarse clock: no time to
                return False  # measure a rate over; the next answer taken learns it
            # The first taken after an overload's pause: the pace never above what the gateway
            # took since the burst (a limit of N in S seconds takes N/S, whatever its burst).
            took_rate = max(PACE_FLOOR, (p.burst + p.taken) / (now - p.decreased_at))
            assert p.rate is not None  # recovering: paced
            if took_rate < p.rate:
                p.rate = p.overloaded_at = took_rate
            p.taken, p.burst, p.decreased_at = 0, 0, now
            # The burst's refusals answered the old pace: counted against the learned one, they
            # would cut it at its first 429 to half, not to DECREASE (55 s, not 52, on A's limits).
            p.answers = p.refused = 0.0
        p.strikes = 0
    if took is not None:
        _widen(p, took, now, used=used)
    return False


def _limited(
    p: Pacing, sent: float, now: float, retry_after: float | None, backoff: tuple[float, float]
) -> bool:
    """A 429: isolated (its request is retried) or an overload (a pause, and a pace)."""
    share = p.refused / max(p.answers, MIN_ANSWERS)
    if p.mode == STARTING and share < OVERLOAD_SHARE:
        if sent >= p.halved_at:  # the window halves, once a window: no more sent into a limit
            p.window = max(min(START_WINDOW, p.window), p.window // 2)
            p.round_at, p.round_window, p.halved_at = now, p.window, now
        return False  # isolated: its request is retried at once, as chance deserves
    if sent >= p.paused_at:  # a new episode, not an echo of requests in flight
        p.strikes += 1
    first, longest = backoff
    if retry_after is None and p.ceiling is None:
        first = max(first, NO_HINT_PAUSES[0])
    pause = min(longest, first * 2.0 ** min(max(p.strikes - 1, 0), 30))
    if retry_after is not None:
        pause = max(pause, min(retry_after, MAX_PAUSE))
    elif p.ceiling is None:
        pause = min(pause, NO_HINT_PAUSES[1])
    changed = now + pause > p.paused_until
    if changed:
        p.paused_until, p.paused_at = now + pause, now
    settled = now - p.decreased_at >= RECOVERY_PERIOD  # the last change had its effect
    overload = p.mode == STARTING or share >= DECREASE_SHARE
    if p.ceiling is None and p.mode == RECOVERING:
        # A limit met again at a pace learned, once it had requests taken (else: a pause).
        settled, overload = p.taken > 0, True
    if sent > p.decreased_at and overload and settled:
        _decrease(p, now, share)
        p.answers = p.refused = 0.0
        p.grow_at = now + (RECOVERY_PERIOD if p.ceiling is not None else 1.0)
        changed = True
    return changed


def _decrease(p: Pacing, now: float, share: float) -> None:
    if p.mode in (RECOVERING, FIXED):  # a pace that was close: to what got through
        assert p.rate is not None
        overloaded_at = p.rate
        rate = p.rate * max(FIRST_DECREASE, min(DECREASE, 1.0 - share))
        if p.ceiling is None and now > p.decreased_at and p.taken:  # what the gateway took
            overloaded_at = min(rate, p.taken / (now - p.decreased_at))
            rate = overloaded_at
    else:  # unpaced so far: from what the gateway accepted lately (a little says nothing)
        p.burst = int(_accepted_per_second(p, now))
        overloaded_at = max(p.burst, START_RATE)
        rate = overloaded_at * FIRST_DECREASE
    rate = max(PACE_FLOOR, rate)
    if p.ceiling is not None:
        rate = min(rate, p.ceiling)
    p.overloaded_at, p.taken = overloaded_at, 0
    p.rate, p.mode, p.decreased_at = rate, RECOVERING, now


def _widen(p: Pacing, took: float, now: float, *, used: bool) -> None:
    """An accepted answer: the start window widens by one if ``used``, at most doubling in a
    round trip (what is in flight when a limit's first 429 comes back is refused too)."""
    p.rtt += (took - p.rtt) / 8  # smoothed as TCP's srtt
    if p.mode != STARTING or not used:
        return
    if now - p.round_at >= max(MIN_ROUND, p.rtt):
        p.round_at, p.round_window = now, p.window
    p.window = min(p.window + 1, 2 * p.round_window, MAX_WINDOW)


def grown(p: Pacing, now: float, *, queued: bool) -> bool:
    """The pace's growth, due at ``p.grow_at`` (``queued``: requests waited for it since).
    True when the pace changed."""
    if p.ceiling is None and now < p.paused_until:  # a queue behind a pause says nothing
        p.grow_at = p.paused_until + 1.0
        return False
    rate = p.rate
    careful = p.mode == RECOVERING and (p.rate or 0) < p.overloaded_at
    if queued and p.rate is not None and p.mode == RECOVERING:
        if p.ceiling is not None:
            p.rate *= 1.0 + RECOVERY_STEP if careful else 2.0
            if p.rate >= p.ceiling:
                p.rate, p.mode = p.ceiling, FIXED
        else:
            p.rate *= 1.0 + RECOVERY_STEP
            if p.rate > FREE_RATE:  # unpaced again, within the window it had
                p.rate, p.mode = None, STARTING
    careful = p.mode == RECOVERING and (p.rate or 0) < p.overloaded_at
    slow = p.ceiling is not None and (careful or p.mode == FIXED)
    if p.ceiling is None and p.mode == RECOVERING:  # near the pace a limit was met at: slowly
        slow = DECREASE * p.overloaded_at <= (p.rate or 0) <= p.overloaded_at / DECREASE
    p.grow_at = now + (RECOVERY_PERIOD if slow else 1.0)
    return p.rate != rate


def _accepted_per_second(p: Pacing, now: float) -> float:
    """Answers accepted in the last whole second (or in this one, if more)."""
    second = int(now)
    if second == p.second:
        return float(max(p.accepted, p.accepted_before))
    if second == p.second + 1:
        return float(p.accepted)
    return 0.0


@dataclass(slots=True, frozen=True)
class WriteGate:
    """What the driver asks right before a paced request's head goes on the wire: ``wait()``
    until it says 0, then write, with nothing between (:meth:`Budget.writing`)."""

    budget: Budget
    ticket: Ticket
    clock: Callable[[], float]

    def wait(self) -> float:
        """Seconds to wait before asking again; 0: write now."""
        return self.budget.writing(self.ticket, self.clock())
