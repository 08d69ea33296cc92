"""Turning options into a working client, and into logging."""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import TYPE_CHECKING, Any

from ._globals import Globals

if TYPE_CHECKING:
    from imggw_client import AsyncClient, Client
    from imggw_client.mock import MockGateway

# --mock: tasks of a second or so, so that a demo ends in seconds, and images worth looking at.
MOCK_SETTINGS: dict[str, Any] = {"duration_min": 0.5, "duration_max": 1.5, "image_size": 512}


def make_client(options: Globals) -> Client:
    """A client for the options: the in-process reference gateway with --mock, else the gateway
    at --base-url / IMGGW_BASE_URL with the key from IMGGW_API_KEY (the only place it is read)."""
    from imggw_client import Client

    if options.mock:
        return _mock_gateway().client(surface=options.chosen_surface, poll=_mock_poll())
    return Client(base_url=options.base_url, surface=options.chosen_surface)


def make_async_client(options: Globals) -> AsyncClient:
    """The same as make_client, asynchronous (for batches)."""
    from imggw_client import AsyncClient

    if options.mock:
        return _mock_gateway().async_client(surface=options.chosen_surface, poll=_mock_poll())
    return AsyncClient(base_url=options.base_url, surface=options.chosen_surface)


def _mock_gateway() -> MockGateway:
    from imggw_client.mock import MockGateway

    # Each --mock run is a fresh gateway: ids that differ between runs keep one run's files
    # from colliding with the last one's.
    first = time.time_ns() // 1_000_000 % 10**12
    return MockGateway(first_task_id=first, **MOCK_SETTINGS)


def _mock_poll() -> Any:
    from imggw_client import PollPolicy

    return PollPolicy(initial_interval=0.2, max_interval=0.5)


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


_LOGGERS = ("imggw_client", "httpx")


def setup_logging(options: Globals) -> None:
    """--verbose: debug logs on stderr, the key blanked. Idempotent, so that running several
    commands in one process (tests, embedding) never stacks handlers."""
    for name in _LOGGERS:
        logger = logging.getLogger(name)
        for old in [h for h in logger.handlers if getattr(h, "imggw_cli", False)]:
            logger.removeHandler(old)
    if not options.verbose:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.imggw_cli = True  # type: ignore[attr-defined]
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    key = os.environ.get("IMGGW_API_KEY", "")
    if len(key) >= 4:
        handler.addFilter(_Redact(key))
    for name in _LOGGERS:
        logger = logging.getLogger(name)
        logger.setLevel(logging.DEBUG)
        logger.addHandler(handler)
