"""The ``imggw_client`` logger: silent in an application that sets up no logging (a
``NullHandler``, so Python's last-resort handler never prints the SDK's warnings), and on
stderr when ``IMGGW_LOG`` asks for it, as ``OPENAI_LOG`` does for openai-python.

``IMGGW_LOG=debug`` shows every request the SDK sends (method, path, status, time), every
retry and every note; ``IMGGW_LOG=info`` the retries and notes. Read once, when the package is
imported. The handler writes to whatever ``sys.stderr`` is at the time; records still reach the
application's own handlers (propagation is left alone). No line it writes holds an API key:
the key of every client made while it is on, and ``IMGGW_API_KEY``, are blanked in the text,
tracebacks included.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping

LOGGER = "imggw_client"
ENV_LOG = "IMGGW_LOG"
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO}
FORMAT = "[%(asctime)s %(levelname)s %(name)s] %(message)s"
REDACTED = "[redacted]"
ENV_API_KEY = "IMGGW_API_KEY"


class StderrHandler(logging.Handler):
    """``IMGGW_LOG``'s handler: each record on the current ``sys.stderr``, every known key
    blanked."""

    def __init__(self, level: int) -> None:
        super().__init__(level)
        self.keys: set[str] = set()
        self.setFormatter(logging.Formatter(FORMAT))

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        for key in self.keys:
            text = text.replace(key, REDACTED)
        return text

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
    asked = environ.get(ENV_LOG, "").strip().lower()
    level = LEVELS.get(asked)
    if level is None:
        if asked:
            logger.warning("%s=%r is not one of debug, info: ignored", ENV_LOG, asked[:20])
        return None
    if _handler is None:
        _handler = StderrHandler(level)
        logger.addHandler(_handler)
    _handler.setLevel(level)
    watch_key(environ.get(ENV_API_KEY, ""))
    logger.setLevel(level)
    return _handler


def watch_key(key: str) -> None:
    """Blanks ``key`` in every line ``IMGGW_LOG`` writes (kept only while it is on)."""
    if _handler is not None and len(key) >= 4:
        _handler.keys.add(key)
