"""Fixtures of the CLI tests: quick --mock tasks, and a reference gateway on a real socket."""

from __future__ import annotations

from datetime import datetime, timezone, tzinfo
from typing import Any

import pytest

from imggw_cli import _runtime, _when
from imggw_client import PollPolicy, _io_sync

from ..gateways import QUICK
from .helpers import CANARY


@pytest.fixture(autouse=True)
def quick_mock(monkeypatch: pytest.MonkeyPatch) -> None:
    """--mock tasks of a few tens of ms, and no real sleeping between retries."""
    monkeypatch.setitem(_runtime.MOCK_SETTINGS, "duration_min", 0.02)
    monkeypatch.setitem(_runtime.MOCK_SETTINGS, "duration_max", 0.08)


@pytest.fixture(autouse=True)
def quick_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    """Commands run here against gateways whose tasks take tens of ms: their first poll after
    50 ms rather than the default 1 s (a second of waiting in each of a hundred tests). A
    command given --mock keeps its own."""
    target = _runtime._target

    def quick(options: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        settings, http = target(options)
        settings.setdefault("poll", PollPolicy(initial_interval=0.05, max_interval=0.2))
        return settings, http

    monkeypatch.setattr(_runtime, "_target", quick)


@pytest.fixture
def gateway_options() -> dict[str, Any]:
    """The CLI tests' gateway (tests/gateways.py): quick tasks, for the canary key."""
    return {"api_keys": [CANARY], **QUICK}


@pytest.fixture
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Clients made from here on retry at once (each sleep they ask for is noted, not slept):
    for what a command says after its retries, not for their pacing."""
    slept: list[float] = []
    monkeypatch.setattr(_io_sync, "sleep", lambda seconds, arm=None: slept.append(seconds))
    return slept


@pytest.fixture
def cli_now(monkeypatch: pytest.MonkeyPatch) -> datetime:
    """The moment the CLI takes for now when it says how long until (or since) a link expires:
    stopped at the test's start. ``links expire in 23 h 59 min`` then depends neither on how
    long the test took nor on the clock moving on (or being stepped back) meanwhile; the rest
    of the process keeps the real clock, so the links are still alive for a download."""
    stopped = datetime.now(timezone.utc)

    class Stopped(datetime):
        @classmethod
        def now(cls, tz: tzinfo | None = None) -> datetime:  # type: ignore[override]
            local = stopped.astimezone()  # a bare now() is local and naive, as datetime's own
            return stopped.astimezone(tz) if tz is not None else local.replace(tzinfo=None)

    monkeypatch.setattr(_when, "datetime", Stopped)
    return stopped
