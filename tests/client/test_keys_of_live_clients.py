"""The keys blanked in every log record and task repr are those of the process's live clients:
a web application that makes a client per tenant or per request keeps blanking its live
tenants' keys, and lets go of the others' once their clients are closed or collected (10,000
tenants' keys, every one looked for in every record, made each record cost a millisecond)."""

from __future__ import annotations

import gc
import logging
import socket

import httpx
import pytest

from imggw_client import Client, ImggwError
from imggw_client._core.text import KNOWN_KEYS, REDACTED

from ..loopback import raw_server

LIVE = "sk-tenant-live-5d1e0c9a7b"
NOWHERE = httpx.MockTransport(lambda request: httpx.Response(503))  # nothing is sent here


def echo(conn: socket.socket, n: int, head: bytes) -> None:
    """A gateway that (wrongly) echoes the caller's key in a header, where httpcore's debug
    record of the response headers shows it."""
    auth = next(
        (line for line in head.split(b"\r\n") if line.lower().startswith(b"authorization:")), b""
    )
    key = auth.rpartition(b" ")[2]
    body = b'{"error": {"code": "unauthorized", "message": "no"}}'
    conn.sendall(
        b"HTTP/1.1 401 Unauthorized\r\nX-Echo: " + key + b"\r\nContent-Type: application/json"
        b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body
    )


def test_closed_and_dropped_clients_keys_are_let_go() -> None:
    tenants = [f"sk-tenant-{i:05d}-0f3a9c" for i in range(1000)]
    with Client(LIVE, "http://127.0.0.1:9", transport=NOWHERE) as live:
        for i, key in enumerate(tenants):
            client = Client(key, "http://127.0.0.1:9", transport=NOWHERE)
            copy = client.with_options(timeout=5)
            if i % 2:
                copy.close()
                client.close()
            del client, copy  # the others only dropped
        gc.collect()
        assert not [key for key in tenants if key in KNOWN_KEYS]
        assert LIVE in KNOWN_KEYS
        assert live.with_options(api_key=tenants[0]) is not None
    gc.collect()
    assert LIVE not in KNOWN_KEYS


def test_a_live_clients_key_stays_blanked_whichever_of_its_copies_closes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)  # httpcore's records of the response headers included
    with raw_server(echo) as url:
        client = Client(LIVE, url, max_retries=0)
        copy = client.with_options(timeout=5)
        copy.close()  # a copy closed: the client still uses the key
        with pytest.raises(ImggwError):
            client.get("42")
        other = client.with_options(timeout=5)
        client.close()  # the client closed: its copy (not closed by it) still uses it
        assert LIVE in KNOWN_KEYS
        other.close()
    assert any("X-Echo" in r.getMessage() for r in caplog.records)  # the header was logged
    assert not any(LIVE in r.getMessage() for r in caplog.records)
    assert LIVE not in KNOWN_KEYS


def test_many_keys_are_found_by_reading_the_text_once() -> None:
    from imggw_client._core.text import KnownKeys

    keys = KnownKeys(8)
    held = [f"key-{i:06d}-abcdef" for i in range(5000)]
    for key in held:
        keys.hold(key)
    keys.hold("key-000042-abcdef-and-more")  # a key that holds another
    text = "a key-000042-abcdef-and-more and key-004999-abcdef, key-00500"
    assert keys.blank(text) == f"a {REDACTED} and {REDACTED}, key-00500"
    keys.hold(held[1])  # held twice: released twice
    for key in held:
        keys.release(key)
    assert keys.blank(text) == f"a {REDACTED} and key-004999-abcdef, key-00500"
    keys.release(held[1])
    keys.release("key-000042-abcdef-and-more")
    assert len(keys) == 0
    assert keys.blank(text) == text
