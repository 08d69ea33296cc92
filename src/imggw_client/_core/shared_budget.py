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
  at most ``rate * w + 1`` go out, all processes together, even when some wake late.
- A **429** seen by any process pauses the lane for all (``Retry-After``, never less than the
  retry policy's growing backoff) and, when 429s are a real share of the lane's recent answers,
  lowers the shared pace, which recovers a step at a time while requests queue for it. A pause
  or a new pace starts a new *epoch*: places handed out before it are taken again, in the order
  their holders come back, after it.
- A kind with **no ceiling** goes unpaced until the gateway overloads; its pace is then learned
  from the 429s, as an in-process budget's is, and dropped again past ``FREE_RATE``.

The key never reaches the store: a lane is named by a hash of the key's slow fingerprint (PBKDF2,
as batch run ids are) and the gateway base URL, so reading the store allows no fast guessing.
"""

from __future__ import annotations

import hashlib
import math
import threading
from dataclasses import dataclass

from .._config import RateLimit
from . import budget as rules
from .budget import Budget, Ticket

__all__ = ["SCRIPT", "Fallback", "StoreAnswerError", "StoreTicket", "lane_key", "read_take"]

PREFIX = "imggw:budget:"
LANE_TTL = 86_400  # seconds a lane no process touched is kept: a day
REJOIN_AFTER = 5.0  # seconds between tries of a store that failed; requests go on meanwhile
STORE_TIMEOUT = 1.0  # the longest one call to the store may take (less if the request's is)
EPOCH_NONE = -1  # a ticket that holds no place in the store yet


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
    return [op, _ceiling(limit, ticket.kind), str(ticket.epoch), repr(ticket.slot)]


def finished_args(
    limit: RateLimit,
    ticket: StoreTicket,
    *,
    limited: bool,
    retry_after: float | None,
    backoff: tuple[float, float],
) -> list[str]:
    hint = "" if retry_after is None or not math.isfinite(retry_after) else repr(retry_after)
    sent = "" if ticket.sent is None else repr(ticket.sent)
    return ["finished", _ceiling(limit, ticket.kind), "1" if limited else "0", hint,
            repr(float(backoff[0])), repr(float(backoff[1])), sent]  # fmt: skip


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


# One lane per key (KEYS[1]); ARGV[1] the operation, ARGV[2] the caller's ceiling ("" none).
# Numbers are stored and returned as text: Lua's numbers are doubles, but Redis turns a
# number a script returns into an integer.
_SCRIPT = r"""
local key, op, ceiling = KEYS[1], ARGV[1], tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local function num(v, d) local n = tonumber(v) if n == nil then return d end return n end
local function fmt(x) return string.format('%.6f', x) end
local f = redis.call('HMGET', key, 'mode', 'rate', 'tat', 'last', 'epoch', 'pu', 'pa',
  'strikes', 'dec', 'grow', 'over', 'queued', 'n', 'l', 'sec', 'acc', 'accb')
local mode, rate = f[1], tonumber(f[2])
local tat, last, epoch = num(f[3], 0), num(f[4], -1e18), num(f[5], 0)
local pu, pa, strikes = num(f[6], 0), num(f[7], -1e18), num(f[8], 0)
local dec, grow, over = num(f[9], -1e18), num(f[10], 0), num(f[11], 0)
local queued, n, l = num(f[12], 0), num(f[13], 0), num(f[14], 0)
local sec, acc, accb = num(f[15], -1), num(f[16], 0), num(f[17], 0)
if mode == false or (ceiling and mode == 'free') then
  if ceiling then mode, rate = 'fixed', ceiling else mode, rate = 'free', nil end
end
if ceiling and rate and rate > ceiling then rate = ceiling end
if mode == 'fixed' and ceiling then rate = ceiling end
local function interval()
  if rate == nil then return 0 end
  return (1.0 / rate) * (1.0 + {GUARD})
end
local function anew() epoch = epoch + 1; tat = math.max(now, pu) end
local result
if op == 'take' then
  if now >= grow then
    if queued == 1 and rate and mode == 'recovering' then
      local careful = rate < over
      if careful then rate = rate * (1.0 + {RECOVERY_STEP}) else rate = rate * 2.0 end
      if ceiling and rate >= ceiling then rate, mode = ceiling, 'fixed'
      elseif (not ceiling) and rate > {FREE_RATE} then rate, mode = nil, 'free' end
      anew()
    end
    queued = 0
    local careful = mode == 'recovering' and rate and rate < over
    if careful or mode == 'fixed' then grow = now + {RECOVERY_PERIOD} else grow = now + 1.0 end
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
  if ready > now then
    wait = ready - now
  else
    last = now
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
  result = {'1'}
elseif op == 'finished' then
  local limited, hint = ARGV[3] == '1', tonumber(ARGV[4])
  local first, longest, sent = num(ARGV[5], 1), num(ARGV[6], 30), num(ARGV[7], now)
  local keep = 1.0 - 1.0 / {RECENT}
  n = n * keep + 1
  if limited then l = l * keep + 1 else l = l * keep end
  if limited then
    if sent >= pa then strikes = strikes + 1 end
    local pause = math.min(longest, first * 2 ^ math.min(strikes - 1, 30))
    if hint then pause = math.max(pause, math.min(hint, {MAX_PAUSE})) end
    if now + pause > pu then pu, pa = now + pause, now; anew() end
    local share = l / math.max(n, {MIN_ANSWERS})
    if sent > dec and share >= {DECREASE_SHARE} and now - dec >= {RECOVERY_PERIOD} then
      if mode == 'fixed' or mode == 'recovering' then
        over = rate
        rate = rate * math.max({FIRST_DECREASE}, math.min({DECREASE}, 1.0 - share))
      else
        local accepted = 0
        if math.floor(now) == sec then accepted = math.max(acc, accb)
        elseif math.floor(now) == sec + 1 then accepted = acc end
        over = math.max(accepted, {START_RATE})
        rate = over * {FIRST_DECREASE}
      end
      rate = math.max({PACE_FLOOR}, rate)
      if ceiling then rate = math.min(rate, ceiling) end
      mode, dec, grow, n, l = 'recovering', now, now + {RECOVERY_PERIOD}, 0, 0
      anew()
    end
  else
    if sent >= pa then strikes = 0 end
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
  'n', fmt(n), 'l', fmt(l), 'sec', tostring(sec), 'acc', tostring(acc), 'accb', tostring(accb))
redis.call('EXPIRE', key, {LANE_TTL})
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
        "MAX_PAUSE": rules.MAX_PAUSE,
    }  # fmt: skip
    for name, value in numbers.items():
        template = template.replace("{" + name + "}", repr(float(value)))
    return template.replace("{LANE_TTL}", str(LANE_TTL))


SCRIPT = _filled(_SCRIPT)
