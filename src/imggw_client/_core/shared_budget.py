"""The request budget shared through a store by many processes (DESIGN 16): the store's
script, its lanes' names, how its answers are read, and what a client does while the store is
away. Pure: the drivers (``_rate_store``) run the script and read the clock.

The store holds, for each (API key, gateway) and kind of request, one lane: a hash that one
server-side script reads and writes atomically, timed by the store's own clock (so machines
whose clocks disagree still agree on it). It follows the rules of the in-process
:class:`~imggw_client._core.budget.Budget` (DESIGN 9), with the same constants:

- **Places** are handed out in the order asked, spaced by the lane's interval (its pace plus
  :data:`~imggw_client._core.budget.GUARD`); a request goes only once its place has come *and*
  the last request of its kind went at least one interval ago, so in any window of *w* seconds
  at most ``rate * w + 1`` go out, all processes together, even when some wake late. That
  holds at the slots: a request that then waits for a pooled connection is not spaced again
  at its write, as an in-process budget's write gate does (that would cost a store round trip
  on the way to the wire).
- A **429** seen by any process pauses the lane for all (``Retry-After``, never less than the
  retry policy's growing backoff) and, when 429s are a real share of the lane's recent answers,
  lowers the shared pace, which recovers a step at a time while requests queue for it. A pause
  or a new pace starts a new *epoch*: places handed out before it are taken again, in the order
  their holders come back, after it.
- A kind with **no ceiling** (DESIGN 20) starts with a window of requests in flight, all
  processes together (each request a member of a sorted set beside the lane, forgotten after
  :data:`STALE` seconds if its process never says how it ended), widened by accepted answers
  up to ``MAX_WINDOW`` as the in-process budget's is. A lone 429 pauses the lane in doubt: a
  request sent after it that is accepted ends the pause (chance; the waiting ask again each
  round trip meanwhile), ``CONFIRM`` of them refused make it an overload, and the pace is then
  learned from the 429s as an in-process budget's is, unpaced again past ``FREE_RATE``. After
  a pause that ended on time, one request (a probe) goes before the others, and one taken only
  after such a pause paces the lane; a lone 429 on a paced lane well above what was accepted
  in the last second lowers its pace to that and holds it for ``RECOVERY_PERIOD``, as
  in-process. A limit with no ``Retry-After`` is learned as a window between bounds, and the
  pause after the next full run timed to it, as in-process (``Budget._timed``). The requests
  the window holds back ask again about once an answer, in no particular order.

The key never reaches the store: a lane is named by a hash of the key's slow fingerprint (PBKDF2,
as batch run ids are) and the gateway base URL, so reading the store allows no fast guessing.
"""

from __future__ import annotations

import hashlib
import math
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import budget as rules
from .budget import Budget, Ended, Ticket
from .config import RateLimit

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = [
    "SCRIPT", "Fallback", "StoreAnswerError", "StoreTicket", "flying_key", "lane_key", "read_take",
]  # fmt: skip

PREFIX = "imggw:budget:"
LANE_TTL = 86_400  # seconds a lane no process touched is kept: a day
REJOIN_AFTER = 5.0  # seconds between tries of a store that failed; requests go on meanwhile
STORE_TIMEOUT = 1.0  # the longest one call to the store may take (less if the request's is)
EPOCH_NONE = -1  # a ticket that holds no place in the store yet
STALE = 120.0  # seconds after which a request in flight no answer was heard of is forgotten


def flying_key(lane: str) -> str:
    """The store's name of a lane's requests in flight (a sorted set beside the lane)."""
    return f"{lane}:flying"


def lane_key(key_fingerprint: str, base_url: str, kind: str) -> str:
    """The store's name of one lane, from the API key's slow fingerprint (PBKDF2, as run ids
    use: ``BaseClient.key_fingerprint``) and the gateway, never from the key: whoever reads
    the store pays 100,000 rounds per guessed key, not one fast hash.

    Example::

        lane_key(client.key_fingerprint, "https://gw.example", "submit")
        # "imggw:budget:3f2a...:submit"
    """
    digest = hashlib.sha256(f"imggw-budget v2\n{base_url}\n{key_fingerprint}".encode())
    return f"{PREFIX}{digest.hexdigest()[:32]}:{kind}"


@dataclass(eq=False, slots=True)
class StoreTicket:
    """One request's place: in the store (``epoch``, ``slot`` on the store's clock) or, while
    the store is away, in the in-process budget (``local``). Hashable by identity."""

    kind: str
    epoch: int = EPOCH_NONE
    slot: float = 0.0
    sent: float | None = None  # on the store's clock: when the store let it go
    local: Ticket | None = None
    # Its name among the lane's requests in flight (lanes with no ceiling), drawn by the
    # driver at random, never derived from the request ("": not counted in flight).
    token: str = ""


class StoreAnswerError(Exception):
    """The store answered something that is not what the script returns."""


def read_take(ticket: StoreTicket, answer: object) -> float:
    """Reads the script's answer to ``take`` into ``ticket``; the seconds still to wait."""
    wait, epoch, slot, now = _numbers(answer, 4)
    if wait < 0 or epoch != int(epoch) or epoch < 0:
        raise StoreAnswerError("the store's answer is out of range")
    ticket.epoch, ticket.slot = int(epoch), slot
    if wait == 0:
        ticket.sent = now
    return wait


def read_ok(answer: object) -> None:
    """Reads the script's answer to ``release`` and ``finished``."""
    _numbers(answer, 1)


def _numbers(answer: object, count: int) -> list[float]:
    if not isinstance(answer, list) or len(answer) != count:
        raise StoreAnswerError("the store's answer is not the script's")
    values = []
    for item in answer:
        text = item.decode("ascii", "replace") if isinstance(item, bytes) else item
        try:
            value = float(text)
        except (TypeError, ValueError):
            raise StoreAnswerError("the store's answer is not numbers") from None
        if not math.isfinite(value):
            raise StoreAnswerError("the store's answer is not finite")
        values.append(value)
    return values


def place_args(op: str, limit: RateLimit, ticket: StoreTicket) -> list[str]:
    """The script's arguments for ``take`` (a new place, or the one the ticket holds) or
    ``release`` (the ticket's place, given back)."""
    return [op, _ceiling(limit, ticket.kind), str(ticket.epoch), repr(ticket.slot), ticket.token]


def finished_args(limit: RateLimit, ticket: StoreTicket, **ended: Unpack[Ended]) -> list[str]:
    retry_after, (first, longest) = ended["retry_after"], ended["backoff"]
    hint = "" if retry_after is None or not math.isfinite(retry_after) else repr(retry_after)
    sent = "" if ticket.sent is None else repr(ticket.sent)
    return ["finished", _ceiling(limit, ticket.kind), "1" if ended["limited"] else "0", hint,
            repr(float(first)), repr(float(longest)), sent, ticket.token]  # fmt: skip


def rate_of(limit: RateLimit, kind: str) -> float | None:
    """The configured ceiling of ``kind`` (submit, query), or None."""
    return limit.submits_per_second if kind == rules.SUBMIT else limit.queries_per_second


def interval(limit: RateLimit, kind: str) -> float:
    """The spacing of ``kind`` at its ceiling, with the budget's guard (0 without one)."""
    rate = rate_of(limit, kind)
    return 0.0 if rate is None else (1.0 + rules.GUARD) / rate


def _ceiling(limit: RateLimit, kind: str) -> str:
    rate = rate_of(limit, kind)
    return "" if rate is None else repr(float(rate))


class Fallback:
    """What a client does while its store is away: it paces itself with an in-process
    :class:`Budget` at the same rates, tries the store again every :data:`REJOIN_AFTER`
    seconds, and says so once each way (the drivers log the lines this returns).

    Example::

        fallback = Fallback(limit, "redis://cache:6379/0")
        if fallback.use_store(now): ...           # ask the store
        warning = fallback.failed(now, "ConnectionError")
    """

    def __init__(self, limit: RateLimit, label: str) -> None:
        self.budget = Budget(limit)
        self.label = label
        self._lock = threading.Lock()
        self._down_since: float | None = None
        self._retry_at = 0.0

    def use_store(self, now: float) -> bool:
        """Whether to ask the store now: it answered last time, or its retry is due."""
        with self._lock:
            if self._down_since is None:
                return True
            if now >= self._retry_at:
                self._retry_at = now + REJOIN_AFTER  # one caller tries; the others go on
                return True
            return False

    def failed(self, now: float, reason: str) -> str | None:
        """The store failed a call: the warning to log, the first time only."""
        with self._lock:
            self._retry_at = now + REJOIN_AFTER
            if self._down_since is not None:
                return None
            self._down_since = now
        return (
            f"rate store {self.label} not usable ({reason}): this process paces its requests "
            f"alone at the configured rates, and tries the store again every "
            f"{REJOIN_AFTER:g} s"
        )

    def answered(self, now: float) -> str | None:
        """The store answered: the note to log if it had been away."""
        with self._lock:
            if self._down_since is None:
                return None
            away, self._down_since = now - self._down_since, None
        return f"rate store {self.label} answers again after {away:.0f} s: budget shared again"


def reason(exc: BaseException) -> str:
    """A failure of the store in a few words: its class, never its text (which may quote the
    URL and its password)."""
    if isinstance(exc, StoreAnswerError):
        return str(exc)
    return type(exc).__name__


# One lane per key (KEYS[1]; its requests in flight, on a lane with no ceiling, in the sorted
# set KEYS[2]: member the ticket's token, score when it went); ARGV[1] the operation, ARGV[2]
# the caller's ceiling ("" none). Numbers are stored and returned as text: Lua's numbers are
# doubles, but Redis turns a number a script returns into an integer. The logic is the
# in-process Budget's (``budget.py`` is its source, with the same constants), less the order
# of the requests the start window holds back: they ask again about once an answer.
_SCRIPT = r"""
local key, op, ceiling = KEYS[1], ARGV[1], tonumber(ARGV[2])
local fkey = KEYS[2] or (key .. ':flying')
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local function num(v, d) local n = tonumber(v) if n == nil then return d end return n end
local function fmt(x) return string.format('%.6f', x) end
local f = redis.call('HMGET', key, 'mode', 'rate', 'tat', 'last', 'epoch', 'pu', 'pa',
  'strikes', 'dec', 'grow', 'over', 'queued', 'n', 'l', 'sec', 'acc', 'accb', 'win', 'rat',
  'rw', 'rtt', 'doubt', 'ds', 'ra', 'll', 'lp', 'la', 'ru', 'rn', 'rl', 'cy', 'clo', 'chi',
  'rg', 'ho')
local mode, rate = f[1], tonumber(f[2])
local tat, last, epoch = num(f[3], 0), num(f[4], -1e18), num(f[5], 0)
local pu, pa, strikes = num(f[6], 0), num(f[7], -1e18), num(f[8], 0)
local dec, grow, over = num(f[9], -1e18), num(f[10], 0), num(f[11], 0)
local queued, n, l = num(f[12], 0), num(f[13], 0), num(f[14], 0)
local sec, acc, accb = num(f[15], -1), num(f[16], 0), num(f[17], 0)
local win, rat, rw = num(f[18], {START_WINDOW}), num(f[19], -1e18), num(f[20], {START_WINDOW})
local rtt, doubt, ds = num(f[21], {RTT_GUESS}), num(f[22], 0), num(f[23], -1e18)
local ra, ll = num(f[24], 0), num(f[25], 0)
local lp, la = num(f[26], 0), num(f[27], -1e18)
-- the gateway's window as runs and pauses with no hint show it (INF: no upper bound yet)
local INF = 1e18
local ru, rn, rl, cy = num(f[28], -1e18), num(f[29], 0), num(f[30], 0), num(f[31], 0)
local clo, chi = num(f[32], 0), num(f[33], INF)
local rg, ho = num(f[34], 0), num(f[35], 0)
if mode == false or mode == 'free' or (ceiling and mode == 'starting') then
  if ceiling then mode, rate = 'fixed', ceiling else mode, rate = 'starting', nil end
end
if ceiling and rate and rate > ceiling then rate = ceiling end
if mode == 'fixed' and ceiling then rate = ceiling end
local function interval()
  if rate == nil then return 0 end
  return (1.0 / rate) * (1.0 + {GUARD})
end
local function anew() epoch = epoch + 1; tat = math.max(now, pu) end
local function accepted()  -- answers accepted in the last whole second (or this one, if more)
  if math.floor(now) == sec then return math.max(acc, accb)
  elseif math.floor(now) == sec + 1 then return acc end
  return 0
end
local flying = 0
if not ceiling then
  -- a process that died with requests in flight: forgotten after STALE seconds
  redis.call('ZREMRANGEBYSCORE', fkey, '-inf', now - {STALE})
  flying = redis.call('ZCARD', fkey)
end
-- When a pause with no hint ends (untl: the backoff's end): the first 429 after a run that
-- filled the window again is timed to the window learned; a probe refused raises its lower
-- bound and is followed at the upper one (budget.py: Budget._timed)
local function timed(sent, untl)
  if ru <= -1e17 then return untl end
  local offset, planned = sent - ru, INF
  if cy == 1 then
    if sent < pa then return untl end
    ho = ho + 1  -- a probe, refused
    clo = math.max(clo, offset)
    if clo >= chi then clo, chi = offset, INF end
    planned = chi
  else
    if rl > 0 and (rn < {FULL_RUN} * rl or rn > rl / {FULL_RUN}) then
      -- not the window full again: the run goes on, its later requests later by the pause
      if rn < rl then rg = rg + (untl - now) end
      return untl
    end
    cy, ho = 1, 0
    if chi - clo <= {CYCLE_TOLERANCE} * chi then planned = chi else planned = (clo + chi) / 2 end
  end
  if planned >= INF or offset >= planned + rg then return untl end
  return math.min(ru + planned + rg, now + {MAX_PAUSE})
end
local result
if op == 'take' then
  if now >= grow then
    if (not ceiling) and now < pu then
      queued, grow = 0, pu + 1.0  -- paused: requests queued behind it say nothing of the pace
    elseif (not ceiling) and chi < INF and now - ru < chi then
      queued, grow = 0, now + 1.0  -- a run within a window learned: the window is the limit
    else
      if queued == 1 and rate and mode == 'recovering' then
        if ceiling then
          if rate < over then rate = rate * (1.0 + {RECOVERY_STEP}) else rate = rate * 2.0 end
          if rate >= ceiling then rate, mode = ceiling, 'fixed' end
        elseif rate < {DECREASE} * lp or now - la >= {RECOVERY_PERIOD} then
          -- (not near the pace of a lone 429 met less than a recovery period ago)
          rate = rate * (1.0 + {REGAIN_STEP})
          if rate > {FREE_RATE} then rate, mode = nil, 'starting' end
        end
        anew()
      end
      queued = 0
      local careful = mode == 'recovering' and rate and rate < over
      if ceiling and (careful or mode == 'fixed') then grow = now + {RECOVERY_PERIOD}
      else grow = now + 1.0 end
    end
  end
  local i = interval()
  local held, slot = tonumber(ARGV[3]), tonumber(ARGV[4])
  if held ~= epoch or slot == nil then
    slot = math.max(now, pu)
    if i > 0 then
      slot = math.max(slot, tat, last + i)
      tat = slot + i
      if slot > math.max(now, pu) then queued = 1 end
    end
  end
  local ready = math.max(slot, pu)
  if i > 0 then ready = math.max(ready, last + i) end
  local wait = 0
  if mode == 'starting' and flying >= math.floor(win) and ready <= now then
    -- the start window is full: about until an answer frees a place
    wait = math.min(math.max({MIN_WAIT}, rtt / math.max(1, flying)), math.max({MIN_WAIT}, 2 * rtt))
  elseif ready > now then
    wait = ready - now
    if doubt == 1 and redis.call('ZCOUNT', fkey, '(' .. fmt(ds), '+inf') > 0 then
      -- a lone 429's pause, which a request sent after it in flight may still lift
      wait = math.min(wait, math.max({MIN_WAIT}, rtt))
    end
  elseif (not ceiling) and doubt == 1 and redis.call('ZCOUNT', fkey,
      '(' .. fmt(math.max(ds, now - math.max({PROBE_HOLD}, 4 * rtt))), '+inf') > 0 then
    -- a lone 429's pause is over and a probe is on its way: wait for its answer
    wait = math.max({MIN_WAIT}, rtt)
  else
    last = now
    if (not ceiling) and (ARGV[5] or '') ~= '' then redis.call('ZADD', fkey, now, ARGV[5]) end
    -- one woken more than an interval late moves the places after it on, one by one
    if i > 0 and tat < now + i then tat = now + i end
  end
  result = {fmt(wait), tostring(epoch), fmt(slot), fmt(now)}
elseif op == 'release' then
  local i = interval()
  if tonumber(ARGV[3]) == epoch and i > 0 then
    local slot = tonumber(ARGV[4])
    if slot and math.abs(tat - i - slot) < 1e-5 then tat = slot end
  end
  if (not ceiling) and (ARGV[5] or '') ~= '' then redis.call('ZREM', fkey, ARGV[5]) end
  result = {'1'}
elseif op == 'finished' then
  local limited, hint = ARGV[3] == '1', tonumber(ARGV[4])
  local first, longest, sent = num(ARGV[5], 1), num(ARGV[6], 30), num(ARGV[7], now)
  local used = 2 * flying >= win  -- half the window in flight: it was used
  if (not ceiling) and (ARGV[8] or '') ~= '' then redis.call('ZREM', fkey, ARGV[8]) end
  local keep = 1.0 - 1.0 / {RECENT}
  n = n * keep + 1
  if limited then l = l * keep + 1 else l = l * keep end
  local after = ll == 1
  if limited then ll = 1 else ll = 0 end
  if limited then
    local share = l / math.max(n, {MIN_ANSWERS})
    local lone, echo, fresh, capped = false, false, false, false
    if not ceiling then
      if doubt == 1 then
        if sent < ds then echo = true
        else
          ra = ra + 1
          if ra < {CONFIRM} then lone = true; strikes = strikes + 1
          else doubt = 0; capped = la >= ds end  -- a pace the lone 429 lowered already
        end
      elseif (not after) and share < {OVERLOAD_SHARE} and now >= pu then
        lone, fresh, doubt, ds, ra = true, true, 1, sent, 0
        if mode == 'recovering' and rate then
          -- a lone 429 on a paced lane well above what the gateway accepted lately: to that
          local cap = math.max(accepted(), {START_RATE} * {FIRST_DECREASE}, rate * {FIRST_DECREASE})
          if cap < rate * {DECREASE} then lp, la, rate = rate, now, cap; anew() end
        end
      end
    end
    if not echo then
      if sent >= pa and (fresh or not lone) then strikes = strikes + 1 end
      local pause = math.min(longest, first * 2 ^ math.min(math.max(strikes - 1, 0), 30))
      if hint then pause = math.max(pause, math.min(hint, {MAX_PAUSE}))
      elseif not ceiling then pause = math.min(pause, {NO_HINT_PAUSE}) end
      local untl = now + pause
      if (not ceiling) and (not hint) then untl = timed(sent, untl) end
      if untl > pu then pu, pa = untl, now; anew() end
      local overload = (not ceiling) or share >= {DECREASE_SHARE}
      if (not lone) and (not capped) and sent > dec and overload
          and now - dec >= {RECOVERY_PERIOD} then
        if mode == 'fixed' or mode == 'recovering' then
          over = rate
          rate = rate * math.max({FIRST_DECREASE}, math.min({DECREASE}, 1.0 - share))
        else
          over = math.max(accepted(), {START_RATE})
          rate = over * {FIRST_DECREASE}
        end
        rate = math.max({PACE_FLOOR}, rate)
        if ceiling then rate = math.min(rate, ceiling) end
        mode, dec, n, l = 'recovering', now, 0, 0
        if ceiling then grow = now + {RECOVERY_PERIOD} else grow = now + 1.0 end
        anew()
      end
    end
  else
    if sent >= pa then strikes = 0 end
    if not ceiling then
      if cy == 1 and sent >= pa then  -- a probe taken: its run's cycle ends, the next begins
        -- (a window learned only once CONFIRM probes of a cycle were refused: not by chance)
        if ho >= {CONFIRM} or chi < INF then chi = math.min(chi, sent - ru) end
        rl, ru, rn, cy, rg = rn, sent, 0, 0, 0
      elseif cy == 1 and doubt == 1 and sent > ds then cy = 0  -- taken amid the 429s: chance
      elseif ru <= -1e17 then ru = sent end
      rn = rn + 1
    end
    if doubt == 1 and sent > ds then
      doubt = 0  -- a request sent after the lone 429's was taken: it was chance ...
      if mode == 'starting' and now - pa >= math.max({MIN_ROUND}, 2 * rtt) then
        -- ... unless only a probe after a pause was: a limit, met at this speed: paced
        over = math.max(accepted(), {START_RATE})
        rate = math.max({PACE_FLOOR}, over * {FIRST_DECREASE})
        mode, dec, grow = 'recovering', now, now + 1.0
        anew()
      end
      if pu > now then pu = now; anew() end
    end
    if ARGV[7] ~= '' then rtt = rtt + (math.max(0, now - sent) - rtt) / 8 end
    if mode == 'starting' and used then
      if now - rat >= math.max({MIN_ROUND}, rtt) then rat, rw = now, win end
      win = math.min(win + 1, 2 * rw, {MAX_WINDOW})
    end
    local s = math.floor(now)
    if s ~= sec then
      if s == sec + 1 then accb = acc else accb = 0 end
      sec, acc = s, 0
    end
    acc = acc + 1
  end
  result = {'1'}
else
  return redis.error_reply('imggw: unknown operation')
end
local r = ''
if rate then r = fmt(rate) end
redis.call('HSET', key, 'mode', mode, 'rate', r, 'tat', fmt(tat), 'last', fmt(last),
  'epoch', tostring(epoch), 'pu', fmt(pu), 'pa', fmt(pa), 'strikes', tostring(strikes),
  'dec', fmt(dec), 'grow', fmt(grow), 'over', fmt(over), 'queued', tostring(queued),
  'n', fmt(n), 'l', fmt(l), 'sec', tostring(sec), 'acc', tostring(acc), 'accb', tostring(accb),
  'win', tostring(win), 'rat', fmt(rat), 'rw', tostring(rw), 'rtt', fmt(rtt),
  'doubt', tostring(doubt), 'ds', fmt(ds), 'ra', tostring(ra), 'll', tostring(ll),
  'lp', fmt(lp), 'la', fmt(la), 'ru', fmt(ru), 'rn', tostring(rn), 'rl', tostring(rl),
  'cy', tostring(cy), 'clo', fmt(clo), 'chi', fmt(chi), 'rg', fmt(rg), 'ho', tostring(ho))
redis.call('EXPIRE', key, {LANE_TTL})
if not ceiling then redis.call('EXPIRE', fkey, {LANE_TTL}) end
return result
"""


def _filled(template: str) -> str:
    """The script with the budget's constants written in: one source for both budgets."""
    numbers = {
        "GUARD": rules.GUARD, "START_RATE": rules.START_RATE, "FREE_RATE": rules.FREE_RATE,
        "PACE_FLOOR": rules.PACE_FLOOR, "FIRST_DECREASE": rules.FIRST_DECREASE,
        "DECREASE": rules.DECREASE, "RECOVERY_STEP": rules.RECOVERY_STEP,
        "RECOVERY_PERIOD": rules.RECOVERY_PERIOD, "RECENT": rules.RECENT,
        "DECREASE_SHARE": rules.DECREASE_SHARE, "MIN_ANSWERS": rules.MIN_ANSWERS,
        "MAX_PAUSE": rules.MAX_PAUSE, "START_WINDOW": rules.START_WINDOW,
        "MAX_WINDOW": rules.MAX_WINDOW, "MIN_ROUND": rules.MIN_ROUND,
        "RTT_GUESS": rules.RTT_GUESS, "MIN_WAIT": rules.MIN_WAIT,
        "REGAIN_STEP": rules.REGAIN_STEP, "OVERLOAD_SHARE": rules.OVERLOAD_SHARE,
        "CONFIRM": rules.CONFIRM, "STALE": STALE, "PROBE_HOLD": rules.PROBE_HOLD,
        "NO_HINT_PAUSE": rules.NO_HINT_PAUSE, "FULL_RUN": rules.FULL_RUN,
        "CYCLE_TOLERANCE": rules.CYCLE_TOLERANCE,
    }  # fmt: skip
    for name, value in numbers.items():
        template = template.replace("{" + name + "}", repr(float(value)))
    return template.replace("{LANE_TTL}", str(LANE_TTL))


SCRIPT = _filled(_SCRIPT)
