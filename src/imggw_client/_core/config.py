"""Client settings: the retry and poll policies, and resolution of arguments and environment."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

from .exceptions import ConfigurationError
from .rules import check_headers
from .spec import Surface as Surface  # its home is the wire spec; imported from here too

if TYPE_CHECKING:
    import httpx
    import httpx2

__all__ = [
    "PollPolicy",
    "RateLimit",
    "RetryPolicy",
    "Settings",
    "key_forgotten",
    "resolve_settings",
    "updated",
    "whole_request",
]

ENV_API_KEY = "IMGGW_API_KEY"
ENV_BASE_URL = "IMGGW_BASE_URL"
ENV_IDEMPOTENCY_WINDOW = "IMGGW_IDEMPOTENCY_WINDOW"
# How long a gateway remembers an idempotency key (seconds): the IETF draft's and Stripe's 24 h.
DEFAULT_IDEMPOTENCY_WINDOW = 86_400.0
SURFACES = ("alpha", "beta")


MISSING_API_KEY = "missing_api_key"
MISSING_BASE_URL = "missing_base_url"
USERINFO_IN_BASE_URL = "userinfo_in_base_url"
INVALID_IDEMPOTENCY_WINDOW = "invalid_idempotency_window"


def _require(ok: bool, what: str, code: str | None = None) -> None:
    if not ok:
        raise ConfigurationError(what, code=code)


def _positive(value: object) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """How failed requests are retried: capped exponential backoff with full jitter.

    ``max_attempts`` counts every attempt, the first included. Attempt *n* (1-based) that fails
    is followed by a sleep drawn uniformly from ``[0, min(max_backoff, initial_backoff *
    2**(n-1))]``. A ``Retry-After`` hint is honoured instead, up to ``max_retry_after`` seconds;
    a longer hint ends the retries with :class:`RateLimitError`.

    Example::

        client = Client(retry=RetryPolicy(max_attempts=10, max_backoff=30.0))
    """

    max_attempts: int = 6
    initial_backoff: float = 0.5
    max_backoff: float = 8.0
    max_retry_after: float = 60.0

    def __post_init__(self) -> None:
        _require(
            isinstance(self.max_attempts, int) and self.max_attempts >= 1,
            "RetryPolicy.max_attempts must be an integer >= 1",
        )
        _require(_positive(self.initial_backoff), "RetryPolicy.initial_backoff must be > 0")
        _require(
            _positive(self.max_backoff) and self.max_backoff >= self.initial_backoff,
            "RetryPolicy.max_backoff must be >= initial_backoff",
        )
        _require(
            self.max_retry_after == 0 or _positive(self.max_retry_after),
            "RetryPolicy.max_retry_after must be a finite number >= 0",
        )


@dataclass(frozen=True, kw_only=True)
class PollPolicy:
    """How a wait polls.

    With ``learn=False`` the *n*-th sleep (0-based) is ``min(max_interval, initial_interval *
    multiplier**n)`` scaled by a random factor in ``[0.8, 1.0]``, and never past the wait's
    deadline. The defaults come from ``bench/polling.py`` (tasks of 5 s to 10 min): a finished
    task is seen within 15% of its duration plus 1 s (p95), with 0.3x the polls of a fixed 2 s
    interval.

    With ``learn=True`` (the default) a client also learns how long its tasks take, per surface
    and resolution, and a wait that knows when its task was submitted (one on a
    :class:`Submission`, ``generate``, a batch line) sends no query while the task is almost
    surely still running, then queries where its finish is likely. It keeps a promise: a
    finished task is seen within ``multiplier - 1`` of its running time (15%) plus one
    ``initial_interval``, and never later than ``max_interval`` after it finished, for every
    task at least as slow as the fastest of its kind recently seen; a faster one is seen at the
    first query. It never queries more often than ``learn=False`` would.

    Example::

        client = Client(poll=PollPolicy(initial_interval=2.0, max_interval=15.0))
        client = Client(poll=PollPolicy(learn=False))   # the fixed schedule alone
    """

    initial_interval: float = 1.0
    max_interval: float = 30.0
    multiplier: float = 1.15
    learn: bool = True

    def __post_init__(self) -> None:
        _require(isinstance(self.learn, bool), "PollPolicy.learn must be True or False")
        _require(_positive(self.initial_interval), "PollPolicy.initial_interval must be > 0")
        _require(
            _positive(self.max_interval) and self.max_interval >= self.initial_interval,
            "PollPolicy.max_interval must be >= initial_interval",
        )
        _require(
            isinstance(self.multiplier, (int, float))
            and math.isfinite(self.multiplier)
            and self.multiplier >= 1,
            "PollPolicy.multiplier must be >= 1",
        )


MIN_RATE = 1 / 3600  # a budget of less than one request an hour is a mistake, not a budget


def _rate(value: object) -> bool:
    return value is None or (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= MIN_RATE
    )


@dataclass(frozen=True, kw_only=True)
class RateLimit:
    """A client-wide request budget: at most so many submits and queries per second.

    ``None`` means no fixed ceiling for that kind. One budget is shared by every operation of a
    client (all threads of a :class:`Client`, all tasks of an :class:`AsyncClient`); submits and
    queries are counted apart; every attempt counts, retries included; result downloads do not
    (they go to other hosts). Requests of a kind are spaced evenly, so in any window of *w*
    seconds at most ``rate * w + 1`` go out, and a budget set at a gateway's published limit
    meets no 429. With or without a ceiling, a 429 pauses that kind of request for the whole
    client and lowers its pace, which then recovers step by step.

    ``store`` shares the budget between processes (DESIGN 16): every client that names the
    same Redis store (``redis://HOST:PORT/DB``, ``rediss://`` for TLS, ``unix:///path``)
    shares one budget per API key and gateway, timed by the store's clock, so N processes
    together keep these rates. It needs the ``imggw[redis]`` extra. The key never reaches the
    store (lanes are named by a hash), and a store that cannot be reached never fails a
    request: the client paces itself alone, warns once, and rejoins when it answers.

    Example::

        # the provider behind surface A: 20 submits per 10 s, 10 queries per second
        client = Client(rate_limit=RateLimit(submits_per_second=2, queries_per_second=10))
        # the same, shared by every worker process of a web application
        shared = RateLimit(submits_per_second=2, queries_per_second=10,
                           store="redis://127.0.0.1:6379/0")
    """

    submits_per_second: float | None = None
    queries_per_second: float | None = None
    store: str | None = None

    def __post_init__(self) -> None:
        for name in ("submits_per_second", "queries_per_second"):
            _require(
                _rate(getattr(self, name)),
                f"RateLimit.{name} must be a number of requests per second of at least "
                "1/3600 (one an hour), or None",
            )
        if self.store is not None:
            problem = store_problem(self.store)
            _require(problem is None, f"RateLimit.store {problem}")

    def __repr__(self) -> str:
        store = "" if self.store is None else f", store={redact_store(self.store)!r}"
        return (
            f"RateLimit(submits_per_second={self.submits_per_second!r}, "
            f"queries_per_second={self.queries_per_second!r}{store})"
        )


STORE_SCHEMES = ("redis", "rediss", "unix")


def store_problem(url: object) -> str | None:
    """What is wrong with a rate store URL, or None. Shown to users: never the password (the
    URL only as :func:`redact_store` prints it).
    """
    from urllib.parse import urlsplit

    expected = "must be a redis://HOST:PORT/DB, rediss://HOST:PORT/DB or unix:///PATH URL"
    if not isinstance(url, str) or not url.isprintable() or any(c.isspace() for c in url):
        return expected
    shown = f"(got {redact_store(url)!r})"
    try:
        parts = urlsplit(url)
    except ValueError:
        return f"{expected} {shown}"
    if parts.scheme not in STORE_SCHEMES:
        return f"{expected} {shown}"
    if "@" not in parts.netloc and (
        "@" in parts.path or "@" in parts.fragment or _at_in_query_names(parts.query)
    ):
        # A password holding "/", "?" or "#" ends the URL's authority early (base64 has "/").
        return (
            f"{expected}: a password holding '/', '?' or '#' must be percent-encoded "
            f"(%2F, %3F, %23) {shown}"
        )
    try:
        _ = parts.port  # a port that is not a number (or out of range) raises here
    except ValueError:
        return f"{expected} {shown}"
    if parts.scheme == "unix":
        if not parts.path:
            return f"{expected}: the socket's path is missing"
        return _query_problem(parts.query, expected, shown)
    if not parts.hostname:
        return f"{expected}: the host is missing {shown}"
    db = parts.path.strip("/")
    if db and not db.isdigit():
        return f"{expected}: the database must be a number {shown}"
    return _query_problem(parts.query, expected, shown)


def _at_in_query_names(query: str) -> bool:
    # "redis://pa?ss@host/0" reads as host "pa", query "ss@host/0": an "@" in a query's name
    # (never in a value such as ?password=a@b) is the rest of a password holding "?".
    from urllib.parse import parse_qsl

    return any("@" in name for name, _ in parse_qsl(query, keep_blank_values=True))


def _query_problem(query: str, expected: str, shown: str) -> str | None:
    """A query redis-py would refuse (``?db=x``) as a problem, not its ValueError later."""
    try:
        from redis.connection import URL_QUERY_ARGUMENT_PARSERS as parsers
    except ImportError:  # the missing extra is said when the store is first used
        return None
    from urllib.parse import parse_qs

    from .text import printable

    for name, values in parse_qs(query).items():
        parser = parsers.get(name)
        if not callable(parser) or not values:
            continue
        try:
            parser(values[0])
        except (TypeError, ValueError):
            return f"{expected}: its query's {printable(name, 30)!r} is not valid {shown}"
    return None


def redact_store(url: str) -> str:
    """The store URL fit to print: everything between ``//`` and the host, and any query,
    blanked (``_core.text.redact_store_url``, the one function every message uses).
    """
    from .text import redact_store_url

    return redact_store_url(url)


@dataclass(frozen=True)
class Settings:
    """Everything a client needs, resolved once. ``api_key`` never appears in the repr, nor
    the values of ``headers`` (a caller's header may hold a secret too).

    ``timeout`` bounds each whole request, from sending it to its last byte; ``http_timeout``
    is the ``httpx.Timeout`` the caller gave, if any (its limits then also bound each phase,
    and ``timeout`` is the largest of them). ``headers`` are the caller's ``default_headers``,
    sent on every request to the gateway. ``idempotency_window`` is how long (seconds) the
    gateway remembers an idempotency key: a submit whose outcome is unknown and whose first send
    is older than that is never sent again on its own (see :func:`key_forgotten`)."""

    api_key: str
    base_url: str
    surface: Surface
    timeout: float
    retry: RetryPolicy
    poll: PollPolicy
    rate_limit: RateLimit = RateLimit()
    headers: tuple[tuple[str, str], ...] = ()
    http_timeout: httpx.Timeout | None = None
    idempotency_window: float = DEFAULT_IDEMPOTENCY_WINDOW

    def __repr__(self) -> str:
        headers = (
            f", headers=<{', '.join(name for name, _ in self.headers)}>" if self.headers else ""
        )
        return (
            f"Settings(base_url={self.base_url!r}, surface={self.surface!r}, "
            f"timeout={self.timeout!r}, retry={self.retry!r}, poll={self.poll!r}, "
            f"rate_limit={self.rate_limit!r}, idempotency_window={self.idempotency_window!r}"
            f"{headers})"
        )


def check_surface(surface: object) -> Surface:
    _require(surface in SURFACES, "surface must be 'alpha' or 'beta'")
    return cast(Surface, surface)


def resolve_settings(
    api_key: str | None,
    base_url: str | None,
    *,
    surface: str,
    timeout: float | httpx.Timeout | httpx2.Timeout,
    max_retries: int,
    retry: RetryPolicy | None,
    poll: PollPolicy | None,
    rate_limit: RateLimit | None = None,
    default_headers: Mapping[str, str] | None = None,
    idempotency_window: float | None = None,
) -> Settings:
    """Combines arguments with ``IMGGW_API_KEY`` / ``IMGGW_BASE_URL`` /
    ``IMGGW_IDEMPOTENCY_WINDOW``; raises ConfigurationError."""
    key = _checked_key(api_key if api_key is not None else os.environ.get(ENV_API_KEY))
    url = _checked_url(base_url if base_url is not None else os.environ.get(ENV_BASE_URL))
    whole, given = _timeouts(timeout)
    _, retry, poll = _policies(whole, max_retries, retry, poll)
    if rate_limit is None:
        rate_limit = RateLimit()
    _require(isinstance(rate_limit, RateLimit), "rate_limit must be a RateLimit")
    return Settings(
        api_key=key,
        base_url=url,
        surface=check_surface(surface),
        timeout=whole,
        retry=retry,
        poll=poll,
        rate_limit=rate_limit,
        headers=checked_headers({} if default_headers is None else default_headers),
        http_timeout=given,
        idempotency_window=_window(idempotency_window),
    )


def checked_headers(
    headers: Mapping[str, str], base: tuple[tuple[str, str], ...] = ()
) -> tuple[tuple[str, str], ...]:
    """``default_headers`` checked (:func:`~._core.rules.check_headers`), over ``base``: a
    name given again (in any case) replaces the one there."""
    problems = check_headers(headers, "default_headers")
    _require(not problems, "; ".join(f"{v.field} {v.rule}" for v in problems), "invalid_headers")
    merged = {name.lower(): (name, value) for name, value in base}
    merged.update({name.lower(): (name, value) for name, value in headers.items()})
    return tuple(merged.values())


def _checked_key(key: object) -> str:
    _require(bool(key), f"no API key: pass api_key= or set {ENV_API_KEY}", MISSING_API_KEY)
    # A key with whitespace or control characters would break (or forge) the header, and one
    # outside ASCII cannot be sent in it at all.
    _require(
        isinstance(key, str)
        and key.isascii()
        and key.isprintable()
        and not any(c.isspace() for c in key),
        "the API key must be printable ASCII without whitespace",
    )
    assert isinstance(key, str)
    return key


def _checked_url(url: object) -> str:
    _require(bool(url), f"no base URL: pass base_url= or set {ENV_BASE_URL}", MISSING_BASE_URL)
    _require(
        isinstance(url, str) and url.startswith(("http://", "https://")),
        "base_url must start with http:// or https://",
    )
    assert isinstance(url, str)
    # httpx would send user:password@ as Basic auth in place of our Bearer key, and the URL
    # is printed in errors and -v lines: refused, and never echoed.
    _require(
        not _has_userinfo(url),
        "base_url must not carry a user name or password (user:password@host, or any '@'): "
        "the API key is the only credential; remove that part",
        USERINFO_IN_BASE_URL,
    )
    _require(_valid_url(url), "base_url is not a valid URL (a scheme, a host, printable ASCII)")
    return url.rstrip("/")


def _timeouts(timeout: object) -> tuple[float, httpx.Timeout | None]:
    """The bound of each whole request, and the ``httpx.Timeout`` given (None for seconds).
    An ``httpx.Timeout`` bounds each phase as httpx does, and the whole request by the
    largest of its limits: ``httpx.Timeout(5)`` means what ``5`` does. Every limit must be a
    number: the SDK promises that every request ends."""
    if isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        _require(_positive(timeout), "timeout must be a positive number of seconds")
        return float(timeout), None
    import httpx  # only here: the light entry points never pay for it

    # httpx2's Timeout (its own class, the same fields) is known by name: httpx2 is imported
    # only by those who use it.
    kind = type(timeout)
    _require(
        isinstance(timeout, httpx.Timeout)
        or (kind.__name__ == "Timeout" and kind.__module__.partition(".")[0] == "httpx2"),
        "timeout must be a positive number of seconds or an httpx.Timeout",
    )
    timeout = cast(httpx.Timeout, timeout)
    limits = (timeout.connect, timeout.read, timeout.write, timeout.pool)
    _require(
        all(limit is not None and _positive(limit) for limit in limits),
        "every limit of an httpx.Timeout must be a positive number of seconds (none may be "
        "None: every request must end), e.g. httpx.Timeout(60, connect=5)",
    )
    return whole_request(timeout), timeout


def whole_request(timeout: float | httpx.Timeout) -> float:
    """The seconds a whole request may take under ``timeout`` as a client holds it (its
    ``timeout``): the number itself, or the largest limit of an ``httpx.Timeout``."""
    if isinstance(timeout, (int, float)):
        return float(timeout)
    limits = (timeout.connect, timeout.read, timeout.write, timeout.pool)
    return float(max(limit for limit in limits if limit is not None))


def _policies(
    timeout: float, max_retries: int | None, retry: RetryPolicy | None, poll: PollPolicy | None
) -> tuple[float, RetryPolicy, PollPolicy]:
    if retry is None:
        retry = RetryPolicy(max_attempts=_retries(5 if max_retries is None else max_retries) + 1)
    else:
        _require(isinstance(retry, RetryPolicy), "retry must be a RetryPolicy")
        _require(max_retries in (None, 5), "pass either retry= or max_retries=, not both")
    if poll is None:
        poll = PollPolicy()
    _require(isinstance(poll, PollPolicy), "poll must be a PollPolicy")
    return float(timeout), retry, poll


def updated(
    settings: Settings,
    *,
    api_key: str | None = None,
    base_url: str | None = None,
    surface: str | None = None,
    default_headers: Mapping[str, str] | None = None,
    timeout: float | httpx.Timeout | httpx2.Timeout | None = None,
    max_retries: int | None = None,
    retry: RetryPolicy | None = None,
    poll: PollPolicy | None = None,
    idempotency_window: float | None = None,
) -> Settings:
    """``settings`` with the given values replaced, checked as the constructor checks them
    (None: unchanged; the environment is not read again). ``default_headers`` are added to
    the ones there, a name given again replacing its value."""
    _require(retry is None or max_retries is None, "pass either retry= or max_retries=, not both")
    if max_retries is not None:
        retry = replace(settings.retry, max_attempts=_retries(max_retries) + 1)
    whole, given = (
        (settings.timeout, settings.http_timeout) if timeout is None else _timeouts(timeout)
    )
    new_timeout, new_retry, new_poll = _policies(
        whole,
        None,
        settings.retry if retry is None else retry,
        settings.poll if poll is None else poll,
    )
    changes: dict[str, Any] = {}
    if api_key is not None:
        changes["api_key"] = _checked_key(api_key)
    if base_url is not None:
        changes["base_url"] = _checked_url(base_url)
    if surface is not None:
        changes["surface"] = check_surface(surface)
    if default_headers is not None:
        changes["headers"] = checked_headers(default_headers, settings.headers)
    if idempotency_window is not None:
        changes["idempotency_window"] = _checked_window(idempotency_window)
    return replace(
        settings, timeout=new_timeout, http_timeout=given, retry=new_retry, poll=new_poll, **changes
    )


def _window(given: object) -> float:
    """The idempotency window: as given, else from ``IMGGW_IDEMPOTENCY_WINDOW``, else 24 h."""
    if given is not None:
        return _checked_window(given)
    named = os.environ.get(ENV_IDEMPOTENCY_WINDOW, "").strip()
    if not named:
        return DEFAULT_IDEMPOTENCY_WINDOW
    try:
        seconds = float(named)
    except ValueError:
        seconds = math.nan
    from .text import printable

    _require(
        _positive(seconds),
        f"{ENV_IDEMPOTENCY_WINDOW} must be a positive number of seconds, how long the gateway "
        f"remembers an idempotency key (got {printable(named, 40)!r}; unset: 86400)",
        INVALID_IDEMPOTENCY_WINDOW,
    )
    return seconds


def _checked_window(window: object) -> float:
    _require(
        not isinstance(window, bool) and _positive(window),
        "idempotency_window must be a positive, finite number of seconds: how long the "
        "gateway remembers an idempotency key (default 86400, 24 h)",
        INVALID_IDEMPOTENCY_WINDOW,
    )
    return float(cast(float, window))


def key_forgotten(first_sent: datetime | None, window: float, now: float) -> bool:
    """Whether a submit first sent at ``first_sent`` (an aware datetime; None: not known) may
    have been forgotten by the gateway ``now`` (epoch seconds), which remembers an idempotency
    key for ``window`` seconds: then sending its key again could bill a second task. The one
    rule for every resend of an unknown outcome (``unfinished()``, a collect, a batch).
    """
    if first_sent is None:  # no proof it is still remembered
        return True
    try:
        return now - first_sent.timestamp() > window
    except (OverflowError, OSError, ValueError):
        return True


def _retries(max_retries: object) -> int:
    _require(
        isinstance(max_retries, int) and not isinstance(max_retries, bool) and max_retries >= 0,
        "max_retries must be an int >= 0",
    )
    assert isinstance(max_retries, int)
    return max_retries


def _valid_url(url: str) -> bool:
    import httpx  # only here: light entry points that never make a client do not pay for it

    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, ValueError, TypeError):
        return False
    return bool(parsed.host) and url.isprintable()


def _has_userinfo(url: str) -> bool:
    """Whether the URL may carry a user name or password. Any ``@`` counts: a password holding
    ``/``, ``?`` or ``#`` (base64 has ``/``) ends the authority early and shows up in the path,
    and no gateway's base URL needs an ``@``."""
    return "@" in url
