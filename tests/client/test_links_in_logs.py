"""A signed result link's query (its ``Signature``, its ``Expires``) reaches no log line
(DESIGN 22, "Names and links"): not httpx's request line, not ours, in the SDK's records, with
``-v`` and with ``IMGGW_LOG=debug``, as text and as JSON."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from imggw_cli import _runtime
from imggw_client import PollPolicy
from imggw_client._logs import HideLinks, hidden, hiding
from imggw_client.mock import MockGateway

from ..cli.helpers import imggw

FAST = PollPolicy(initial_interval=0.01, max_interval=0.05)


pytestmark = pytest.mark.gateway(duration_min=0.01, duration_max=0.02, retry_after=0, latency=0.0)


def secrets_of(url: str) -> list[str]:
    query = parse_qs(urlsplit(url).query)
    return [query["Signature"][0], query["Expires"][0]]


def test_a_downloaded_links_query_is_in_no_record(
    make_gateway: Callable[..., MockGateway], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    gw = make_gateway()
    caplog.set_level(logging.DEBUG)
    with gw.client(poll=FAST) as client:
        task = client.generate("a cat")
        signature, expires = secrets_of(task.image_urls[0])
        client.download(task, tmp_path)
    lines = [record.getMessage() for record in caplog.records]
    path = urlsplit(task.image_urls[0]).path
    # httpx's own logger (httpx2's, when httpx2 is aliased as httpx)
    assert any(
        record.name == httpx.__name__ and path in record.getMessage() for record in caplog.records
    )
    for text in lines:
        assert signature not in text
        assert f"Expires={expires}" not in text
        assert "Signature=" not in text


@pytest.mark.anyio
async def test_the_async_client_hides_it_too(
    make_gateway: Callable[..., MockGateway], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    gw = make_gateway()
    caplog.set_level(logging.DEBUG)
    async with gw.async_client(poll=FAST) as client:
        task = await client.generate("a cat")
        signature, _ = secrets_of(task.image_urls[0])
        await client.download(task, tmp_path)
    assert any("/results/" in r.getMessage() for r in caplog.records if r.name == httpx.__name__)
    assert not any(signature in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    ("flags", "env"),
    [
        (["-v"], {}),
        (["--log-format", "json"], {"IMGGW_LOG": "debug"}),
        (["-v", "--log-format", "json"], {}),
        ([], {"IMGGW_LOG": "debug"}),
    ],
    ids=["verbose-text", "imggw-log-json", "verbose-json", "imggw-log-text"],
)
def test_the_cli_logs_no_query_of_a_result_link(
    tmp_path: Path, flags: list[str], env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(_runtime.MOCK_SETTINGS, "duration_min", 0.01)
    monkeypatch.setitem(_runtime.MOCK_SETTINGS, "duration_max", 0.02)
    run = imggw(
        "--mock",
        *flags,
        "generate",
        "a cat",
        "-o",
        str(tmp_path),
        env={"IMGGW_JOURNAL": "off", **env},
    )
    assert run.code == 0, run.err
    assert "HTTP Request: GET" in run.err
    assert "/results/" in run.err
    assert "Signature" not in run.err
    assert "Expires=" not in run.err


def test_only_lines_holding_a_link_being_fetched_change() -> None:
    link = "https://u:pw@cdn.example/r/1.png?Expires=17&Signature=abc123def"
    record = logging.LogRecord("httpx", logging.INFO, __file__, 1, "GET %s", (link,), None)
    other = logging.LogRecord("httpx", logging.INFO, __file__, 1, "GET %s", ("/v1?x=1",), None)
    HideLinks().filter(record)
    assert record.getMessage() == f"GET {link}"  # no fetch under way: nothing to hide
    with hiding(httpx.URL(link)):
        HideLinks().filter(record)
        HideLinks().filter(other)
        # The path with its query alone (hpack's ``:path``), and the next hop of a redirect.
        assert hidden("(b':path', b'/r/1.png?Expires=17&Signature=abc123def')") == (
            "(b':path', b'/r/1.png')"
        )
        assert hidden("(b'location', b'https://s3.example/k?X-Amz-Signature=9')") == (
            "(b'location', b'https://s3.example/k')"
        )
    assert record.getMessage() == "GET https://cdn.example/r/1.png"
    assert other.getMessage() == "GET /v1?x=1"
    after = logging.LogRecord("httpx", logging.INFO, __file__, 1, "GET %s", (link,), None)
    HideLinks().filter(after)
    assert after.getMessage() == f"GET {link}"  # the fetch ended: nothing watched
