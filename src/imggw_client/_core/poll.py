"""The poll schedules of a wait: today's (a jittered, growing, capped interval) and the learned
one (DESIGN 15), behind one small interface, :class:`WaitSchedule`, that the wait flow drives;
:func:`plan_wait` picks one for a wait."""

from __future__ import annotations

import math
import random
from typing import Protocol

from .config import PollPolicy
from .durations import DurationModel, Kind

JITTER_LOW = 0.8  # each interval is scaled by a factor in [JITTER_LOW, 1.0]


def poll_interval(policy: PollPolicy, n: int, rng: random.Random) -> float:
    """The ``n``-th (0-based) sleep between queries; never more than ``max_interval``."""
    grown = policy.initial_interval * policy.multiplier ** min(n, 200)
    return min(policy.max_interval, grown) * rng.uniform(JITTER_LOW, 1.0)


# ---------------------------------------------------------------------------- learned schedule
#
# DESIGN 15. The promise, for every task at least as slow as the fastest of its kind that the
# model's window timed (saw running, then finished): a finished task is seen within
# ``multiplier - 1`` of its running time (15% with the default policy) plus one
# ``initial_interval``, and never more than ``max_interval`` after it finished. A task faster
# than that is seen at the wait's first query (and the model follows a speed-up within a few).
#
# Why it holds. The first query goes out at the model's ``first_query_at`` (times a factor
# <= 1): every task the window timed was seen running that late, so a task at least as slow as
# the fastest of them is still running then. After a query sent ``s`` seconds into the task's run
# that saw it active, the next answer comes back at most ``promise_gap(s)`` after that query
# went out: a task that finished in between, at ``d >= s``, is seen at most ``promise_gap(s)
# <= promise_gap(d)`` after it finished. The sleep is that gap less the two trips (the last
# query's answer, the next query's way there and back: twice the last round trip), times a
# share below 1 (LEARNED_JITTER) that leaves room for a late wake-up and spreads waits that
# started together.
#
# Why it never polls more than today's schedule. The sleep after the n-th answer is at least
# today's shortest n-th sleep (``JITTER_LOW * today_gap``, the least :func:`poll_interval`
# draws): query for query the learned wait is never ahead of today's at its busiest, over any
# span, whatever the model holds. That floor never breaks the promise on an instant gateway:
# each sleep being at least today's shortest, the learned wait's n-th query is at least
# ``JITTER_LOW`` as far into the task's run as today's unjittered one, so ``promise_gap`` there
# is at least ``JITTER_LOW * today_gap(n)`` (plus a share of ``initial_interval``).
#
# Why every sleep is jittered (DESIGN 18). Where the floor binds (a kind with no history, whose
# waits query from the start; ``initial_interval == max_interval``), a floor of today's gap
# itself would make every sleep that exact number, and waits started together would poll in
# lockstep. So a sleep is drawn between the floor and the promise's room; only where the
# promise cannot be kept even at the floor (round trips longer than its room) is it today's
# own jittered sleep.

FIRST_JITTER_LOW = 0.9  # the learned first query comes at a factor in [0.9, 1] of its time
LEARNED_JITTER = (0.94, 0.98)  # each learned sleep is this share of the promise's room


def promise_gap(policy: PollPolicy, elapsed: float) -> float:
    """The longest time from sending a query that saw a task active ``elapsed`` seconds into
    its run to the next answer that keeps the promise: ``min(max_interval, initial_interval +
    (multiplier - 1) * elapsed)``.
    """
    s = elapsed if math.isfinite(elapsed) and elapsed > 0 else 0.0
    grown = policy.initial_interval + (policy.multiplier - 1) * s
    return min(policy.max_interval, grown)


def today_gap(policy: PollPolicy, n: int) -> float:
    """Today's ``n``-th (0-based) sleep before jitter: the most :func:`poll_interval` draws."""
    return min(policy.max_interval, policy.initial_interval * policy.multiplier ** min(n, 200))


def planned_first(model: DurationModel, kind: Kind, now: float, rng: random.Random) -> float:
    """When (seconds after its submit) a wait's first learned query goes: the model's
    :meth:`~DurationModel.first_query_at`, times a factor in ``[FIRST_JITTER_LOW, 1]``.
    """
    return model.first_query_at(kind, now) * rng.uniform(FIRST_JITTER_LOW, 1.0)


def with_hint(scheduled: float, hint: float | None, latest: float) -> float:
    """A sleep that heeds a ``Retry-After`` hint on an active task within the schedule's room:
    never sooner than ``scheduled`` (a hint of 0 or less, or none, changes nothing), never
    later than ``latest`` (what the promise allows) or ``scheduled``, whichever is later.
    """
    if hint is None or not math.isfinite(hint) or hint <= scheduled:
        return scheduled
    return min(hint, max(latest, scheduled))


def next_poll(
    policy: PollPolicy,
    model: DurationModel,
    kind: Kind,
    *,
    started: float,
    now: float,
    polls: int,
    rng: random.Random,
    sent: float | None = None,
    retry_after: float | None = None,
) -> float:
    """The learned sleep before a wait's next query; ``polls`` is how many it already sent.

    Times are monotonic seconds: ``started`` when the task was submitted, ``now`` when the last
    answer came, ``sent`` when that query went out (``now`` if unknown). With ``polls == 0``,
    the sleep before the first query: until the model's first query time, at once without
    history. After an answer that saw the task active, the next sleep, heeding its
    ``retry_after`` (seconds). The ``learn=False`` schedule is :func:`poll_interval`.
    """
    elapsed = _elapsed(started, now)
    if polls <= 0:
        return _sleep_until(planned_first(model, kind, now, rng), elapsed)
    went = sent if sent is not None and math.isfinite(sent) and sent <= now else now
    trip = now - went
    trips = 2 * min(trip, policy.max_interval) if math.isfinite(trip) else 0.0
    room = promise_gap(policy, _elapsed(started, went)) - trips
    gap = today_gap(policy, polls - 1)
    floor, latest = JITTER_LOW * gap, room * LEARNED_JITTER[1]
    if latest > floor:
        scheduled = rng.uniform(max(room * LEARNED_JITTER[0], floor), latest)
    else:  # the trips leave the promise no room above today's shortest: today's own sleep
        scheduled = gap * rng.uniform(JITTER_LOW, 1.0)
    return with_hint(scheduled, retry_after, latest)  # a hint, never past the promise


def _elapsed(started: float, now: float) -> float:
    elapsed = now - started
    return elapsed if math.isfinite(elapsed) else 0.0


def _sleep_until(planned: float, elapsed: float) -> float:
    # A clock that jumped back must not stretch the wait past the planned time itself.
    return min(planned, max(planned - elapsed, 0.0))


def query_priority(chance: float | None, waited: float, max_interval: float) -> float:
    """Sort key of a query waiting for the request budget, smallest first: the one most likely
    to find its task finished goes first, and none waits more than ``max_interval`` behind
    others. ``chance`` is :meth:`DurationModel.probability_finished` (None: unknown, counted as
    even odds), ``waited`` the seconds it has been queued.

    The key is ``max_interval * (1 - chance) - waited``: a query overtakes another only if it
    came less than ``max_interval`` after it, so once a query has waited that long, nothing that
    came later goes before it. Sorting by ``queued_at + max_interval * (1 - chance)`` orders
    the same way, with a key that does not change while the query waits.
    """
    p = 0.5 if chance is None or not math.isfinite(chance) else min(1.0, max(0.0, chance))
    w = waited if not math.isnan(waited) else 0.0
    cap = max_interval if math.isfinite(max_interval) and max_interval > 0 else 0.0
    return cap * (1.0 - p) - max(w, 0.0)


class WaitSchedule(Protocol):
    """What the wait flow asks of a schedule: the sleep before its first query, the sleep after
    each answer that saw the task active, and, for the request budget, the chance that the
    task has finished. It is told when a query saw the task finished."""

    def first_sleep(self, now: float) -> float: ...

    def active(self, sent: float, now: float, retry_after: float | None = None) -> float: ...

    def finished(self, now: float) -> bool: ...

    def chance(self, now: float) -> float | None: ...


class TodayWait:
    """Today's schedule (``learn=False``, or a wait that does not know when its task started):
    :func:`poll_interval` after each answer; ``first`` is the sleep before the first query (a
    task just submitted is pending, and a query at once could only say so). A ``Retry-After``
    on an active task is heeded up to ``max_interval``.
    """

    def __init__(self, policy: PollPolicy, rng: random.Random, first: float = 0.0) -> None:
        self.policy = policy
        self.rng = rng
        self.first = first if math.isfinite(first) else 0.0
        self.polls = 1 if self.first > 0 else 0

    def first_sleep(self, now: float) -> float:
        return max(self.first, 0.0)

    def active(self, sent: float, now: float, retry_after: float | None = None) -> float:
        interval = poll_interval(self.policy, self.polls, self.rng)
        self.polls += 1
        return with_hint(interval, retry_after, self.policy.max_interval)

    def finished(self, now: float) -> bool:
        return False

    def chance(self, now: float) -> float | None:
        return None


def plan_wait(
    policy: PollPolicy,
    model: DurationModel,
    kind: Kind | None,
    *,
    started: float | None,
    accepted: float | None,
    now: float,
    rng: random.Random,
) -> WaitSchedule:
    """The schedule of one wait. ``started``: when its task started (monotonic seconds; None
    when unknown, as for a bare task id or a replayed submit); ``accepted``: when its submit
    was answered in this process (None: not here); ``kind``: the task's kind, None if unknown.
    A wait learns only when it knows its task's kind and start, and ``policy.learn`` is on.
    """
    if not policy.learn or kind is None or started is None:
        first = 0.0 if accepted is None else poll_interval(policy, 0, rng) - (now - accepted)
        return TodayWait(policy, rng, first)
    return LearnedWait(
        policy,
        model,
        kind,
        started=started,
        now=now,
        rng=rng,
        pending=poll_interval(policy, 0, rng),
    )


class LearnedWait:
    """One wait's learned schedule and what it saw, taught to the model when it ends.

    Not shared between threads: one per wait. ``started`` is when the task was submitted;
    ``now`` when the wait begins; ``pending`` how long after its start the task is known to be
    pending (a query sooner could only say so: today's first interval), so a wait whose kind
    has no history yet does not query before today's schedule would. The wait loop asks
    :meth:`first_sleep`, then after each query
    calls :meth:`active` (it returns the next sleep) or :meth:`finished`. Only a wait that
    began before its first learned query teaches the model about a task already finished at
    that query: a wait that began late knows nothing of when it finished.
    """

    def __init__(
        self,
        policy: PollPolicy,
        model: DurationModel,
        kind: Kind,
        *,
        started: float,
        now: float,
        rng: random.Random,
        pending: float = 0.0,
    ) -> None:
        self.policy = policy
        self.model = model
        self.kind = kind
        self.started = started
        self.rng = rng
        self.polls = 0
        self.pending = pending if math.isfinite(pending) and pending > 0 else 0.0
        self._since = _elapsed(started, now)
        # Replaced by first_sleep's own judgement; a wait that never asks it is in time only
        # if it began with the task.
        self._in_time = self._since <= policy.initial_interval
        self._last_active: float | None = None
        self._taught = False

    def first_sleep(self, now: float) -> float:
        """The sleep before the first query."""
        planned = max(planned_first(self.model, self.kind, now, self.rng), self.pending)
        elapsed = _elapsed(self.started, now)
        if self.pending > elapsed:
            self.polls = 1  # today's first sleep is taken: the floors go on from its second
        # A wait that began late queries at once and, if the task is done, learns nothing of
        # when it finished.
        self._in_time = self._since <= max(planned, self.policy.initial_interval)
        return _sleep_until(planned, elapsed)

    def active(self, sent: float, now: float, retry_after: float | None = None) -> float:
        """A query sent at ``sent`` saw the task active (answer at ``now``): the next sleep."""
        self.polls += 1
        seen = sent - self.started
        if math.isfinite(seen) and (self._last_active is None or seen > self._last_active):
            self._last_active = seen
        return next_poll(
            self.policy,
            self.model,
            self.kind,
            started=self.started,
            now=now,
            polls=self.polls,
            rng=self.rng,
            sent=sent,
            retry_after=retry_after,
        )

    def finished(self, now: float) -> bool:
        """The answer at ``now`` saw the task finished: teaches the model (once); True if
        this wait's observation was kept. A failed task's time need not be taught."""
        if self._taught:
            return False
        self._taught = True
        lower = self._last_active
        if lower is None:
            if not self._in_time:
                return False
            lower = 0.0
        return self.model.observe(self.kind, lower, now - self.started, now)

    def chance(self, now: float) -> float | None:
        """The chance that the task has finished by ``now``, for :func:`query_priority`."""
        return self.model.probability_finished(
            self.kind, now - self.started, now, active_at=self._last_active or 0.0
        )
