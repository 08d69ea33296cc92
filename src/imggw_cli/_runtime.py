"""Turning options into a working client, and into logging."""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any

import imggw_client

from ._globals import Globals
from ._output import safe

if TYPE_CHECKING:
    from imggw_client import AsyncClient, Client

# Every request the CLI makes names it; the SDK appends its own name after ours.
USER_AGENT = f"imggw-cli/{imggw_client.__version__}"

# --mock: tasks of a second or so, so that a demo ends in seconds, and images worth looking at.
MOCK_SETTINGS: dict[str, Any] = {"duration_min": 0.5, "duration_max": 1.5, "image_size": 512}


@contextmanager
def make_client(options: Globals) -> Iterator[Client]:
    """A client for the options, closed with its HTTP connections when the command ends: the
    in-process reference gateway with --mock, else the gateway at --base-url / IMGGW_BASE_URL
    with the key from IMGGW_API_KEY (the only place it is read)."""
    from imggw_client import Client

    settings, http_options = _target(options)
    # Made as the client makes its own (a whole request, headers included, ends within its
    # timeout however slowly a gateway answers), with our User-Agent on it.
    with (
        Client.make_http_client(**http_options) as http,
        Client(http_client=http, **settings) as client,
    ):
        yield client


@asynccontextmanager
async def make_async_client(options: Globals) -> AsyncIterator[AsyncClient]:
    """The same as make_client, asynchronous (for batches)."""
    from imggw_client import AsyncClient

    settings, http_options = _target(options)
    async with (
        AsyncClient.make_http_client(**http_options) as http,
        AsyncClient(http_client=http, **settings) as client,
    ):
        yield client


def _target(options: Globals) -> tuple[dict[str, Any], dict[str, Any]]:
    """The client's settings and its httpx client's, for the options."""
    settings: dict[str, Any] = {
        "surface": options.chosen_surface,
        "rate_limit": options.rate_limit,
        "base_url": options.base_url,
    }
    http: dict[str, Any] = {"headers": {"User-Agent": USER_AGENT}}
    if options.mock:
        from imggw_client import PollPolicy
        from imggw_client.mock import IN_PROCESS_URL, MockGateway

        # Each --mock run is a fresh gateway: ids that differ between runs keep one run's
        # files from colliding with the last one's.
        first = time.time_ns() // 1_000_000 % 10**12
        gateway = MockGateway(first_task_id=first, **MOCK_SETTINGS)
        settings.update(api_key=gateway.config.api_keys[0], base_url=IN_PROCESS_URL,
                        poll=PollPolicy(initial_interval=0.2, max_interval=0.5))  # fmt: skip
        http["transport"] = gateway.transport()
    return settings, http


class _Redact(logging.Filter):
    """Blanks the API key in any log line, whatever logged it."""

    def __init__(self, secret: str) -> None:
        super().__init__()
        self.secret = secret

    def filter(self, record: logging.LogRecord) -> bool:
        if self.secret and self.secret in record.getMessage():
            record.msg = record.getMessage().replace(self.secret, "[redacted]")
            record.args = ()
        return True


class _Printable(logging.Formatter):
    """Log lines quote what a gateway sent (an unknown task state, an error reason): each line
    passes the terminal sanitizer, so none can carry an escape sequence to the terminal."""

    def format(self, record: logging.LogRecord) -> str:
        return safe(super().format(record))


class _Stderr(logging.Handler):
    """Writes to whatever sys.stderr is when a line is logged, so that a handler left from an
    earlier command in the same process (tests, embedding) never writes to a closed stream."""

    imggw_cli = True

    def emit(self, record: logging.LogRecord) -> None:
        try:
            print(self.format(record), file=sys.stderr, flush=True)
        except Exception:
            self.handleError(record)


_LOGGERS = ("imggw_client", "httpx")


def setup_logging(options: Globals) -> None:
    """Warnings from the SDK on stderr, sanitized; with --verbose, debug logs too, the key
    blanked. Idempotent, so that running several commands in one process (tests, embedding)
    never stacks handlers."""
    handler = _Stderr(logging.DEBUG if options.verbose else logging.WARNING)
    if options.verbose:
        handler.setFormatter(_Printable("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    else:
        handler.setFormatter(_Printable("warning: %(message)s"))
    key = os.environ.get("IMGGW_API_KEY", "")
    if len(key) >= 4:
        handler.addFilter(_Redact(key))
    for name in _LOGGERS:
        logger = logging.getLogger(name)
        for old in [h for h in logger.handlers if getattr(h, "imggw_cli", False)]:
            logger.removeHandler(old)
        # Without --verbose the level is left to the root logger (WARNING unless the host
        # program says otherwise).
        logger.setLevel(logging.DEBUG if options.verbose else logging.NOTSET)
        logger.addHandler(handler)
