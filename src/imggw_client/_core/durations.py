"""How long tasks take, learned from what waits saw (DESIGN 15).

Pure: no I/O, no sleeping, no clock of its own (every call takes ``now``, monotonic seconds)
and no randomness. One lock makes a model safe to share by the threads of a ``Client`` and the
tasks of an ``AsyncClient``; nothing blocks while it is held, and every call is O(window).

A wait never sees a task finish, only two queries around it, so an observation is an
interval: the task's running time (counted from its submit) lies between ``lower``, when the
last query that saw it active went out, and ``upper``, when the answer of the first query that
saw it finished came back. A task already finished at its first query was last known active
at its submit: ``lower`` is 0.

Per kind (any hashable, the SDK uses ``(surface, resolution)``) the model keeps the last
``window`` observations, for ``max_kinds`` kinds at most (the least recently used kind goes
first), so memory is bounded whatever it is fed. Two things are read from them:

- :meth:`DurationModel.first_query_at`: the smallest ``lower`` of the window, once it holds
  ``min_history`` observations (0 before: query at once). Every task the window timed (saw
  running, then finished) ran at least that long, so a task at least as slow as the fastest of
  them is still running then: a first query there never comes after such a task finished.
  This is the one number the poll schedule's promise rests on, and it is deliberately not
  faded: taken from fewer or higher observations (a percentile, the last few) it misses tasks
  the window saw. A task never seen running (``lower`` 0: finished at its first query, faster
  than the window) counts as half the time it was seen finished, so a speed-up is followed
  within a few tasks.
- :meth:`DurationModel.probability_finished` and :meth:`DurationModel.quantile`: a mixture of
  the observations (each spread evenly over its interval) in which every older observation
  weighs ``2**(-1/half_life)`` of the next one, so a gateway that slows down or speeds up is
  followed within a few tasks. Estimates only: they order queries, they never delay one.

Garbage never raises and is never stored: a bound that is not a finite number, an upper end
below 0, past ``max_duration`` or below its lower end is dropped; a lower end below 0 counts as
0. Time only moves forward in the model (a clock that jumps back does not rewind it) and an
observation older than ``max_age`` seconds is forgotten, so after a clock jumps forward the
model knows nothing, which is safe: the schedule then polls as it would without it.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict, deque
from collections.abc import Hashable, Iterable

__all__ = ["DurationModel", "Kind"]

Kind = Hashable

WINDOW = 50  # the last 50 observed tasks of a kind: fewer let the promise slip (DESIGN 15)
# Below this many observations a kind's first query goes at once: the fastest of a handful of
# tasks is no guide (one in MIN_HISTORY + 1 of the next would be faster than all of them).
MIN_HISTORY = 10
MAX_KINDS = 64  # (surface, resolution) makes 6; the rest is room for other keys, not a leak
HALF_LIFE = 5.0  # observations: the estimates follow a change within a few tasks
MAX_AGE = 3600.0  # an hour-old duration says little about the gateway of now
MAX_DURATION = 7 * 86_400.0  # no image takes a week; a longer "duration" is garbage
# A bare duration from a ledger is when the task was seen finished; it finished earlier, by
# at most the poll schedule's own slack (15% plus one initial interval, 7% more for the
# schedule before DESIGN 15). Its lower end is taken well below that.
SEED_STRETCH = 1.25
# A task already finished at its first query (never seen running: lower end 0) was faster than
# the window, by how much nobody knows. It pulls the first query down to half the time it was
# seen finished: a gateway twice as fast is followed within one such task, one 2**k times as
# fast within k, while a lone fast task of a long lower tail costs the next waits a few
# queries, not a restart from nothing (DESIGN 15).
FASTER_SHARE = 0.5

_Record = tuple[float, float, float]  # lower, upper, when observed (the model's clock)


def _number(value: object) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return None
    return number if math.isfinite(number) else None


def _cdf(record: _Record, t: float) -> float:
    """The share of one observation's interval that lies at or below ``t``."""
    lower, upper, _ = record
    if t >= upper:
        return 1.0
    if t <= lower:
        return 0.0
    return (t - lower) / (upper - lower)


class DurationModel:
    """What a client knows of how long its tasks run, per kind, in bounded memory."""

    def __init__(
        self,
        *,
        window: int = WINDOW,
        min_history: int = MIN_HISTORY,
        max_kinds: int = MAX_KINDS,
        half_life: float = HALF_LIFE,
        max_age: float = MAX_AGE,
        max_duration: float = MAX_DURATION,
    ) -> None:
        if not (isinstance(window, int) and window >= 1):
            raise ValueError("window must be an integer >= 1")
        if not (isinstance(min_history, int) and 1 <= min_history <= window):
            raise ValueError("min_history must be an integer within 1..window")
        if not (isinstance(max_kinds, int) and max_kinds >= 1):
            raise ValueError("max_kinds must be an integer >= 1")
        for name, value in (
            ("half_life", half_life),
            ("max_age", max_age),
            ("max_duration", max_duration),
        ):
            if not (_number(value) is not None and value > 0):
                raise ValueError(f"{name} must be a finite number > 0")
        self.window = window
        self.min_history = min_history
        self.max_kinds = max_kinds
        self.max_age = float(max_age)
        self.max_duration = float(max_duration)
        self._decay: float = 0.5 ** (1.0 / float(half_life))
        self._lock = threading.Lock()
        self._kinds: OrderedDict[Hashable, deque[_Record]] = OrderedDict()
        self._clock = -math.inf

    # ------------------------------------------------------------------------ learning

    def observe(self, kind: Kind, lower: float, upper: float, now: float) -> bool:
        """Records that a task of ``kind`` ran between ``lower`` and ``upper`` seconds
        (from its submit); False when the interval was garbage and dropped.
        """
        bounds = self._clean(lower, upper)
        if bounds is None or not _hashable(kind):
            return False
        with self._lock:
            at = self._tick(now)
            history = self._history(kind, create=True)
            assert history is not None
            history.append((bounds[0], bounds[1], at))
        return True

    def seed(
        self,
        kind: Kind,
        durations: Iterable[float | tuple[float, float]],
        now: float,
        *,
        grace: float = 0.0,
    ) -> int:
        """Starts ``kind`` warm from what a ledger knows; returns how many seeds were kept.

        Each item is an interval ``(lower, upper)``, or a bare duration: how long after its
        submit a task was seen finished. A bare one finished earlier, by up to the schedule's
        slack, so it counts as ``((duration - grace) / 1.25, duration)``; pass the poll policy's
        ``initial_interval`` as ``grace``. Seeds rank as older than what the model already
        holds, and the newest ``window`` of them are kept.
        """
        slack = _number(grace)
        slack = max(slack, 0.0) if slack is not None else 0.0
        kept: deque[tuple[float, float]] = deque(maxlen=self.window)
        for item in durations:
            if isinstance(item, tuple) and len(item) == 2:
                bounds = self._clean(item[0], item[1])
            else:
                upper = _number(item)
                bounds = (
                    None if upper is None else self._clean((upper - slack) / SEED_STRETCH, upper)
                )
            if bounds is not None:
                kept.append(bounds)
        if not kept or not _hashable(kind):
            return 0
        with self._lock:
            at = self._tick(now)
            history = self._history(kind, create=True)
            assert history is not None
            if history:
                at = min(at, history[0][2])
            merged = [(lower, upper, at) for lower, upper in kept] + list(history)
            history.clear()
            history.extend(merged[-self.window :])
        return len(kept)

    # ------------------------------------------------------------------------ reading

    def first_query_at(self, kind: Kind, now: float) -> float:
        """The smallest lower end of the window (a task never seen running counts as half its
        upper end): no task timed lately finished sooner. 0.0 with fewer than ``min_history``
        observations, so a wait with no history queries at once.
        """
        if not _hashable(kind):
            return 0.0
        with self._lock:
            history = self._history(kind, now=now)
            if history is None or len(history) < self.min_history:
                return 0.0
            return min(lower if lower > 0 else FASTER_SHARE * upper for lower, upper, _ in history)

    def probability_finished(
        self, kind: Kind, elapsed: float, now: float, *, active_at: float = 0.0
    ) -> float | None:
        """The chance that a task of ``kind``, ``elapsed`` seconds after its submit and last
        seen active ``active_at`` seconds after it, has finished; None when nothing is known,
        or when it already ran longer than anything seen (history says nothing of it then).
        """
        t, a = _number(elapsed), _number(active_at)
        if t is None or not _hashable(kind):
            return None
        a = max(a if a is not None else 0.0, 0.0)
        if t <= a:
            return 0.0
        with self._lock:
            history = self._history(kind, now=now)
            if not history:
                return None
            done_by_t = done_by_a = total = 0.0
            weight = 1.0
            for record in reversed(history):
                total += weight
                done_by_t += weight * _cdf(record, t)
                done_by_a += weight * _cdf(record, a)
                weight *= self._decay
        left = total - done_by_a
        if left <= 1e-9 * total:
            return None
        return min(1.0, max(0.0, (done_by_t - done_by_a) / left))

    def quantile(self, kind: Kind, q: float, now: float) -> float | None:
        """The running time that a share ``q`` of the (faded) observations of ``kind`` did
        not exceed; None when nothing is known.
        """
        share = _number(q)
        if share is None or not _hashable(kind):
            return None
        share = min(1.0, max(0.0, share))
        with self._lock:
            history = self._history(kind, now=now)
            if not history:
                return None
            records = list(history)
        weights = [self._decay ** (len(records) - 1 - i) for i in range(len(records))]
        total = sum(weights)

        def below(t: float) -> float:
            return sum(w * _cdf(r, t) for w, r in zip(weights, records, strict=True)) / total

        low, high = 0.0, max(r[1] for r in records)
        for _ in range(60):
            middle = (low + high) / 2
            if below(middle) >= share:
                high = middle
            else:
                low = middle
        return high

    def observations(self, kind: Kind, now: float) -> list[tuple[float, float]]:
        """The intervals held for ``kind``, oldest first (for tests and diagnostics)."""
        if not _hashable(kind):
            return []
        with self._lock:
            history = self._history(kind, now=now)
            return [(r[0], r[1]) for r in history] if history else []

    def observation_count(self) -> int:
        """How many observations are stored, over all kinds: at most ``window * max_kinds``."""
        with self._lock:
            return sum(len(history) for history in self._kinds.values())

    def kind_count(self) -> int:
        """How many kinds are remembered: at most ``max_kinds``."""
        with self._lock:
            return len(self._kinds)

    # ------------------------------------------------------------------------ inside the lock

    def _clean(self, lower: object, upper: object) -> tuple[float, float] | None:
        low, high = _number(lower), _number(upper)
        if low is None or high is None or high < 0 or high > self.max_duration:
            return None
        low = max(low, 0.0)
        return (low, high) if low <= high else None

    def _tick(self, now: object) -> float:
        """The model's clock: the latest finite ``now`` seen; 0.0 before any."""
        moment = _number(now)
        if moment is not None and moment > self._clock:
            self._clock = moment
        return self._clock if math.isfinite(self._clock) else 0.0

    def _history(
        self, kind: Hashable, *, now: object = None, create: bool = False
    ) -> deque[_Record] | None:
        """The live observations of ``kind``, marked as recently used; expired ones go."""
        clock = self._tick(now) if now is not None else self._clock
        history = self._kinds.get(kind)
        if history is None:
            if not create:
                return None
            history = self._kinds[kind] = deque(maxlen=self.window)
            while len(self._kinds) > self.max_kinds:
                self._kinds.popitem(last=False)
        else:
            self._kinds.move_to_end(kind)
        horizon = clock - self.max_age
        while history and history[0][2] < horizon:
            history.popleft()
        return history


def _hashable(kind: object) -> bool:
    try:
        hash(kind)
    except TypeError:
        return False
    return True
