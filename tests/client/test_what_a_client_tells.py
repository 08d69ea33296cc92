"""What a client tells the code around it (the batch runner, the tracker, an application) of
what only it holds: the gateway's silence, the durations its waits learned, and its key
blanked in a link; read through public accessors, never through its private attributes."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from imggw_client import Client, ConfigurationError, ServerError
from imggw_client.text import redact_url

from ..conftest import BASE_URL, beta_task

KEY = "sk-live-tells-0123456789"


def answering(*statuses: int) -> httpx.MockTransport:
    """A gateway answering each query with the next of ``statuses`` (200: a finished task)."""
    replies: Iterator[int] = iter(statuses)

    def answer(request: httpx.Request) -> httpx.Response:
        status = next(replies)
        return beta_task(status="completed") if status == 200 else httpx.Response(status)

    return httpx.MockTransport(answer)


def test_the_gateways_silence_counts_from_an_unanswered_request_until_an_answer() -> None:
    with Client(
        api_key=KEY, base_url=BASE_URL, max_retries=0, transport=answering(503, 200)
    ) as client:
        assert client.gateway_silent_for == 0.0  # nothing asked yet
        with pytest.raises(ServerError):
            client.get("42")
        assert client.gateway_silent_for > 0.0  # a 5xx is no answer
        assert client.with_options(timeout=5).gateway_silent_for > 0.0  # the same gateway
        for other in (
            client.with_options(base_url="http://127.0.0.1:9"),
            client.with_options(api_key="sk-another-key-5b1c"),
        ):
            assert other.gateway_silent_for == 0.0  # another gateway's silence, not this one's
        client.get("42")
        assert client.gateway_silent_for == 0.0


def test_durations_learned_elsewhere_are_what_the_client_tells_it_typically_takes() -> None:
    with Client(api_key=KEY, base_url=BASE_URL, transport=answering()) as client:
        assert client.typical_durations() == {}
        assert client.learn_durations("beta", "1K", [8.0] * 10) == 10  # either case
        assert client.learn_durations("beta", "4k", [float("nan"), -1.0, 30.0]) == 1  # garbage
        learned = client.typical_durations("beta")
        assert set(learned) == {"1k", "4k"}
        assert 0.0 < learned["1k"] <= 8.0 < learned["4k"] <= 30.0
        assert client.typical_durations() == learned  # the client's own surface
        assert client.typical_durations("alpha") == {}
        assert client.with_options(timeout=5).typical_durations() == learned
        assert client.with_options(base_url="http://127.0.0.1:9").typical_durations() == {}
        with pytest.raises(ConfigurationError):
            client.learn_durations("beta", "3k", [8.0])  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError):
            client.typical_durations("gamma")  # type: ignore[arg-type]


def test_a_link_is_kept_with_the_clients_key_blanked_as_redact_url_does() -> None:
    link = f"https://cdn.example/r/1.png?sig={KEY}"
    with Client(api_key=KEY, base_url=BASE_URL, transport=answering()) as client:
        assert client.redact_url(link) == "https://cdn.example/r/1.png?sig=[redacted]"
        assert client.redact_url(link) == redact_url(link, (KEY,))
    with Client(api_key="1.p", base_url=BASE_URL, transport=answering()) as short:
        # A short key found in a link by chance is left: the link would break, not leak.
        assert short.redact_url(link) == link
        assert short.redact_url("https://cdn.example/r/1.p/x.png") == (
            "https://cdn.example/r/[redacted]/x.png"
        )
