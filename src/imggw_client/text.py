"""Text from a gateway, made fit for a terminal or a log line: the sanitizer the SDK and the
``imggw`` command use, for code of yours that prints what a gateway sent.

- :func:`printable`: every control, C1 code, bidi override or line separator shown escaped
  (never acted on by the terminal), the text cut to a length when asked;
- :func:`redact_url`: a result link with the API key blanked wherever a gateway put it;
- :func:`strict_json`: JSON text that strict parsers accept (no ``NaN``/``Infinity``: null).

Example::

    from imggw_client.text import printable, redact_url

    said = "done\x1b]0;owned\x07"                  # a message as a gateway may send it
    print(printable(said))                          # done\\x1b]0;owned\\x07, inert
    link = "https://cdn.example/a.png?key=sk-live-123"
    print(redact_url(link, ("sk-live-123",)))       # ...?key=[redacted]
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._core.text import printable, strict_json

if TYPE_CHECKING:
    from ._core.surfaces import redact_url

__all__ = ["printable", "redact_url", "strict_json"]


def __getattr__(name: str) -> Any:
    # redact_url lives with the wire code, which loads pydantic: it is loaded on first use, so
    # that printing a line (``imggw --help`` included) never pays for it.
    if name != "redact_url":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from ._core.surfaces import redact_url

    globals()[name] = redact_url
    return redact_url
