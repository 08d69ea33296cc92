"""Text and JSON that may come from anyone, read and shown safely.

A task state, an error message or a result URL is chosen by whoever runs the gateway. Printed
raw, an ESC, OSC, BEL, CR or C1 code in it can retitle, clear or rewrite the user's terminal, and
a bidirectional override can make a line read differently from what it is. Everything from the
gateway that reaches a terminal or a log passes :func:`printable`.

JSON is read by the one :func:`json_loads` every part of the project uses, and written strict
by :func:`strict_json` (never ``NaN`` or ``Infinity``, which strict parsers refuse).
``json.loads`` can raise ``RecursionError`` on deeply nested input (``[[[[...]]]]``), which is
not a ``ValueError`` and slips past every ``except ValueError``; it also keeps the last of
duplicate object keys silently. Here both become a ``ValueError``: what a proxy checked and
what a server acts on can never differ, and garbage is always just garbage.
"""

from __future__ import annotations

import json
import math
import threading
from typing import Any

__all__ = [
    "KNOWN_KEYS",
    "KnownKeys",
    "REDACTED",
    "blank",
    "finite",
    "json_loads",
    "link_for_display",
    "link_origin",
    "printable",
    "redact_store_url",
    "strict_json",
]


REDACTED = "[redacted]"
# A key this long is blanked wherever it shows in a gateway's words (messages, codes, status
# words, a redirect's target, a result host) and in shown links, as the command line's lines
# blank it: a shorter one cannot be told from ordinary words. In a link, a key under 8
# characters is one only as a whole path segment or query value (``surfaces.carries_secret``).
SHORTEST_SECRET = 4
# A key this long does not occur by chance: where text that is not a gateway's answer to the
# client is blanked (every log record, a task's repr), only such keys are.
LONG_SECRET = 8


class KnownKeys:
    """The API keys of this process's live clients: what a task's repr blanks in its links,
    and the loggers' filters in every record (``_logs``). Each key is held by every client
    (and ``with_options`` copy) that uses it, and let go when the last of them is closed or
    collected: a web application making a client per tenant or per request keeps only its
    live tenants' keys, not every key it ever saw.

    Blanking costs one look per key, or one per character of the text, whichever is fewer:
    with 10,000 live keys a log line is read once, not 10,000 times. Holding and letting go
    take a lock; blanking reads a snapshot and takes none (every log record passes here).
    """

    def __init__(self, shortest: int) -> None:
        self.shortest = shortest  # the fewest characters of a key held
        self._count: dict[str, int] = {}  # key -> clients holding it
        self._by_head: dict[str, frozenset[str]] = {}  # its first ``shortest`` characters
        self._lock = threading.Lock()

    def hold(self, key: str) -> None:
        """One more client uses ``key`` (ignored when shorter than ``shortest``)."""
        if len(key) < self.shortest:
            return
        with self._lock:
            held = self._count.get(key, 0)
            self._count[key] = held + 1
            if not held:
                head = key[: self.shortest]
                self._by_head[head] = self._by_head.get(head, frozenset()) | {key}

    def release(self, key: str) -> None:
        """A client that held ``key`` is closed or gone; the last one lets it go."""
        with self._lock:
            held = self._count.get(key, 0)
            if held > 1:
                self._count[key] = held - 1
                return
            if not held:
                return
            del self._count[key]
            head = key[: self.shortest]
            left = self._by_head[head] - {key}
            if left:
                self._by_head[head] = left
            else:
                del self._by_head[head]

    def __len__(self) -> int:
        return len(self._count)

    def __contains__(self, key: object) -> bool:
        return key in self._count

    def blank(self, text: str) -> str:
        """``text`` with every key held blanked (the longest first: a key inside another)."""
        count = self._count
        if not count:
            return text
        if len(count) <= len(text):
            found = [key for key in list(count) if key in text]  # a snapshot, taken at once
        else:  # fewer characters to read than keys to look for
            width, heads = self.shortest, self._by_head
            found = [
                key
                for start in range(len(text) - width + 1)
                for key in heads.get(text[start : start + width], ())
                if text.startswith(key, start)
            ]
        if len(found) > 1:
            found.sort(key=len, reverse=True)
        for key in found:
            text = text.replace(key, REDACTED)
        return text


# The API keys of this process's live clients, of LONG_SECRET characters or more.
KNOWN_KEYS = KnownKeys(LONG_SECRET)


def blank(text: str, secrets: tuple[str, ...] | set[str]) -> str:
    """``text`` with every secret of :data:`SHORTEST_SECRET` characters or more blanked: what a
    gateway's words must pass before they are shown, kept or logged."""
    for secret in list(secrets):
        if len(secret) >= SHORTEST_SECRET:
            text = text.replace(secret, REDACTED)
    return text


def printable(text: object, limit: int | None = None) -> str:
    """``text`` with every non-printable character (controls, C1 codes, format characters such
    as bidi overrides, line and paragraph separators) replaced by its visible escape, and cut
    to ``limit`` characters (with an ellipsis) when given.

    Example::

        printable("done\\x1b]0;owned\\x07")     # 'done\\\\x1b]0;owned\\\\x07'
    """
    value = text if isinstance(text, str) else str(text)
    if not value.isprintable():
        value = "".join(c if c.isprintable() else _escape(c) for c in value)
    if limit is not None and len(value) > limit:
        value = value[: max(0, limit - 1)] + "…"
    return value


def _escape(char: str) -> str:
    return char.encode("unicode_escape").decode("ascii")


def redact_store_url(url: object) -> str:
    """A store URL (``redis://``, ``rediss://``, ``unix://``) fit to print: everything between
    ``//`` and the host blanked whatever its form (a password in the user position, one holding
    ``/``, ``#``, ``?`` or ``@``, percent-encoded or not), and any query or fragment blanked
    (redis-py reads ``?password=``). Read by hand, never by a URL parser: a parser splits a
    password at its ``/`` or ``#`` and would show the rest as a path.
    """
    text = url if isinstance(url, str) else str(url)
    scheme, slashes, rest = text.partition("//")
    if not slashes:  # no authority at all: nothing tells a password from the rest
        return "***"
    marks = [i for i in (rest.find("?"), rest.find("#")) if i >= 0]
    query = min(marks) if marks else len(rest)
    head, tail = rest[:query], "?***" if query < len(rest) else ""
    if "@" in head:  # the last "@" before any query ends the userinfo ("/" in it or not)
        head = "***@" + head.rpartition("@")[2]
    elif "@" in rest:
        # An "@" only after a "?" or "#": a query value holding one, or a password holding
        # "?" or "#" (then what precedes is part of it). Nothing can be shown safely.
        head = "***"
    return printable(f"{scheme}//{head}{tail}", 200)


def link_for_display(url: object) -> str:
    """A result link fit for a ``repr`` or a log line: scheme, host and path only. A query
    (signatures, a key a gateway put there as ``?api_key=``) and a fragment are left out, and
    so is userinfo, including a password whose ``/`` or ``#`` ends the authority early (seen as
    a port that is no number, the rest in the path). The link itself is never changed.
    """
    from urllib.parse import urlsplit

    text = url if isinstance(url, str) else str(url)
    try:
        parts = urlsplit(text)
    except ValueError:
        return "<a link that is not a URL>"
    head = parts.netloc.rpartition("@")[2] + parts.path
    try:
        broken = parts.port is None and ":" in parts.netloc.rpartition("@")[2]
    except ValueError:
        broken = True
    # "user:123/ss@host" reads as a port and a path: a ":" before an "@" in the path is taken
    # for a password (a real port with an "@" in its path is blanked too: safe, if terse).
    broken = broken or ("@" in parts.path and ":" in parts.netloc and "@" not in parts.netloc)
    if broken:  # "user:pa/ss@host", "user:pa#ss@host": the host follows the last "@"
        head = text.partition("//")[2].rpartition("@")[2]
        for mark in "?#":
            head = head.partition(mark)[0]
    prefix = f"{parts.scheme}://" if parts.scheme else ""
    return printable(prefix + head, 300)


_DEFAULT_PORTS = {"http": "80", "https": "443"}


def link_origin(url: object) -> str:
    """The host a result link points at, as ``scheme://host:port`` (the scheme's default port
    when the link names none): what a message about that host may show. Never its userinfo,
    path, query or fragment: a signed link's signature, or a key a gateway put there, is in
    them. ``?`` when the link names no host.
    """
    scheme, slashes, rest = link_for_display(url).partition("://")
    host = rest.partition("/")[0]
    if not slashes or not host:
        return "?"
    bracket = host.rfind("]")  # an IPv6 address holds colons of its own
    if ":" not in host[bracket + 1 :] and scheme.lower() in _DEFAULT_PORTS:
        host += ":" + _DEFAULT_PORTS[scheme.lower()]
    return f"{scheme}://{host}"


class _DuplicateKey(ValueError):
    pass


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateKey("duplicate object key")
        result[key] = value
    return result


def json_loads(data: str | bytes | bytearray, *, unique_keys: bool = False) -> Any:
    """Parses JSON; raises ``ValueError`` for anything that is not sound JSON: bad syntax,
    bad encoding, nesting too deep to parse, or (with ``unique_keys``) a repeated key.
    """
    try:
        return json.loads(data, object_pairs_hook=_unique if unique_keys else None)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def finite(value: Any) -> Any:
    """``value`` with every float that is not finite (a charge of 1e308 summed twice is
    ``inf``) made ``None``, through dicts, lists and tuples.
    """
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(item) for item in value]
    return value


def strict_json(value: Any) -> str:
    """Strict JSON text: what no number can be (``NaN``, ``Infinity``) is ``null``, and
    anything that slipped past that raises instead of printing what parsers refuse.

    Example::

        from imggw_client.text import strict_json

        assert strict_json({"credits": 1e308 * 10}) == '{"credits": null}'
    """
    return json.dumps(finite(value), allow_nan=False)
