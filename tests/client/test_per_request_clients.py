"""A web application serving many tenants makes a client per tenant, or per request: what a
client works out from its key alone is worked out once per key in the process, not once per
client (the key's slow fingerprint took about 40 ms, on the event loop, for every journaled
AsyncClient's first submit and every client with a shared store), and what is the same for
every client (the TLS context, about 20 ms to build) once per process."""

from __future__ import annotations

import hashlib
import ssl
from pathlib import Path
from typing import Any

import anyio
import certifi
import pytest

from imggw_client import AsyncClient, Client

from ..gateways import QUICK

TENANTS = ("sk-tenant-a-7c4e91d02b", "sk-tenant-b-3a8f60e5c1")
pytestmark = pytest.mark.gateway(api_keys=list(TENANTS), **QUICK)


@pytest.fixture
def slow_hashes(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The keys the slow hash was run on, from now on."""
    seen: list[bytes] = []
    real = hashlib.pbkdf2_hmac

    def counted(name: str, password: bytes, *args: Any, **kwargs: Any) -> bytes:
        seen.append(password)
        return real(name, password, *args, **kwargs)

    monkeypatch.setattr(hashlib, "pbkdf2_hmac", counted)
    return seen


def test_a_journaled_client_per_request_fingerprints_each_key_once(
    shared_gateway_url: str, tmp_path: Path, slow_hashes: list[bytes]
) -> None:
    journal = tmp_path / "j.sqlite"

    async def request(key: str) -> None:
        async with AsyncClient(key, shared_gateway_url, journal=journal) as client:
            await client.submit("a fox")

    for _ in range(3):
        for key in TENANTS:
            anyio.run(request, key)
    for key in TENANTS:
        with Client(key, shared_gateway_url, journal=journal) as client:
            assert client.journal is not None
            assert len(client.journal.tasks(scope=client.journal_scope)) == 3
    assert sorted(slow_hashes) == sorted(key.encode() for key in TENANTS)


@pytest.fixture
def tls_contexts(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The TLS contexts made with a certificate bundle (what httpx's default reads), from now."""
    made: list[object] = []
    real = ssl.create_default_context

    def counted(*args: Any, **kwargs: Any) -> ssl.SSLContext:
        context = real(*args, **kwargs)
        made.append(context)
        return context

    monkeypatch.setattr(ssl, "create_default_context", counted)
    return made


def test_clients_made_per_request_share_one_tls_context(
    shared_gateway_url: str, tls_contexts: list[object], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", certifi.where())  # a bundle named: one context for it

    async def request(key: str) -> None:
        async with AsyncClient(key, shared_gateway_url) as client:
            await client.submit("a fox")

    for key in TENANTS * 3:
        anyio.run(request, key)
        with Client(key, shared_gateway_url) as client:
            client.submit("a fox")
    assert len(tls_contexts) == 1
