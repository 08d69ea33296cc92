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
  A slot is not yet the wire: a request may then wait for a connection of the HTTP client's
  pool, and those that waited leave it together. So a paced request also passes a **write
  gate** right before its head is written (:meth:`Budget.writing`, asked by the driver through
  the request's :class:`WriteGate`), which spaces the writes themselves: the bound holds on
  the wire by construction, not only at the slots.
- A **429** on a lane with a ceiling pauses the lane for the whole client: ``Retry-After``
  when given, but never less than the retry policy's own backoff, which grows with each 429 in
  a row (so a hint of 0 never makes a client spin). When 429s are a real share of the lane's
  recent answers (a gateway over its limit, not one 429 by chance), the pace is lowered too,
  at most once a recovery period, to the share that got through; it then recovers a step at a
  time while requests queue for it, up to the ceiling.
- With **no ceiling** (DESIGN 20), the client adds no timed delay until the gateway pushes
  back. A lane starts with a window of :data:`START_WINDOW` requests in flight, which each
  accepted answer to a request that filled it widens by one, at most doubling in a round trip
  and in :data:`MIN_ROUND` (TCP's slow start, with its window validation); past
  :data:`MAX_WINDOW` it grows no more. A request the window holds back goes when an
  answer frees a place, so the window costs nothing while the gateway is the bottleneck (its
  answers clock the requests: 150 submits at once take the time raw httpx takes), and a burst
  at a gateway with a low limit is not sent whole before its first 429 can come back (100
  generates at once against 20 submits per 10 s meet about 80 429s sent whole, 28 with a
  slow start from 16 unbounded in time, 4 to 10 with this window).
- On a lane with no ceiling, a **lone 429** (the answer before it was accepted, and 429s are
  less than :data:`OVERLOAD_SHARE` of the recent answers) pauses the lane *in doubt*: the
  first answer that accepts a request sent after it ends the pause at once (while such a
  request is in flight, the waiting ones ask again every round trip), so a gateway that throws
  a few 429s at random costs about a round trip each (3% random 429s: 1,000 submits take 1.1x
  to 1.4x the time without them; a full pause each made it 8x). A gateway that gives no
  ``Retry-After`` (surface A's provider) says nothing of when its limit frees, so the pause
  ends on time: then one request goes first (a *probe*; the others wait for its answer, at
  most :data:`PROBE_HOLD`), and a probe taken only after a pause of more than a round trip
  proves a limit, not chance: the lane is paced from there as after an overload (the requests
  that waited through the pause, sent all at once, met a gateway still full). Such a limit is
  most often a window (N requests in any S seconds): a run of requests fills it, and the
  gateway takes one again only S after the run's first. The lane learns S between bounds from
  its probes (one refused that long after its run began, one taken) and times the pause after
  the next full run to it, halving the bounds' gap while it is wide, instead of probing the
  whole window again in doubling steps, three of them refused a window (100 generates at
  surface A's limits, side by side on one machine: 5 to 10% of requests answered 429 at 0.97x
  to 1.06x the floor, where probing each window met 8 to 13% at 1.05x to 1.14x; one 429 a
  window is how a client with no hint finds it full). A window is learned only from a pause
  whose first :data:`CONFIRM` probes were refused, so 429s thrown at random teach none, and a
  run is timed only when it had about as many taken as the last (:data:`FULL_RUN`): a 429
  sooner is a run catching up with the last one's requests still in the window, and delays
  the next run by its pause instead. On a paced lane,
  a lone 429 at a pace well above what the gateway accepted in the last second lowers the
  pace to that (by half at most) and holds it there for a :data:`RECOVERY_PERIOD`; an
  overload it then turns into does not lower it twice. :data:`CONFIRM` requests sent
  after it refused first, or a 429 right after a 429, or 429s that make up
  :data:`OVERLOAD_SHARE` of the recent answers, are an **overload**: the lane pauses as above
  and is paced from half of what the gateway accepted in the last whole second (never from
  less than half :data:`START_RATE`), lowered again on each overload at most once a recovery
  period. While requests queue for the pace and no overload comes it grows by
  :data:`REGAIN_STEP` a second (a false overload, the two requests after a random 429 refused
  as well, about 1 random 429 in 1,100, costs tens of seconds at worst) and past
  :data:`FREE_RATE` the lane is unpaced again, within its window. A gateway over its limit is
  met by one client slowing down, about one 429 a limit's window once paced.

The constants were chosen with ``bench/bursts.py`` and ``bench/budget.py`` against the
reference gateway (BENCHMARKS.md has the figures).
"""

from __future__ import annotations

import bisect
import math
import threading
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, TypedDict

from .config import RateLimit, RetryPolicy

if TYPE_CHECKING:
    from typing_extensions import Unpack

SUBMIT = "submit"
QUERY = "query"

START_WINDOW = 4  # requests in flight a lane with no ceiling lets go before any answer
MIN_ROUND = 0.05  # seconds: the window at most doubles in this time (and in a round trip)
# The widest window: more in flight would wait in the HTTP client's pool instead (httpx keeps
# 100 connections), where 256 at once cost about 3x the CPU of the same run held back here.
MAX_WINDOW = 64
RTT_GUESS = 0.02  # seconds an answer is taken to need before one came back
# After a lone 429's pause, the first request sent (a probe) goes alone: the others wait for
# its answer, at most this long (or four round trips) after it went.
PROBE_HOLD = 2.0
MIN_WAIT = 0.001  # the shortest wait for a place in the window (never spin)
# The write gate lets a paced request's head go this much before its turn, so that a driver
# woken a few milliseconds late by a busy event loop does not push every later turn back (the
# gate would then fall behind its pace for good, and requests pile up in it): 5 ms, half of
# what GUARD leaves in a 1 s window, the other half being for the way to the gateway.
WRITE_SLACK = 0.005
START_RATE = 10.0  # an overload never starts the pace below half this many requests/s
FREE_RATE = 1024.0  # past this, a lane with no ceiling that recovered is unpaced again
PACE_FLOOR = 1 / 60  # the pace never falls below one request a minute
FIRST_DECREASE = 0.5  # the first overload halves what the gateway accepted lately
DECREASE = 0.8  # later ones, and one at a ceiling, lower it to the share that got through
# (at most to this, at least by half), and no more than once a recovery period
RECOVERY_STEP = 0.1  # with a ceiling, the pace grows by a tenth every 5 s in which requests
RECOVERY_PERIOD = 5.0  # queued for it and it was not lowered, up to where the overload came,
# and then doubles each such second, up to the ceiling.
# With no ceiling there is no limit known to creep back to: the pace grows by a tenth each
# second requests queued for it (0.25 cost more 429s at real limits, measured, for no gain).
REGAIN_STEP = 0.1
# A gateway over its limit answers most requests with 429; one that throws a few at random
# does not, and slowing down would not help. With a ceiling, the pace is lowered only when 429s
# make up DECREASE_SHARE of the lane's last RECENT answers (counted out of at least
# MIN_ANSWERS); with none, a 429 is an overload when CONFIRM requests sent after a lone 429
# are refused before one is accepted, when it comes right after a 429, or when 429s make up
# OVERLOAD_SHARE of those answers. At 3% random 429s, the first two (1 in 1,100 lone 429s)
# and 25% of 50 answers (under 1 in 10^6) almost never happen; at 12%, random clusters did.
RECENT = 50
DECREASE_SHARE = 0.06
OVERLOAD_SHARE = 0.25
CONFIRM = 2
MIN_ANSWERS = 20
# The retry policy's own first and longest backoff, when a caller gives none.
DEFAULT_BACKOFF = (RetryPolicy.initial_backoff, RetryPolicy.max_backoff)
MAX_PAUSE = 60.0  # the longest pause a Retry-After may impose on the whole client
# With no ceiling and no Retry-After, the longest pause: a probe every 4 s at worst. The
# retry policy's 8 s overshot a 10 s limit's window by up to 5 s (measured: 0.1x the floor).
NO_HINT_PAUSE = 4.0
# A limit with no Retry-After is most often a window (N requests in any S seconds): a run of
# requests fills it, the gateway refuses the next, and takes one again only when the run's
# first request leaves the window, S after it went. A lane learns S between bounds (a probe
# refused that long after its run began, one taken) and times its next pause to it: halfway
# between the bounds while they are more than CYCLE_TOLERANCE of the upper apart, else at the
# upper one. Only after a run that had at least FULL_RUN of the last one's requests taken:
# a 429 sooner is not the window full again (chance, or another client on the key).
CYCLE_TOLERANCE = 0.1
FULL_RUN = 0.75
# Every paced interval is this much longer than the pace says: a gateway that counts N requests
# in any S-second window sees our N+1st 1% of S past it (10 ms of a 1 s window, 100 ms of a
# 10 s one), so jitter on the way cannot push one request into the window of another.
GUARD = 0.01

# Lane modes.
FIXED = "fixed"  # at the configured ceiling
STARTING = "starting"  # no ceiling, no overload yet: a window in flight, growing per answer
RECOVERING = "recovering"  # after a 429: below the ceiling (if any), growing back
_NEVER = -math.inf


@dataclass(slots=True)
class Ticket:
    """One request's place in its lane; ``slot`` is when it was due as it was reserved."""

    kind: str
    slot: float
    place: int  # the place it reserved in the lane's order (paced tickets; windowed: its turn)
    paced: bool  # False for a request let through unpaced (by the start window)
    sent_at: float | None = None
    counted: bool = False  # counted in the lane's requests in flight
    priority: float = 0.0  # smaller goes sooner (paced tickets)
    windowed: bool = False  # held back by the start window until an answer frees a place
    flying_at: float | None = None  # when it went (counted in flight, no-ceiling lanes)


@dataclass(slots=True)
class _Lane:
    ceiling: float | None
    rate: float | None  # None: unpaced
    mode: str
    in_flight: int = 0
    window: int = START_WINDOW  # requests in flight a starting lane lets go
    rtt: float = RTT_GUESS  # smoothed seconds from send to answer
    round_at: float = _NEVER  # when the window's current round began ...
    round_window: int = START_WINDOW  # ... and its width then: at most double it this round
    turns: int = 0  # turns handed to requests the window held back, in request order
    last_limited: bool = False  # the lane's last answer was a 429
    doubtful: bool = False  # paused by a lone 429, which a later acceptance calls chance
    doubt_sent: float = _NEVER  # when the request of that lone 429 went
    refused_after: int = 0  # requests sent after it refused since
    next_place: int = 0  # the place the next paced reservation gets
    anchor_place: int = 0  # the schedule: place ``anchor_place`` is due at ``anchor_at`` ...
    anchor_at: float = _NEVER  # ... and each later one an interval after the one before
    last_sent: float = _NEVER
    paused_at: float = _NEVER
    paused_until: float = _NEVER
    strikes: int = 0
    decreased_at: float = _NEVER
    overloaded_at: float = 0.0  # the pace at which the last overload came
    lone_pace: float = 0.0  # the pace at which the last lone 429 of a paced lane came ...
    lone_at: float = _NEVER  # ... and when
    # The gateway's window, as runs and pauses with no Retry-After show it (no ceiling):
    run_at: float = _NEVER  # when the run began (its first request accepted after a pause) ...
    run: int = 0  # ... and how many it has had accepted so far
    run_gap: float = 0.0  # ... and the pauses it had midway (its later requests went later)
    last_run: int = 0  # how many the run before it had accepted
    cycling: bool = False  # paused with no hint after a run: a probe taken ends the cycle
    held_out: int = 0  # probes of this cycle refused: the pause was needed
    cycle_lo: float = 0.0  # a probe this long after its run began was refused ...
    cycle_hi: float = math.inf  # ... and one this long after was taken (inf: none yet)
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
    waiting: list[int] = field(default_factory=list)  # the turns held back by the window
    flying: list[float] = field(default_factory=list)  # when each one in flight went
    write_at: float = _NEVER  # the write gate: when the next paced head is due on the wire

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

    @property
    def unpaced(self) -> bool:
        return self.mode == STARTING

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

    def window_wait(self, ticket: Ticket, now: float) -> float:
        """0 if the window has a place for this held-back request (places go in request
        order), else how long it sleeps before it asks again: about until the answer that
        frees its place. Answers come about one an ``rtt / in_flight``, each frees a place
        (two while the window widens), so the requests held back wake one or two an answer,
        in order, as if each answer woke them: never a herd that goes together once many
        answers came in. Never longer than two round trips: a wrong guess costs a wake-up,
        not a stall."""
        rank = bisect.bisect_left(self.waiting, ticket.place)
        short = rank + 1 - (self.window - self.in_flight)  # places to free before it
        if short <= 0:
            return 0.0
        answers = (short + 1) // 2
        per_answer = self.rtt / max(1, self.in_flight)
        return min(max(MIN_WAIT, answers * per_answer), max(MIN_WAIT, 2 * self.rtt))

    def fly(self, ticket: Ticket, now: float, *, going: bool = True) -> None:
        """Counts a request in flight from ``now`` and, when it is ``going`` now, notes its
        send time on a lane with no ceiling (the window's guesses and a lone 429's doubt read
        them; one that waits out a pause first is noted when it goes)."""
        if not ticket.counted:
            ticket.counted = True
            self.in_flight += 1
        if self.ceiling is None and going and ticket.flying_at is None:
            ticket.flying_at = now
            bisect.insort(self.flying, now)  # threads may pass an earlier ``now`` late

    def recheck(self, wait: float, now: float) -> float:
        """A wait shortened while a lone 429's pause may still be lifted (a request sent after
        it is in flight, and its acceptance would call the 429 chance): such a pause is
        checked again once a round trip, and costs the lane about that much if it lifts."""
        lifts = self.doubtful and self.flying and self.flying[-1] > self.doubt_sent
        if lifts and self.paused_until > now:
            return min(wait, max(MIN_WAIT, self.rtt))
        return wait

    def probing(self, now: float) -> bool:
        """Whether a request sent after a lone 429 (a probe) is on its way, sent less than
        :data:`PROBE_HOLD` (or four round trips) ago: its answer says whether the gateway
        takes requests again, so the others wait for it instead of all meeting a full one."""
        if not self.doubtful or not self.flying:
            return False
        return self.flying[-1] > max(self.doubt_sent, now - max(PROBE_HOLD, 4 * self.rtt))

    def land(self, ticket: Ticket) -> None:
        """A request in flight ended: its send time is forgotten."""
        if ticket.flying_at is None:
            return
        i = bisect.bisect_left(self.flying, ticket.flying_at)
        if i < len(self.flying) and self.flying[i] == ticket.flying_at:
            del self.flying[i]
        ticket.flying_at = None

    def unwait(self, ticket: Ticket) -> None:
        """Takes a held-back request out of the window's line."""
        ticket.windowed = False
        del self.waiting[bisect.bisect_left(self.waiting, ticket.place)]


def _lane(ceiling: float | None) -> _Lane:
    if ceiling is not None:
        return _Lane(ceiling=float(ceiling), rate=float(ceiling), mode=FIXED)
    return _Lane(ceiling=None, rate=None, mode=STARTING, window=START_WINDOW)


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
            key = now if priority is None or math.isnan(priority) else priority
            free = now >= lane.paused_until and not lane.probing(now)
            if lane.mode == STARTING and lane.in_flight < lane.window and not lane.waiting and free:
                ticket = Ticket(kind, now, -1, paced=False, priority=key)
                lane.fly(ticket, now)  # the window counts it from now: a burst fills it at once
                return ticket
            if lane.mode == STARTING:  # the window is full, or paused: it goes on a later answer
                ticket = Ticket(kind, now, lane.turns, paced=False, priority=key)
                ticket.windowed = True
                lane.waiting.append(lane.turns)  # turns only grow: the list stays sorted
                lane.turns += 1
                ticket.slot = max(now + lane.window_wait(ticket, now), lane.paused_until)
                return ticket
            return self._hold(lane, kind, now, key)

    def _hold(self, lane: _Lane, kind: str, now: float, key: float) -> Ticket:
        """A paced place for a request of ``lane``, due after those reserved before it."""
        place = lane.next_place
        lane.next_place += 1
        if lane.due(place) < lane.earliest(now):  # nothing queued ahead: start from now
            lane.anchor(place, lane.earliest(now))
        slot = max(lane.due(place), lane.paused_until)
        # Waiting out a pause says nothing of the pace; waiting for a slot says it is short.
        lane.queued = lane.queued or slot > max(now, lane.paused_until)
        ticket = Ticket(kind, slot, place, paced=True, priority=key)
        lane.held.append(place)  # places only grow: the list stays sorted
        bisect.insort(lane.ranked, (key, place))
        return ticket

    def wait_time(self, ticket: Ticket, now: float) -> float:
        """Seconds to wait before sending; 0 means go now (the send is then recorded)."""
        with self._lock:
            lane = self._lanes[ticket.kind]
            if ticket.flying_at is None and now >= lane.paused_until and lane.probing(now):
                # A lone 429's pause is over and a probe is on its way: wait for its answer.
                return max(MIN_WAIT, lane.rtt)
            if ticket.windowed:
                if lane.mode == STARTING:
                    if now < lane.paused_until:  # no place in the window is taken in a pause
                        return lane.recheck(lane.paused_until - now, now)
                    wait = lane.window_wait(ticket, now)
                    if wait > 0:
                        return wait
                    lane.fly(ticket, now)  # its place in the window: it goes now
                # A place in the window came, or the start is over: unpaced, it goes now;
                # after an overload it takes a paced place like any new request.
                lane.unwait(ticket)
                if not lane.unpaced:
                    self._grow(lane, now)
                    held = self._hold(lane, ticket.kind, now, ticket.priority)
                    ticket.paced, ticket.place, ticket.slot = True, held.place, held.slot
            elif not ticket.paced and ticket.sent_at is None and not lane.unpaced:
                # Let through by the window while a pause held it, and the lane was overloaded
                # meanwhile: it takes a paced place too, so the places held through the pause
                # do not all go together when it ends (each would meet the same full gateway).
                self._grow(lane, now)
                held = self._hold(lane, ticket.kind, now, ticket.priority)
                ticket.paced, ticket.place, ticket.slot = True, held.place, held.slot
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
                return lane.recheck(due - now, now)
            if ticket.paced and ticket.sent_at is None:
                lane.forget(ticket)
                ticket.place = place
            ticket.sent_at = now
            if ticket.paced:
                lane.last_sent = now
            lane.fly(ticket, now)
            return 0.0

    def release(self, ticket: Ticket) -> None:
        """Gives back a place that will not be used (its request's deadline came first)."""
        with self._lock:
            lane = self._lanes[ticket.kind]
            self._uncount(lane, ticket)
            if ticket.windowed:
                lane.unwait(ticket)
            if ticket.paced and ticket.sent_at is None:
                place = lane.forget(ticket)  # the others keep their places and their order
                if place == lane.next_place - 1:
                    lane.next_place -= 1  # the last place: given back, it leaves no hole

    def gate(self, ticket: Ticket, clock: Callable[[], float]) -> WriteGate | None:
        """The write gate of a paced request whose slot came (None: unpaced, nothing to
        keep): the driver asks it right before the request's head goes on the wire."""
        return WriteGate(self, ticket, clock) if ticket.paced else None

    def writing(self, ticket: Ticket, now: float) -> float:
        """The paced request of ``ticket`` is about to be written to its connection: 0 if it
        may be now, else the seconds to wait before asking again.

        Its slot spaced it from the slots before it, but between a slot and the wire a
        request may wait for a connection of the HTTP client's pool (one loaded by other
        requests), and requests that waited there leave it together: 51 of them in a 1 s
        window at 50/s, measured. Here the heads themselves are spaced, as GCRA spaces a
        stream: each one goes no sooner than :data:`WRITE_SLACK` before its turn, and the
        next turn is an interval after this one's (or after now, if it came later). So any
        ``k + 1`` heads reach the wire at least ``k`` intervals less the slack apart, however
        the pool or the event loop delayed each: in any window of *w* seconds at most
        ``rate * w + 1`` go out (for *w* of a second or more, at most ``rate * w``, with 5 ms
        of the guard left for the way), by construction."""
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
        """The request of ``ticket`` ended: answered, failed, or (``limited``) met a 429 with the
        hint ``retry_after``; ``backoff`` is the retry policy's first and longest backoff."""
        with self._lock:
            lane = self._lanes[ticket.kind]
            sent = ticket.sent_at if ticket.sent_at is not None else now
            # The window was used (requests wait for it, or half of it is in flight), as TCP's
            # window validation asks before it widens one.
            used = bool(lane.waiting) or 2 * lane.in_flight >= lane.window
            self._uncount(lane, ticket)
            lane.answers.append(limited)
            after_429, lane.last_limited = lane.last_limited, limited
            if limited:
                self._limited(lane, sent, now, retry_after, backoff, after_429=after_429)
                return
            if sent >= lane.paused_at:
                lane.strikes = 0
            if lane.ceiling is None:
                self._ran(lane, sent)
            if lane.doubtful and sent > lane.doubt_sent:
                # The gateway took a request sent after the lone 429's: it was chance, not a
                # full gateway. The pause ends, and the places waiting for it go now.
                lane.doubtful = False
                if lane.mode == STARTING and now - lane.paused_at >= max(MIN_ROUND, 2 * lane.rtt):
                    # Only a probe sent after a pause of more than a round trip was taken: the
                    # gateway needed the time (a limit, met at this speed, which a chance 429
                    # amid requests in flight is not). The requests that waited for it would
                    # meet it again all at once: the lane is paced from here, as after an
                    # overload, and grows back as it does.
                    self._decrease(lane, now, 0.0)
                    lane.grow_at = now + 1.0
                if lane.paused_until > now:
                    lane.paused_until = now
                    lane.reschedule(now, lane.interval)
            if ticket.sent_at is not None:
                self._widen(lane, max(0.0, now - ticket.sent_at), now, used=used)
            second = int(now)
            if second != lane.second:
                lane.accepted_before = lane.accepted if second == lane.second + 1 else 0
                lane.second, lane.accepted = second, 0
            lane.accepted += 1

    def pace(self, kind: str) -> float | None:
        """The lane's current pace in requests per second (None: unpaced)."""
        with self._lock:
            lane = self._lanes[kind]
            return None if lane.unpaced else lane.rate

    @staticmethod
    def _uncount(lane: _Lane, ticket: Ticket) -> None:
        if ticket.counted:
            ticket.counted = False
            lane.in_flight -= 1
        lane.land(ticket)

    # ------------------------------------------------------------------------ pace changes

    def _limited(
        self,
        lane: _Lane,
        sent: float,
        now: float,
        retry_after: float | None,
        backoff: tuple[float, float],
        *,
        after_429: bool,
    ) -> None:
        share = sum(lane.answers) / max(len(lane.answers), MIN_ANSWERS)
        lone = fresh = capped = False
        if lane.ceiling is None:
            if lane.doubtful:
                if sent < lane.doubt_sent:
                    return  # sent before the lone 429's request: it says nothing new
                lane.refused_after += 1
                if lane.refused_after < CONFIRM:
                    # A later request refused too: a full gateway, or (once in 30 at 3%)
                    # chance again. The pause grows, still in doubt.
                    lone = True
                    lane.strikes += 1
                else:  # CONFIRM later requests refused, none accepted: the gateway is full
                    lane.doubtful = False
                    # If the lone 429 lowered a pace already (its request was sent at it),
                    # that pace met the limit once: it is not lowered a second time.
                    capped = lane.lone_at >= lane.doubt_sent
            elif not after_429 and share < OVERLOAD_SHARE and now >= lane.paused_until:
                # A lone 429 (the answer before it was accepted): chance, or the first of an
                # overload. The lane pauses as for any 429, in doubt: the first request sent
                # after this one that is accepted ends the pause; CONFIRM of them refused
                # first make it an overload.
                lone = fresh = True
                lane.doubtful, lane.doubt_sent, lane.refused_after = True, sent, 0
                if lane.mode == RECOVERING and lane.rate is not None:
                    self._cap(lane, now)
        if sent >= lane.paused_at and (fresh or not lone):  # a new episode, not an echo
            lane.strikes += 1
        first, longest = backoff
        pause = min(longest, first * 2.0 ** min(max(lane.strikes - 1, 0), 30))
        if retry_after is not None:
            pause = max(pause, min(retry_after, MAX_PAUSE))
        elif lane.ceiling is None:
            pause = min(pause, NO_HINT_PAUSE)
        until = now + pause
        if lane.ceiling is None and retry_after is None:
            until = self._timed(lane, sent, now, until)
        if until > lane.paused_until:
            lane.paused_until, lane.paused_at = until, now
            lane.reschedule(now, lane.interval)  # the places waiting go after it, in order
        if lone:
            return
        settled = now - lane.decreased_at >= RECOVERY_PERIOD  # the last change had its effect
        # With no ceiling this is an overload already (a 429 in a row, or a real share).
        overload = lane.ceiling is None or share >= DECREASE_SHARE
        if sent > lane.decreased_at and overload and settled and not capped:
            self._decrease(lane, now, share)
            lane.answers.clear()
            lane.grow_at = now + (RECOVERY_PERIOD if lane.ceiling is not None else 1.0)

    @staticmethod
    def _timed(lane: _Lane, sent: float, now: float, until: float) -> float:
        """When a pause with no hint on a lane with no ceiling ends (``until``: as the retry
        policy's backoff has it). The first 429 after a run that filled the gateway's window
        again times the pause to the window learned; a probe refused raises its lower bound
        and is followed at the upper one, which a probe was taken at before (none known yet:
        the backoff, doubling, finds one)."""
        if lane.run_at == _NEVER:
            return until  # nothing taken yet: no run, no window to time
        offset = sent - lane.run_at
        if lane.cycling:
            if sent < lane.paused_at:
                return until  # sent before the pause (in flight): the same full window
            lane.held_out += 1  # a probe, refused
            lane.cycle_lo = max(lane.cycle_lo, offset)
            if lane.cycle_lo >= lane.cycle_hi:  # the window is not what it was: learn anew
                lane.cycle_lo, lane.cycle_hi = offset, math.inf
            planned = lane.cycle_hi
        else:
            if lane.last_run and not FULL_RUN <= lane.run / lane.last_run <= 1 / FULL_RUN:
                # Too soon for the window to be full again: the run went faster than the
                # last one's requests left the window, or chance. The run goes on after it,
                # its later requests that much later: the next run waits that much more, or
                # it would meet them in the window at the same place.
                if lane.run < lane.last_run:
                    lane.run_gap += until - now
                return until
            lane.cycling, lane.held_out = True, 0
            lo, hi = lane.cycle_lo, lane.cycle_hi
            planned = hi if hi - lo <= CYCLE_TOLERANCE * hi else (lo + hi) / 2
        if planned == math.inf or offset >= planned + lane.run_gap:
            return until
        return min(lane.run_at + planned + lane.run_gap, now + MAX_PAUSE)

    @staticmethod
    def _ran(lane: _Lane, sent: float) -> None:
        """An accepted answer on a lane with no ceiling, to a request sent at ``sent``: the
        first taken after a pause with no hint (a probe) ends its run's cycle, bounding the
        gateway's window from above, and begins the next run. A window is first learned
        from a cycle in which :data:`CONFIRM` probes were refused: a gateway that throws a few
        429s at random refuses one probe in 30 at 3%, two in a row about one in 1,000."""
        if lane.cycling and sent >= lane.paused_at:
            if lane.held_out >= CONFIRM or lane.cycle_hi < math.inf:
                lane.cycle_hi = min(lane.cycle_hi, sent - lane.run_at)
            lane.last_run, lane.run_at, lane.run, lane.cycling = lane.run, sent, 0, False
            lane.run_gap = 0.0
        elif lane.cycling and lane.doubtful and sent > lane.doubt_sent:
            lane.cycling = False  # taken amid the 429s, before the pause: chance, no window
        elif lane.run_at == _NEVER:
            lane.run_at = sent
        lane.run += 1

    @staticmethod
    def _cap(lane: _Lane, now: float) -> None:
        """A lone 429 on a paced lane with no ceiling. Chance or not, it came at this pace: if
        that is well above what the gateway accepted in the last second, the pace falls to it
        (by half at most, never below half :data:`START_RATE`) and stays there for a
        :data:`RECOVERY_PERIOD` (a pace that grew on past lone 429s called chance met a real
        limit again and again)."""
        assert lane.rate is not None
        cap = max(_accepted_per_second(lane, now), START_RATE * FIRST_DECREASE,
                  lane.rate * FIRST_DECREASE)  # fmt: skip
        if cap < lane.rate * DECREASE:  # well above what got through (not a pace at its limit)
            lane.lone_pace, lane.lone_at = lane.rate, now
            old_interval = lane.interval
            lane.rate = cap
            lane.reschedule(now, old_interval)

    def _decrease(self, lane: _Lane, now: float, share: float) -> None:
        if lane.mode in (RECOVERING, FIXED):  # a pace that was close: to what got through
            assert lane.rate is not None
            overloaded_at = lane.rate
            rate = lane.rate * max(FIRST_DECREASE, min(DECREASE, 1.0 - share))
        else:  # unpaced so far: start from what the gateway accepted lately, but never from
            # less than the starting pace: a client that had sent little (or only for part of
            # a second) says nothing of what the gateway would accept.
            overloaded_at = max(_accepted_per_second(lane, now), START_RATE)
            rate = overloaded_at * FIRST_DECREASE
        rate = max(PACE_FLOOR, rate)
        if lane.ceiling is not None:
            rate = min(rate, lane.ceiling)
        old_interval = lane.interval
        lane.overloaded_at = overloaded_at
        lane.rate, lane.mode, lane.decreased_at = rate, RECOVERING, now
        lane.reschedule(now, old_interval)

    @staticmethod
    def _widen(lane: _Lane, took: float, now: float, *, used: bool) -> None:
        """An accepted answer that took ``took`` seconds. In the start, the window widens by
        one if it was ``used`` (a window never used says nothing of a wider one, and would let
        a later burst of that width go at once: TCP's window validation), but at most doubles
        in a round trip and in :data:`MIN_ROUND`: a gateway that
        answers at once says nothing yet of its limit, and what is in flight when its first
        429 comes back is refused too (``bench/bursts.py``: 100 submits at once against 20
        per 10 s met 28 429s in the first second unbounded, 4 to 10 bounded), and never past
        :data:`MAX_WINDOW`."""
        lane.rtt += (took - lane.rtt) / 8  # smoothed as TCP's srtt
        if lane.mode != STARTING or not used:
            return
        if now - lane.round_at >= max(MIN_ROUND, lane.rtt):
            lane.round_at, lane.round_window = now, lane.window
        lane.window = min(lane.window + 1, 2 * lane.round_window, MAX_WINDOW)

    def _grow(self, lane: _Lane, now: float) -> None:
        if now < lane.grow_at:
            return
        if lane.ceiling is None and now < lane.paused_until:
            # Paused, nothing goes: requests queued behind a pause say nothing of the pace
            # (measured: growing through pauses in doubt cost a 429 more a limit's window).
            lane.queued = False
            lane.grow_at = lane.paused_until + 1.0
            return
        if lane.ceiling is None and lane.cycle_hi < math.inf and now - lane.run_at < lane.cycle_hi:
            # A run within a window learned: the window, not the pace, is the limit; a run
            # faster than the last one left the window only meets its requests still in it.
            lane.queued = False
            lane.grow_at = now + 1.0
            return
        rate, old_interval = lane.rate, lane.interval
        careful = lane.mode == RECOVERING and (lane.rate or 0) < lane.overloaded_at
        # Requests queue for the pace when one had to wait for its slot or (with no ceiling)
        # places reserved earlier still wait for theirs: a queue that holds its places from
        # before a pause wakes at its slots and never finds one still ahead.
        queued = lane.queued or (lane.ceiling is None and len(lane.held) > 1)
        if queued and lane.rate is not None and lane.mode == RECOVERING:
            if lane.ceiling is not None:
                lane.rate *= 1.0 + RECOVERY_STEP if careful else 2.0
                if lane.rate >= lane.ceiling:
                    lane.rate, lane.mode = lane.ceiling, FIXED
            elif lane.rate < DECREASE * lane.lone_pace or now - lane.lone_at >= RECOVERY_PERIOD:
                # (not near the pace of a lone 429 met less than a recovery period ago)
                lane.rate *= 1.0 + REGAIN_STEP
                if lane.rate > FREE_RATE:  # unpaced again, within the window it had
                    lane.rate, lane.mode = None, STARTING
        if lane.rate != rate:
            lane.reschedule(now, old_interval)
        lane.queued = False
        careful = lane.mode == RECOVERING and (lane.rate or 0) < lane.overloaded_at
        slow = lane.ceiling is not None and (careful or lane.mode == FIXED)
        lane.grow_at = now + (RECOVERY_PERIOD if slow else 1.0)


def _accepted_per_second(lane: _Lane, now: float) -> float:
    """Answers accepted in the last whole second (or in this one, if more)."""
    second = int(now)
    if second == lane.second:
        return float(max(lane.accepted, lane.accepted_before))
    if second == lane.second + 1:
        return float(lane.accepted)
    return 0.0


class WriteGate:
    """What the driver asks right before a paced request's head goes on the wire (DESIGN 9:
    in any window of *w* seconds at most ``rate * w + 1`` requests of a kind): ``wait()``
    until it says 0, then write. Bound to one request's ticket and the flows' clock;
    :meth:`Budget.writing` says why.

    Example::

        while (seconds := gate.wait()) > 0:
            time.sleep(seconds)
        sock.sendall(head)          # at once: nothing may come between the gate and the wire
    """

    __slots__ = ("_budget", "_clock", "_ticket")

    def __init__(self, budget: Budget, ticket: Ticket, clock: Callable[[], float]) -> None:
        self._budget, self._ticket, self._clock = budget, ticket, clock

    def wait(self) -> float:
        """Seconds to wait before asking again; 0: write now."""
        return self._budget.writing(self._ticket, self._clock())


class Ended(TypedDict):
    """How a request ended, as every budget held elsewhere is told it (the keywords of
    :meth:`BudgetService.finished`; see :meth:`Budget.finished`): ``limited``, it met a 429 with
    the hint ``retry_after`` (seconds, or None); ``backoff``, the retry policy's first and
    longest backoff.

    Example::

        service.finished(ticket, **Ended(limited=True, retry_after=2.0, backoff=(1.0, 8.0)))
    """

    limited: bool
    retry_after: float | None
    backoff: tuple[float, float]


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

    async def finished(self, ticket: Hashable, **ended: Unpack[Ended]) -> None:
        """The request of ``ticket`` ended: its keywords are :class:`Ended`'s."""


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

    def finished(self, ticket: Hashable, **ended: Unpack[Ended]) -> None:
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
