"""The request budget shared through a store by many processes (DESIGN 16, 25): the store's
scripts, its lanes' names, and the steps of each operation. Pure: the driver (``_rate_store``)
runs the steps' scripts.

The store keeps, per (API key, gateway) and kind, only what processes must share: a hash of the
lane's :class:`~imggw_client._core.budget.Pacing`, its schedule (the next place's time, and an
*epoch* a new pace or pause starts: places handed out before it are taken again) and a sorted
set of the requests in flight, each on a short :data:`LEASE` its process renews, so the slots of
a process that dies free within seconds. Its scripts hold no policy and read the store's clock;
the policy is the in-process budget's (``budget.answered``, ``budget.grown``), run here on the
fields the store returns. A lane is named by a hash of the key's slow fingerprint, never the key.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import re
from collections.abc import Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import budget as rules
from .budget import Ended, Pacing, Ticket
from .config import RateLimit

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["SCRIPTS", "StoreAnswerError", "StoreTicket", "flying_key", "lane_key"]

PREFIX = "imggw:budget:"
LANE_TTL = 86_400  # seconds a lane no process touched is kept: a day
STORE_TIMEOUT = 1.0  # the longest one call to the store may take (less if the request's is)
EPOCH_NONE = -1  # a ticket that holds no place in the store yet
# Seconds a request in flight counts without word from its process (renewed every third of it):
# a process that dies frees its slots within 5 s; one stalled under 3 s by its GC keeps them.
LEASE = 5.0
# A store that says to wait longer than this, or paces slower than one request in it, holds a
# value no process wrote (a lane lives a day untouched): garbage, not a wait to sleep.
LONGEST_WAIT = 86_400.0
Steps = Generator[tuple[str, list[str]], object, Any]


def flying_key(lane: str) -> str:
    """The store's name of a lane's requests in flight (a sorted set beside the lane)."""
    return f"{lane}:flying"


def lane_key(key_fingerprint: str, base_url: str, kind: str) -> str:
    """The store's name of one lane, from the API key's slow fingerprint (PBKDF2, as run ids
    use) and the gateway: whoever reads the store pays 100,000 rounds per guessed key."""
    digest = hashlib.sha256(f"imggw-budget v3\n{base_url}\n{key_fingerprint}".encode())
    return f"{PREFIX}{digest.hexdigest()[:32]}:{kind}"


@dataclass(eq=False, slots=True)
class StoreTicket:
    """One request's place: in the store (``epoch``, ``slot`` on the store's clock) or, while
    it is away, in the in-process budget (``local``). Hashable by identity."""

    kind: str
    epoch: int = EPOCH_NONE
    slot: float = 0.0
    sent: float | None = None  # on the store's clock: when the store let it go
    local: Ticket | None = None
    not_before: float = 0.0  # on this process's clock: an isolated 429's hint, waited first
    token: str = ""  # its name among the lane's requests in flight, drawn at random
    # It waits for a place another request frees as it ends or goes (in the lane's window,
    # or this process's turn to ask at its own ceiling): woken then, not polled.
    full: bool = False


class StoreAnswerError(Exception):
    """The store answered something that is not what the script returns."""


# The Pacing fields the store keeps, in the order the scripts return them; those that count.
FIELDS = tuple(f.name for f in dataclasses.fields(Pacing) if f.name != "ceiling")
INTS = {f.name for f in dataclasses.fields(Pacing) if f.type == "int"}

# Numbers are stored and returned as text: Lua's numbers are doubles, but Redis turns a number
# a script returns into an integer. KEYS[1] is the lane, KEYS[2] its requests in flight
# (member: a ticket's token; score: when its lease ends).
_HEAD = r"""
local key, fkey = KEYS[1], KEYS[2]
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local function fmt(x) return string.format('%.6f', x) end
local function num(name, d) local n = tonumber(redis.call('HGET', key, name)) if n == nil then
  return d end return n end
redis.call('ZREMRANGEBYSCORE', fkey, '-inf', now)  -- leases that ended: their holders died
local flying = redis.call('ZCARD', fkey)
local function touch()
  redis.call('EXPIRE', key, {LANE_TTL}); redis.call('EXPIRE', fkey, {LANE_TTL})
end
"""
# A place: ARGV = epoch held, slot held, token, lease, then the lane's first fields (mode,
# rate) if it has none yet. Answers {wait, epoch, slot, now, growth due, window full}.
_TAKE = r"""
if redis.call('HEXISTS', key, 'mode') == 0 then
  redis.call('HSET', key, 'mode', ARGV[5], 'rate', ARGV[6], 'version', '0')
end
local rate, pu = tonumber(redis.call('HGET', key, 'rate')), num('paused_until', 0)
local tat, last, epoch = num('tat', 0), num('last', -1e18), num('epoch', 0)
local i = 0
if rate then i = (1.0 / rate) * (1.0 + {GUARD}) end
local slot = tonumber(ARGV[2])
if tonumber(ARGV[1]) ~= epoch or slot == nil then
  slot = math.max(now, pu)
  if i > 0 then
    slot = math.max(slot, tat, last + i)
    tat = slot + i
    if slot > math.max(now, pu) then redis.call('HSET', key, 'queued', '1') end
  end
end
local ready = math.max(slot, pu)
if i > 0 then ready = math.max(ready, last + i) end
local wait, full = 0, '0'
if (not rate) and flying >= num('window', {START_WINDOW}) and ready <= now then
  -- The window is full: an answer frees a place (the driver wakes then), else, at the latest,
  -- two round trips or the end of the first lease in flight.
  local first = redis.call('ZRANGE', fkey, 0, 0, 'WITHSCORES')
  local lease = tonumber(first[2]) or now
  wait = math.max({MIN_WAIT}, math.min(2 * num('rtt', {RTT_GUESS}), lease - now))
  full = '1'
elseif ready > now then
  wait = ready - now
else
  last = now
  if ARGV[3] ~= '' then redis.call('ZADD', fkey, now + tonumber(ARGV[4]), ARGV[3]) end
  if i > 0 and tat < now + i then tat = now + i end  -- one woken late moves the rest on
end
redis.call('HSET', key, 'tat', fmt(tat), 'last', fmt(last), 'epoch', tostring(epoch))
touch()
local due = '0'
if now >= num('grow_at', -1e18) then due = '1' end
return {fmt(wait), tostring(epoch), fmt(slot), fmt(now), due, full}
"""
# A place given back: ARGV = epoch, slot, token.
_RELEASE = r"""
local rate, tat = tonumber(redis.call('HGET', key, 'rate')), num('tat', 0)
if rate and tonumber(ARGV[1]) == num('epoch', 0) then
  local i, slot = (1.0 / rate) * (1.0 + {GUARD}), tonumber(ARGV[2])
  if slot and math.abs(tat - i - slot) < 1e-5 then redis.call('HSET', key, 'tat', fmt(slot)) end
end
if ARGV[3] ~= '' then redis.call('ZREM', fkey, ARGV[3]) end
return {'1'}
"""
# An answer counted (ARGV = token, '1' a 429, '0' accepted, '' count nothing: a read), as
# ``budget.count`` counts it. Answers the lane's fields, then version, now, flying, queued.
_ANSWER = r"""
if ARGV[1] ~= '' then redis.call('ZREM', fkey, ARGV[1]) end
if ARGV[2] ~= '' then
  local keep, limited = 1.0 - 1.0 / {RECENT}, ARGV[2] == '1'
  local refused = num('refused', 0) * keep + (limited and 1 or 0)
  redis.call('HSET', key, 'answers', fmt(num('answers', 0) * keep + 1), 'refused', fmt(refused))
  if not limited then
    local s, sec, acc = math.floor(now), num('second', 0), num('accepted', 0)
    if s ~= sec then
      local before = (s == sec + 1) and acc or 0
      redis.call('HSET', key, 'accepted_before', tostring(before), 'second', tostring(s))
      acc = 0
    end
    redis.call('HSET', key, 'accepted', tostring(acc + 1))
    redis.call('HINCRBY', key, 'taken', 1)
  end
end
local out = redis.call('HMGET', key, {FIELDS}, 'version', 'queued')
for n = 1, #out do if out[n] == false then out[n] = '' end end
table.insert(out, fmt(now))
table.insert(out, tostring(flying))  -- as it was before this answer
touch()
return out
"""
# What the policy decided, written only if no process wrote since it read (ARGV = version read,
# '1' if the schedule starts anew, then field, value, ...). Answers {1} written, {0} not.
_SET = r"""
if (redis.call('HGET', key, 'version') or '') ~= ARGV[1] then return {'0'} end
for n = 3, #ARGV, 2 do redis.call('HSET', key, ARGV[n], ARGV[n + 1]) end
redis.call('HSET', key, 'version', tostring((tonumber(ARGV[1]) or 0) + 1), 'queued', '0')
if ARGV[2] == '1' then
  redis.call('HSET', key, 'epoch', tostring(num('epoch', 0) + 1),
    'tat', fmt(math.max(now, num('paused_until', 0))))
end
return {'1'}
"""
# Leases renewed: ARGV = lease, then the tokens still in flight.
_RENEW = r"""
for n = 2, #ARGV do redis.call('ZADD', fkey, 'XX', now + tonumber(ARGV[1]), ARGV[n]) end
return {'1'}
"""


def _filled(body: str) -> str:
    """A script with the budget's constants written in: one source for every budget."""
    values = {name: repr(float(getattr(rules, name))) for name in _CONSTANTS}
    values |= {"LANE_TTL": str(LANE_TTL), "FIELDS": ", ".join(f"'{name}'" for name in FIELDS)}
    return re.sub(r"\{([A-Z_]+)\}", lambda name: values[name[1]], _HEAD + body)


_CONSTANTS = ("GUARD", "START_WINDOW", "RECENT", "RTT_GUESS", "MIN_WAIT")
_BODIES = {"take": _TAKE, "release": _RELEASE, "answer": _ANSWER, "set": _SET, "renew": _RENEW}
SCRIPTS = {name: _filled(body) for name, body in _BODIES.items()}

# Each operation is a generator of script calls (name, arguments), sent each call's answer, run
# by the driver; a bad answer raises StoreAnswerError.


def take_steps(limit: RateLimit, ticket: StoreTicket) -> Steps:
    """A place for ``ticket`` (a new one, or the one it holds): the seconds still to wait."""
    first = rules.lane_of(rate_of(limit, ticket.kind))
    rate = "" if first.rate is None else repr(first.rate)
    if first.ceiling is not None:
        ticket.token = ""  # a ceiling spaces its requests: no window, nothing counted in flight
    answer = yield (
        "take",
        [str(ticket.epoch), repr(ticket.slot), ticket.token, repr(LEASE), first.mode, rate],
    )
    wait, epoch, slot, now, due, full = _numbers(answer, 6)
    if not 0 <= wait <= LONGEST_WAIT or epoch != int(epoch) or epoch < 0:
        raise StoreAnswerError("the store's answer is out of range")
    ticket.epoch, ticket.slot, ticket.full = int(epoch), slot, bool(full)
    if wait == 0:
        ticket.sent = now
    if due:  # the pace's growth is due: the policy says what it is now
        pacing, version, now, _, queued = read_lane(limit, ticket.kind, (yield "answer", ["", ""]))
        old = dataclasses.replace(pacing)
        grew = rules.grown(pacing, now, queued=queued)
        yield "set", _set_args(version, grew, old, pacing, force=True)
    return wait


def finished_steps(limit: RateLimit, ticket: StoreTicket, **ended: Unpack[Ended]) -> Steps:
    """The request of ``ticket`` ended: the answer counted, then the policy's decision written
    (read again and decided anew if another process wrote between, for a 429). Returns an
    isolated 429's ``Retry-After``, which this process's next request of the kind waits."""
    limited, retry_after = ended["limited"], ended["retry_after"]
    if retry_after is not None and not math.isfinite(retry_after):
        retry_after = None
    step = "1" if limited else "0"
    for _ in range(3):
        answer = yield "answer", [ticket.token, step]
        pacing, version, now, flying, _ = read_lane(limit, ticket.kind, answer)
        step = ""  # counted once; a second read only reads
        old = dataclasses.replace(pacing)
        anew = rules.answered(
            pacing,
            now,
            sent=ticket.sent,
            limited=limited,
            retry_after=retry_after,
            backoff=ended["backoff"],
            used=2 * flying >= pacing.window,
        )
        owed = retry_after if limited and pacing.mode == rules.STARTING else None
        args = _set_args(version, anew, old, pacing)
        if not args:
            return owed
        written = _numbers((yield "set", args), 1)[0]
        if written or not limited:  # an accepted answer's small change lost: no matter
            return owed
    return None


def read_lane(limit: RateLimit, kind: str, answer: object) -> tuple[Pacing, str, float, int, bool]:
    """The lane's pacing as the answer script returned it, its version, the store's clock,
    the requests in flight before the answer, and whether requests queued for the pace."""
    if not isinstance(answer, list) or len(answer) != len(FIELDS) + 4:
        raise StoreAnswerError("the store's answer is not the script's")
    texts = [_text(item) for item in answer]
    pacing = rules.lane_of(rate_of(limit, kind))
    for name, text in zip(FIELDS, texts, strict=False):
        if name == "mode":
            if text not in ("", rules.FIXED, rules.STARTING, rules.RECOVERING):
                raise StoreAnswerError("the store's answer names no mode")
            pacing.mode = text or pacing.mode
        elif name in INTS and text:  # a count: whole and finite
            setattr(pacing, name, int(_number(text, finite=True)))
        elif text:  # else never written: the new lane's own value (but the rate: unpaced)
            setattr(pacing, name, _number(text))
        elif name == "rate":
            pacing.rate = None
    version, queued, now, flying = texts[len(FIELDS) :]
    flying_now, clock = _number(flying, finite=True), _number(now, finite=True)
    if (pacing.rate is not None and pacing.rate < 1 / LONGEST_WAIT) or (
        pacing.paused_until > clock + LONGEST_WAIT
    ):
        raise StoreAnswerError("the store's answer is out of range")
    return pacing, version, clock, int(flying_now), queued == "1"


def _set_args(
    version: str, anew: bool, old: Pacing, new: Pacing, *, force: bool = False
) -> list[str]:
    """The set script's arguments: the fields the policy changed (none if no change is worth a
    write: the smoothed round trip alone is not)."""
    changed = [name for name in FIELDS if getattr(new, name) != getattr(old, name)]
    if not force and not anew and changed in ([], ["rtt"]):
        return []
    args = [version, "1" if anew else "0"]
    for name in changed:
        value = getattr(new, name)
        args += [name, "" if value is None else value if isinstance(value, str) else repr(value)]
    return args


def one(name: str, args: list[str]) -> Steps:
    """The steps of a single call of a script that answers ``{1}``."""
    _numbers((yield name, args), 1)


def _text(item: object) -> str:
    return item.decode("ascii", "replace") if isinstance(item, bytes) else str(item)


def _number(item: object, *, finite: bool = False) -> float:
    try:
        value = float(_text(item))
    except ValueError:
        raise StoreAnswerError("the store's answer is not numbers") from None
    if math.isnan(value) or (finite and not math.isfinite(value)):
        raise StoreAnswerError("the store's answer is not a finite number")
    return value


def _numbers(answer: object, count: int) -> list[float]:
    if not isinstance(answer, list) or len(answer) != count:
        raise StoreAnswerError("the store's answer is not the script's")
    return [_number(item, finite=True) for item in answer]


def rate_of(limit: RateLimit, kind: str) -> float | None:
    """The configured ceiling of ``kind`` (submit, query), or None."""
    return limit.submits_per_second if kind == rules.SUBMIT else limit.queries_per_second


def interval(limit: RateLimit, kind: str) -> float:
    """The spacing of ``kind`` at its ceiling, with the budget's guard (0 without one)."""
    rate = rate_of(limit, kind)
    return 0.0 if rate is None else (1.0 + rules.GUARD) / rate
