"""The key-memory setting (DESIGN 22): how long the gateway remembers an idempotency key, from
``idempotency_window=``, ``with_options``, ``IMGGW_IDEMPOTENCY_WINDOW``, else 24 h; read-only
on the client; a bad value refused before anything is sent, with a code."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from imggw_client import AsyncClient, Client, ConfigurationError
from imggw_client._core.config import key_forgotten

from ..conftest import BASE_URL, CANARY_KEY


@pytest.mark.parametrize("cls", [Client, AsyncClient])
def test_the_window_comes_from_the_argument_the_environment_or_a_day(
    cls: type[Client] | type[AsyncClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("IMGGW_IDEMPOTENCY_WINDOW", raising=False)
    assert cls(CANARY_KEY, BASE_URL).idempotency_window == 86400.0
    assert cls(CANARY_KEY, BASE_URL, idempotency_window=3600).idempotency_window == 3600.0
    monkeypatch.setenv("IMGGW_IDEMPOTENCY_WINDOW", " 7200 ")
    client = cls(CANARY_KEY, BASE_URL)
    assert client.idempotency_window == 7200.0
    assert cls(CANARY_KEY, BASE_URL, idempotency_window=60.5).idempotency_window == 60.5
    copy = client.with_options(idempotency_window=600)
    assert (copy.idempotency_window, client.idempotency_window) == (600.0, 7200.0)
    assert client.with_options(timeout=5).idempotency_window == 7200.0  # kept
    with pytest.raises(AttributeError):
        client.idempotency_window = 1.0  # type: ignore[misc]
    assert "idempotency_window=7200.0" in repr(client._settings)


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), True, "3600", None])
def test_a_window_that_is_not_positive_finite_seconds_is_refused(
    bad: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("IMGGW_IDEMPOTENCY_WINDOW", raising=False)
    client = Client(CANARY_KEY, BASE_URL)
    if bad is not None:
        with pytest.raises(ConfigurationError) as refused:
            Client(CANARY_KEY, BASE_URL, idempotency_window=bad)  # type: ignore[arg-type]
        assert refused.value.code == "invalid_idempotency_window"
        assert "idempotency_window must be a positive, finite number of seconds" in str(
            refused.value
        )
        with pytest.raises(ConfigurationError) as again:
            client.with_options(idempotency_window=bad)  # type: ignore[arg-type]
        assert again.value.code == "invalid_idempotency_window"
    else:  # None: the default, from the environment
        assert Client(CANARY_KEY, BASE_URL, idempotency_window=bad).idempotency_window == 86400


@pytest.mark.parametrize("named", ["0", "-5", "nan", "inf", "a day", "1e400", "\x1b[31m"])
def test_a_window_the_environment_names_badly_is_refused_naming_the_variable(
    named: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("IMGGW_IDEMPOTENCY_WINDOW", named)
    with pytest.raises(ConfigurationError) as refused:
        AsyncClient(CANARY_KEY, BASE_URL)
    assert refused.value.code == "invalid_idempotency_window"
    assert str(refused.value).startswith(
        "IMGGW_IDEMPOTENCY_WINDOW must be a positive number of seconds"
    )
    assert "\x1b" not in str(refused.value)  # shown escaped, never raw


def test_a_first_send_is_forgotten_once_older_than_the_window() -> None:
    now = datetime(2026, 12, 5, 12, tzinfo=timezone.utc)
    hour = 3600.0
    assert not key_forgotten(now - timedelta(minutes=59), hour, now.timestamp())
    assert key_forgotten(now - timedelta(hours=2), hour, now.timestamp())
    assert not key_forgotten(now + timedelta(hours=2), hour, now.timestamp())  # a clock ahead
    assert key_forgotten(None, hour, now.timestamp())  # not known: no proof it is remembered
