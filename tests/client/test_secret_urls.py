"""No secret leaves through a URL (DESIGN 18): a base URL with userinfo is refused without
printing its password; a store URL is printed with everything between ``//`` and the host
blanked, whatever its form; a malformed store URL is one line and exit 2, never a traceback."""

from __future__ import annotations

import logging
import socket
import subprocess
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from imggw_cli._app import app
from imggw_client import AsyncClient, Client, ConfigurationError, RateLimit
from imggw_client._core.text import redact_store_url
from imggw_client.mock import MockGateway

from ..cli.helpers import IMGGW, process_env
from ..conftest import beta_submitted

KEY = "sk-secret-urls-canary-41d2"
# base64 passwords hold "/", "+" and "="; others hold "#", "?" or "@".
PASSWORDS = ["Zm9v/YmFy+cXV4==", "pa#ss", "pa?ss", "pa@ss", "plainpassword42"]


def store_forms(password: str, host: str = "cache.internal:6379") -> list[str]:
    return [
        f"redis://:{password}@{host}/0",
        f"redis://app:{password}@{host}/0",
        f"redis://{password}@{host}/0",  # the password in the user position
        f"rediss://{password}@{host}",
        f"redis://{host}/0?password={password}",
    ]


CASES = [(pw, url) for pw in PASSWORDS for url in store_forms(pw)]


def leaked(password: str, *texts: str) -> bool:
    # A password with a separator can leak as its pieces: check each side of it too.
    pieces = {
        password,
        *(
            p
            for p in password.replace("#", "/").replace("?", "/").replace("@", "/").split("/")
            if len(p) >= 3
        ),
    }
    return any(piece in text for piece in pieces for text in texts)


@pytest.mark.parametrize(("password", "url"), CASES)
def test_a_store_url_prints_nothing_between_the_slashes_and_the_host(
    password: str, url: str
) -> None:
    shown = redact_store_url(url)
    assert not leaked(password, shown), shown
    assert shown.startswith(url.split("//")[0] + "//")
    in_authority = "?password=" not in url
    if in_authority and any(mark in password for mark in "/?#"):
        # It ends the authority early: refused (with the way to write it where that can be
        # told), never with the password.
        with pytest.raises(ConfigurationError, match=r"percent-encoded|host is missing") as caught:
            RateLimit(queries_per_second=10, store=url)
        assert not leaked(password, str(caught.value), repr(caught.value)), str(caught.value)
        return
    limit = RateLimit(queries_per_second=10, store=url)
    assert not leaked(password, repr(limit), str(limit))
    if "@" not in url.partition("?")[2]:  # else an "@" in the query hides the host too
        assert "cache.internal" in repr(limit)


@pytest.mark.parametrize("password", PASSWORDS)
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_the_not_usable_warning_names_the_store_without_its_password(
    password: str, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    with socket.socket() as probe:  # a port nothing listens on: the store is unreachable
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    from urllib.parse import quote

    # The user position, percent-encoded as redis-py wants it: a valid URL that fails.
    url = f"redis://{quote(password, safe='')}@127.0.0.1:{port}/0"
    limit = RateLimit(submits_per_second=50, store=url)
    transport_sync = httpx.MockTransport(lambda r: beta_submitted())

    async def handler(request: httpx.Request) -> httpx.Response:
        return beta_submitted()

    caplog.set_level(logging.DEBUG)
    if kind == "sync":
        with Client(
            api_key=KEY,
            base_url="http://gw.test",
            transport=transport_sync,
            rate_limit=limit,
            timeout=1.0,
        ) as client:
            client.submit("a fox")
    else:
        import anyio

        async def go() -> None:
            async with AsyncClient(
                api_key=KEY,
                base_url="http://gw.test",
                rate_limit=limit,
                transport=httpx.MockTransport(handler),
                timeout=1.0,
            ) as c:
                await c.submit("a fox")

        anyio.run(go)
    warnings = [r.getMessage() for r in caplog.records if "not usable" in r.getMessage()]
    assert len(warnings) == 1
    assert f"redis://***@127.0.0.1:{port}/0" in warnings[0]
    for record in caplog.records:
        assert not leaked(quote(password, safe=""), record.getMessage(), str(record.args))
    assert not leaked(quote(password, safe=""), caplog.text)


@pytest.mark.parametrize("password", PASSWORDS)
@pytest.mark.parametrize(
    "base", ["https://user:{pw}@gw.example", "http://{pw}@gw.example/v1", "https://:{pw}@gw"]
)
@pytest.mark.parametrize("make", [Client, AsyncClient])
def test_a_base_url_with_userinfo_is_refused_without_its_password(
    password: str, base: str, make: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[httpx.Request] = []
    url = base.format(pw=password)
    for how in ("argument", "environment"):
        if how == "environment":
            monkeypatch.setenv("IMGGW_BASE_URL", url)
        with pytest.raises(ConfigurationError) as caught:
            make(
                api_key=KEY,
                base_url=url if how == "argument" else None,
                transport=httpx.MockTransport(lambda r: sent.append(r) or httpx.Response(500)),
            )  # type: ignore[func-returns-value]
        assert caught.value.code == "userinfo_in_base_url"
        assert "user:password@" in str(caught.value)
        text = str(caught.value) + repr(caught.value)
        assert not leaked(password, text), text
    assert sent == []


def test_an_at_sign_anywhere_in_a_base_url_is_refused() -> None:
    """A password holding "/" ends the authority early: the rest looks like a path."""
    for url in ("https://gw.example/team@x/v1", "https://gw.example/v1?a=b@c"):
        with pytest.raises(ConfigurationError, match="user:password@"):
            Client(api_key=KEY, base_url=url)


# ---------------------------------------------------------------------------- the CLI


@pytest.mark.parametrize("password", PASSWORDS)
@pytest.mark.gateway(api_keys=[KEY])
def test_cli_a_base_url_with_userinfo_exits_4_without_the_password(
    password: str, served_gateway: tuple[MockGateway, str]
) -> None:
    gw, base = served_gateway
    hostport = base.split("//")[1]
    url = f"http://user:{password}@{hostport}"
    for args in (
        ["-v", "submit", "a fox", "--base-url", url],
        ["status", "7", "--base-url", url, "--json"],
    ):
        result = CliRunner().invoke(app, args, env={"IMGGW_API_KEY": KEY})
        assert result.exit_code == 4, result.output
        assert "user:password@" in result.stderr
        assert not leaked(password, result.stdout, result.stderr)
        if "-v" not in args:  # -v prints the traceback on purpose, without the password
            assert "Traceback" not in result.stderr
    assert gw.stats()["requests"] == {}


@pytest.mark.parametrize(
    "url",
    [
        "redis://cache:6379/0?db=x",
        "redis://:pw@cache/0?socket_timeout=soon",
        "redis://:Zm9v/YmFy@cache:6379/0",
        "redis://:pa#ss@cache/0",
    ],
)
@pytest.mark.gateway(api_keys=[KEY])
def test_cli_a_malformed_store_url_is_one_line_and_exit_2(
    url: str, served_gateway: tuple[MockGateway, str]
) -> None:
    gw, base = served_gateway
    for env in ({}, {"IMGGW_RATE_STORE": url}):
        args = ["submit", "a fox", "--base-url", base]
        if not env:
            args += ["--rate-store", url]
        result = CliRunner().invoke(app, args, env={"IMGGW_API_KEY": KEY, **env})
        assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
        (line,) = result.stderr.splitlines()
        assert line.startswith("error: --rate-store must be a redis://")
        for secret in ("pw@", "Zm9v", "YmFy", "pa#ss", "#ss"):
            assert secret not in result.stderr
    assert gw.stats()["requests"] == {}


@pytest.mark.slow
def test_cli_a_query_redis_cannot_read_exits_2_in_a_process_of_its_own() -> None:
    """As the user met it: a real process, no traceback, exit 2 (was 1 with a ValueError)."""
    done = subprocess.run(
        [
            *IMGGW,
            "--rate-store",
            "redis://:s3cr3t-pw@127.0.0.1:9/0?db=x",
            "submit",
            "a fox",
            "--base-url",
            "http://127.0.0.1:9",
        ],
        env=process_env(KEY),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert len(done.stderr.splitlines()) == 1
    assert "s3cr3t-pw" not in done.stdout + done.stderr
    assert "?***" in done.stderr
