"""The ``imggw_client`` logger: silent in an application that sets up no logging (a
``NullHandler``, so Python's last-resort handler never prints the SDK's warnings), and on
stderr when ``IMGGW_LOG`` asks for it, as ``OPENAI_LOG`` does for openai-python.

``IMGGW_LOG=debug`` shows every request the SDK sends (method, path, status, time), every
retry and every note; ``IMGGW_LOG=info`` the retries and notes. Read once, when the package is
imported. The handler writes to whatever ``sys.stderr`` is at the time; records still reach the
application's own handlers (propagation is left alone). No line it writes holds an API key:
the key of every client made while it is on, and ``IMGGW_API_KEY``, are blanked in the text,
tracebacks included. The key of every live client (of 8 characters or more, which does not
occur by chance) is also blanked in the records of this logger and of the HTTP libraries'
(below), whatever handler an application gives them: a gateway may echo a key in a response
header. A client's key is watched there until the client (and every ``with_options`` copy
using it) is closed or collected: a process serving many tenants pays for its live ones only.
A task's repr blanks its own client's key in its links whenever it is shown.

Nor does any line hold a result link's query string (a signature, an expiry, a key a gateway
put there): while a result is fetched, its link is watched (:func:`hiding`), and the records
of the HTTP libraries (httpx's ``HTTP Request: GET <url>`` line, httpcore's headers, hpack's)
and of this logger show it as scheme, host and path only, and any other URL without its query
(a redirect's next hop). Those filters sit on the libraries' loggers from import on and change
no record while nothing is being fetched.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import threading
from collections import Counter
from collections.abc import Iterator, Mapping

from ._core.text import KNOWN_KEYS, LONG_SECRET, SHORTEST_SECRET, KnownKeys, link_for_display

LOGGER = "imggw_client"
ENV_LOG = "IMGGW_LOG"
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO}
FORMAT = "[%(asctime)s %(levelname)s %(name)s] %(message)s"
ENV_API_KEY = "IMGGW_API_KEY"
# The loggers that may name a result link as it is fetched: httpx's and httpx2's request
# lines (on the library's own logger), httpcore's traces (a redirect's Location header among
# the response headers), hpack's encoded headers (``:path``, the query included).
HTTP_LOGGERS = (
    "httpx",
    "httpx2",
    "hpack.hpack",
    *(f"{core}.{part}" for core in ("httpcore", "httpcore2") for part in ("http11", "http2")),
)
# An absolute URL's query and fragment, in a line of the HTTP libraries while a link is fetched
# (a redirect's Location, not known as a link until its hop is sent).
_QUERY = re.compile(r"(https?://[^\s'\"<>?#]*)[?#][^\s'\"<>]*", re.IGNORECASE)

_fetching: Counter[str] = Counter()  # result links being fetched -> fetches of each
_fetching_lock = threading.Lock()
# The keys of live clients too short for KNOWN_KEYS (4 to 7 characters): IMGGW_LOG's lines are
# the SDK's own, where they are blanked too.
SHORT_KEYS = KnownKeys(SHORTEST_SECRET)


@contextlib.contextmanager
def hiding(url: object) -> Iterator[None]:
    """While the block runs, ``url`` shows in no log line but as ``link_for_display`` does."""
    link = str(url)
    with _fetching_lock:
        _fetching[link] += 1
    try:
        yield
    finally:
        with _fetching_lock:
            _fetching[link] -= 1
            if _fetching[link] <= 0:
                del _fetching[link]


def hidden(text: str) -> str:
    """``text`` with every link being fetched shown without its query, and so every URL."""
    with _fetching_lock:
        links = list(_fetching)
    for link in links:
        if link in text:
            text = text.replace(link, link_for_display(link))
        query = link.partition("?")[2].partition("#")[0]
        if query:  # a path with its query: hpack's ``:path``
            text = text.replace(f"?{query}", "")
    return _QUERY.sub(r"\1", text)


class HideLinks(logging.Filter):
    """Rewrites a record that holds a result link being fetched (see :func:`hiding`) or the
    key of a client of this process (a gateway may echo it in a header or a status word)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not _fetching and not KNOWN_KEYS:  # nothing to hide: no line is formatted here
            return True
        try:
            text = record.getMessage()
        except Exception:
            return True  # a record that cannot be formatted is its handler's to report
        shown = KNOWN_KEYS.blank(hidden(text) if _fetching else text)
        if shown != text:
            record.msg, record.args = shown, None
        return True


_hide_links = HideLinks()


class StderrHandler(logging.Handler):
    """``IMGGW_LOG``'s handler: each record on the current ``sys.stderr``, every live client's
    key blanked (a traceback's too), shorter ones included."""

    def __init__(self, level: int) -> None:
        super().__init__(level)
        # The key of every client made while it is on, kept while it is (a debugging aid): a
        # line written after the client closed (the application's own) blanks it too.
        self.keys = KnownKeys(SHORTEST_SECRET)
        self.setFormatter(logging.Formatter(FORMAT))

    def format(self, record: logging.LogRecord) -> str:
        text = self.keys.blank(KNOWN_KEYS.blank(super().format(record)))  # the longer first
        return SHORT_KEYS.blank(text)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            print(self.format(record), file=sys.stderr, flush=True)
        except Exception:
            self.handleError(record)


_handler: StderrHandler | None = None


def setup(environ: Mapping[str, str] = os.environ) -> StderrHandler | None:
    """Gives the logger its ``NullHandler`` (once), and the stderr handler ``IMGGW_LOG``
    asks for (``debug`` or ``info``, in any case; another value is said once, on the logger
    itself, and otherwise ignored). Returns that handler, or None."""
    global _handler
    logger = logging.getLogger(LOGGER)
    if not any(type(h) is logging.NullHandler for h in logger.handlers):
        logger.addHandler(logging.NullHandler())
    for name in (LOGGER, *HTTP_LOGGERS):
        logging.getLogger(name).addFilter(_hide_links)  # a Filterer holds each filter once
    asked = environ.get(ENV_LOG, "").strip().lower()
    level = LEVELS.get(asked)
    if level is None:
        if asked:
            logger.warning("%s=%r is not one of debug, info: ignored", ENV_LOG, asked[:20])
        return None
    if _handler is None:
        _handler = StderrHandler(level)
        _handler.addFilter(_hide_links)  # every record it writes, a child logger's too
        logger.addHandler(_handler)
    _handler.setLevel(level)
    watch_key(environ.get(ENV_API_KEY, ""))
    logger.setLevel(level)
    return _handler


def watch_key(key: str) -> None:
    """Blanks ``key`` in every line ``IMGGW_LOG`` writes (tracebacks included), and, when it
    does not occur by chance (8 characters or more), in every record of the SDK's and the HTTP
    libraries' loggers and in a task's repr: a shorter one could be a word of any line (a key
    "http" would blank every link), and of any test's. Until :func:`unwatch_key` is called as
    often (a client watches its key until it is closed or collected); ``IMGGW_LOG``'s lines
    blank it as long as they are written."""
    if _handler is not None:
        _handler.keys.hold(key)
    (KNOWN_KEYS if len(key) >= LONG_SECRET else SHORT_KEYS).hold(key)


def unwatch_key(key: str) -> None:
    """One :func:`watch_key` of ``key`` ends: the last one stops blanking it."""
    (KNOWN_KEYS if len(key) >= LONG_SECRET else SHORT_KEYS).release(key)
