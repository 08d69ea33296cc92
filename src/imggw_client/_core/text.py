"""Text from a gateway, made safe for a terminal or a log line.

A task state, an error message or a result URL is chosen by whoever runs the gateway. Printed
raw, an ESC, OSC, BEL, CR or C1 code in it can retitle, clear or rewrite the user's terminal, and
a bidirectional override can make a line read differently from what it is. Everything from the
gateway that reaches a terminal or a log passes :func:`printable`.
"""

from __future__ import annotations

__all__ = ["printable"]


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
